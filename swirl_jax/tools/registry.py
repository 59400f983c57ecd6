"""Tools by name, built from a config block, as batch callables.

  config.tools.names = ('calculator',) | ('search',) | ('python',)
  config.tools.search_corpus = 'hotpotqa:dev' | 'synthetic_multihop:train'
                               | a corpus file (JSON or JSONL)

A named corpus ('<dataset>:<split>') is a file under the data directory
(`CORPUS_FILES`) or one that code generates: generators register with
`register_corpus` (tasks/datasets.py registers the synthetic world's), so
this package never imports `tasks`.
"""

import contextlib
import pathlib
from typing import Callable

from swirl_jax import config_lib, paths
from swirl_jax.tools import calculator, sandbox, search

# A tool takes a batch of arguments and returns one observation text each.
BatchTool = Callable[[list[str]], list[str]]
TOOLS = ("calculator", "search", "python")
_FORBIDDEN: list[str] = []  # Reasons tools may not be built right now.


@contextlib.contextmanager
def forbidden(reason: str):
  """No tool can be built inside this block (e.g. SWiRL stage 2)."""
  _FORBIDDEN.append(reason)
  try:
    yield
  finally:
    _FORBIDDEN.pop()


# '<dataset>:<split>' -> (file under the data directory, data job dataset
# that fetches it, or '' when the job does not).
CORPUS_FILES = {
    # The unique paragraphs of the dev questions' own contexts.
    "hotpotqa:dev": ("hotpotqa/dev_distractor_500.jsonl", "hotpotqa"),
    "hotpotqa:train": ("hotpotqa/hotpotqa_train_corpus.json", "hotpotqa"),
    # The Wikipedia abstracts HotPotQA was built on (5.2M; the paper
    # configs' corpus), indexed by the data job.
    "hotpotqa:wiki": ("hotpotqa/wiki_abstracts.jsonl", "hotpotqa_wiki"),
    "musique:train": ("musique/musique_train_corpus.json", ""),
}
_GENERATED: dict[str, Callable[[], list]] = {}


def register_corpus(name: str, make: Callable[[], list]) -> None:
  """Makes `name` ('<dataset>:<split>') a corpus built by `make()`."""
  _GENERATED[name] = make


def corpus(name: str, data_dir: str | None = None) -> list[search.Passage]:
  """The named corpus ('<dataset>:<split>', or '<dataset>' for its only
  split) as passages; its file is read from `data_dir` (default: the
  data directory)."""
  if name not in CORPUS_FILES and name not in _GENERATED:
    only = [k for k in list(CORPUS_FILES) + list(_GENERATED)
            if k.split(":")[0] == name]
    if len(only) != 1:
      raise ValueError(f"unknown search corpus {name!r}; known: "
                       f"{sorted(set(CORPUS_FILES) | set(_GENERATED))} or a "
                       "corpus file")
    name = only[0]
  if name in _GENERATED:
    return search.as_passages(_GENERATED[name]())
  rel, fetch = CORPUS_FILES[name]
  return search.load_corpus(paths.data_file(data_dir, rel,
                                            f"search corpus {name!r}", fetch))


def _corpus(spec: str, data_dir: str | None):
  if ":" in spec and not spec.startswith("/"):
    return corpus(spec, data_dir)
  return search.load_corpus(spec)


def index_dir(spec: str, data_dir: str | None = None) -> str | None:
  """The index the data job built beside a corpus's file, if any (a named
  corpus or a file path)."""
  rel = CORPUS_FILES.get(spec, (None,))[0]
  path = pathlib.Path(data_dir or paths.default_data_dir() or ".") / rel \
      if rel else pathlib.Path(spec)
  d = search.index_dir(path)
  return str(d) if d.is_dir() else None


def build_tools(names, *, search_corpus: str = "", search_k: int = 3,
                data_dir: str | None = None, cache_dir: str | None = None,
                sandbox_timeout_s: float = 3.0,
                sandbox_memory_mb: int = 512,
                sandbox_cpus: tuple[int, ...] = ()) -> dict[str, BatchTool]:
  """Batch callables for the named tools (each owns its workers)."""
  if _FORBIDDEN:
    raise RuntimeError(f"tools requested where none may run: {_FORBIDDEN[-1]}")
  out = {}
  for name in names:
    if name == "calculator":
      out[name] = calculator.Calculator().batch
    elif name == "search":
      if not search_corpus:
        raise ValueError("the search tool needs tools.search_corpus")
      tool = search.SearchTool(
          _corpus(search_corpus, data_dir), k=search_k,
          cache_dir=index_dir(search_corpus, data_dir) or cache_dir)
      out[name] = tool.batch
    elif name == "python":
      box = sandbox.Sandbox(timeout_s=sandbox_timeout_s,
                            memory_bytes=sandbox_memory_mb << 20,
                            cpus=tuple(sandbox_cpus))
      out[name] = lambda codes, box=box: [
          sandbox.format_observation(r) for r in box.run_batch(codes)]
    else:
      raise config_lib.ConfigError(f"unknown tool {name!r}; valid: "
                                   f"{', '.join(TOOLS)}")
  return out


def from_config(c, data_dir: str | None = None, cache_dir=None):
  config_lib.check_keys(c, ("names", "search_corpus", "search_k",
                            "sandbox_timeout_s", "sandbox_memory_mb",
                            "sandbox_cpus"), "tools")
  return build_tools(tuple(c.names), search_corpus=c.get("search_corpus", ""),
                     search_k=c.get("search_k", 3), data_dir=data_dir,
                     cache_dir=cache_dir,
                     sandbox_timeout_s=c.get("sandbox_timeout_s", 3.0),
                     sandbox_memory_mb=c.get("sandbox_memory_mb", 512),
                     sandbox_cpus=tuple(c.get("sandbox_cpus", ())))
