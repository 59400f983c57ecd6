"""Tools by name, built from a config block, as batch callables.

  config.tools.names = ('calculator',) | ('search',) | ('python',)
  config.tools.search_corpus = 'hotpotqa:dev' | 'synthetic_multihop:train'
                               | a corpus file (JSON or JSONL)
"""

import contextlib
from typing import Callable

from swirl_jax.tools import calculator, sandbox, search

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


def _corpus(spec: str, data_dir: str | None):
  from swirl_jax.tasks import datasets  # pylint: disable=g-import-not-at-top
  if ":" in spec and not spec.startswith("/"):
    name, split = spec.split(":", 1)
    return datasets.task_corpus(name, split, data_dir)
  return search.load_corpus(spec)


def build_tools(names, *, search_corpus: str = "", search_k: int = 3,
                data_dir: str | None = None, cache_dir: str | None = None,
                sandbox_timeout_s: float = 3.0,
                sandbox_memory_mb: int = 512) -> dict[str, BatchTool]:
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
      tool = search.SearchTool(_corpus(search_corpus, data_dir), k=search_k,
                               cache_dir=cache_dir)
      out[name] = tool.batch
    elif name == "python":
      box = sandbox.Sandbox(timeout_s=sandbox_timeout_s,
                            memory_bytes=sandbox_memory_mb << 20)
      out[name] = lambda codes, box=box: [
          sandbox.format_observation(r) for r in box.run_batch(codes)]
    else:
      raise ValueError(f"unknown tool {name!r}; valid: {', '.join(TOOLS)}")
  return out


def from_config(c, data_dir: str | None = None, cache_dir=None):
  return build_tools(tuple(c.names), search_corpus=c.get("search_corpus", ""),
                     search_k=c.get("search_k", 3), data_dir=data_dir,
                     cache_dir=cache_dir,
                     sandbox_timeout_s=c.get("sandbox_timeout_s", 3.0),
                     sandbox_memory_mb=c.get("sandbox_memory_mb", 512))
