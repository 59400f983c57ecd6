"""Loaders for the question sets, read straight from their files.

Every loader takes a split and a data directory (default:
`swirl_jax.paths.default_data_dir()`; layout in the data README) and
returns `Task`s. `load_tasks(name, split, data_dir, limit)` is the one
entry point; `DATASETS` lists the names and splits. A `tfds:` name (e.g.
'tfds:gsm8k') reads TensorFlow Datasets instead, if it is installed.

HotPotQA, MuSiQue and the parquet files may hold Python-literal strings
where JSON would hold lists and dicts; they are parsed with
`ast.literal_eval`.

A missing file fails in one line that names the data job command fetching
it (`paths.data_file`; `configs/data.py` downloads the files); a malformed
one fails with `path:line: reason` (`swirl_jax.jsonl`). `CORPORA` holds
the synthetic world's search corpora ('synthetic_multihop:<split>'), for
the tool registry (`registry.from_config(..., corpora=CORPORA)`).
"""

import ast
import dataclasses
import functools
import pathlib
import types
from typing import Callable

import pyarrow
import pyarrow.parquet as pq

from swirl_jax import config_lib
from swirl_jax import jsonl
from swirl_jax import paths
from swirl_jax.tasks import records
from swirl_jax.tasks import synthetic

Task = records.Task

# The data job's dataset that fetches each loader's files.
_FETCH = {"gsm8k": "gsm8k", "hotpotqa": "hotpotqa", "musique": "",
          "math": "math", "aime": "math", "amc23": "math"}

CORPORA = types.MappingProxyType({
    f"synthetic_multihop:{split}": functools.partial(
        synthetic.multihop_corpus, seed=seed)
    for split, seed in synthetic.SPLIT_SEEDS.items()})


def _path(data_dir, rel, what, source):
  return paths.data_file(data_dir, rel, what, _FETCH[source])


def literal(x):
  """A Python-literal string (a list, dict, bool...) parsed; else as is."""
  if isinstance(x, str) and x[:1] in ("[", "{", "("):
    return ast.literal_eval(x)
  if x in ("True", "False"):
    return x == "True"
  return x


def read_rows(path: pathlib.Path, parse: Callable | None = None,
              pick: Callable[[int], list[int]] | None = None) -> list:
  """`parse` of each row of a JSONL file, a JSON list or a parquet table.

  `pick(n)` chooses which of a table's n rows to read (parquet only).
  Errors name the file and the line, or the row (`path: [i]: reason`).
  """
  path = pathlib.Path(path)
  if path.suffix == ".parquet":
    return _parquet_rows(path, parse, pick)
  if pick is not None:
    raise ValueError(f"{path}: rows can be picked from parquet files only")
  if path.suffix == ".jsonl":
    return jsonl.read(path, parse)
  data = jsonl.read_json(path)
  if not isinstance(data, list):
    raise jsonl.FormatError(f"{path}: expected a JSON list of rows, got a "
                            f"JSON {type(data).__name__}")
  return jsonl.parse_items(path, data, parse or (lambda r: r))


def _parquet_rows(path, parse, pick):
  try:
    table = pq.read_table(path)
    indices = pick(table.num_rows) if pick is not None else None
    rows = (table.take(indices) if indices is not None else table).to_pylist()
  except (pyarrow.ArrowException, OSError) as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    reason = reason.split(f"'{path}': ", 1)[-1]  # pyarrow names it too.
    raise jsonl.FormatError(f"{path}: not a readable parquet file ({reason})"
                            ) from e
  return jsonl.parse_items(path, rows, parse or (lambda r: r), indices)


# ------------------------------------------------------------------ GSM8K.


def gsm8k_answer(solution: str) -> str:
  """The number after '####' in a GSM8K solution, commas removed."""
  _, sep, tail = solution.rpartition("####")
  if not sep:
    raise ValueError(f"no '####' in GSM8K solution: {solution[-80:]!r}")
  return tail.strip().replace(",", "")


def _gsm8k_row(r):
  return r["question"], r["answer"], gsm8k_answer(r["answer"])


def load_gsm8k(split: str = "train", data_dir: str | None = None) -> list[Task]:
  rows = jsonl.read(_path(data_dir, f"gsm8k/{split}.jsonl",
                          f"gsm8k split {split!r}", "gsm8k"), _gsm8k_row)
  return [Task(id=f"gsm8k/{split}/{i}", question=question, answers=(answer,),
               source="gsm8k", split=split,
               metadata={"solution": solution.rpartition("####")[0].strip()})
          for i, (question, solution, answer) in enumerate(rows)]


# --------------------------------------------------------------- HotPotQA.

HOTPOTQA_FILES = {"dev": "hotpotqa/dev_distractor_500.jsonl",
                  "train": "hotpotqa/hotpotqa_train.json"}


def _hotpotqa_task(split):
  def parse(r):
    return Task(id=f"hotpotqa/{split}/{r['_id']}", question=r["question"],
                answers=(r["answer"],), source="hotpotqa", split=split,
                metadata={"supporting_facts": literal(r["supporting_facts"]),
                          "context": literal(r["context"]),
                          "type": r.get("type"), "level": r.get("level")})
  return parse


def load_hotpotqa(split: str = "dev",
                  data_dir: str | None = None) -> list[Task]:
  """HotPotQA dev (distractor, 500) or the 100 train questions."""
  path = _path(data_dir, HOTPOTQA_FILES[split], f"hotpotqa split {split!r}",
               "hotpotqa")
  return read_rows(path, _hotpotqa_task(split))


# ---------------------------------------------------------------- MuSiQue.


def _musique_task(split):
  def parse(r):
    aliases = [a for a in literal(r.get("answer_aliases", "[]"))
               if a != r["answer"]]
    return Task(
        id=f"musique/{split}/{r['id']}", question=r["question"],
        answers=(r["answer"], *aliases), source="musique", split=split,
        metadata={"paragraphs": literal(r["paragraphs"]),
                  "question_decomposition":
                      literal(r["question_decomposition"]),
                  "answerable": literal(r.get("answerable", True))})
  return parse


def load_musique(split: str = "train",
                 data_dir: str | None = None) -> list[Task]:
  """The 100 MuSiQue train questions; answers include the aliases."""
  return read_rows(_path(data_dir, f"musique/musique_{split}.json",
                     f"musique split {split!r}", "musique"),
               _musique_task(split))


# ----------------------------------------------------------- MATH / AIME.


def _prompt_text(prompt) -> str:
  """The (last) user message of a verl-style chat prompt."""
  messages = literal(prompt)
  users = [m["content"] for m in messages if m.get("role") == "user"]
  return (users or [messages[-1]["content"]])[-1]


def _verl_row(r):
  """(question, gold, metadata, id or None) of a verl-style row."""
  extra = literal(r.get("extra_info")) or {}
  gold = literal(r["reward_model"])["ground_truth"]
  meta = {k: extra[k] for k in ("level", "index") if k in extra}
  for k in ("subject", "solution", "unique_id"):
    if r.get(k) is not None:
      meta[k] = r[k]
  tid = r.get("unique_id") or r.get("id") or extra.get("index")
  return _prompt_text(r["prompt"]), str(gold), meta, tid


def _verl_tasks(path, source, split):
  return [Task(id=f"{source}/{split}/{i if tid is None else tid}",
               question=question, answers=(gold,), source=source, split=split,
               metadata=meta)
          for i, (question, gold, meta, tid) in enumerate(
              read_rows(path, _verl_row))]


MATH_FILES = {"train": "math/math_train_l3to5.parquet",
              "test": "math/math500.parquet"}
AIME_FILES = {"2024": "math/aime24.parquet", "2025": "math/aime25.parquet"}


def load_math(split: str = "train", data_dir: str | None = None) -> list[Task]:
  """MATH train (levels 3-5, 8,523) or test (MATH500).

  Two train problems (multiple choice) have an empty gold answer upstream;
  they are kept, so filter on `task.answer` to drop them.
  """
  return _verl_tasks(_path(data_dir, MATH_FILES[split],
                           f"math split {split!r}", "math"), "math", split)


def load_aime(split: str = "2024", data_dir: str | None = None) -> list[Task]:
  """AIME 2024 or 2025 (30 problems each)."""
  return _verl_tasks(_path(data_dir, AIME_FILES[split],
                           f"aime split {split!r}", "aime"), "aime", split)


AMC_FILES = {"2023": "math/amc23.parquet"}


def load_amc23(split: str = "test", data_dir: str | None = None
               ) -> list[Task]:
  """AMC 2023 (40 problems; SimpleTIR's code evaluates on it)."""
  return _verl_tasks(_path(data_dir, AMC_FILES["2023"], "amc23", "amc23"),
                     "amc23", split)


# --------------------------------------------------------------- Registry.


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  loader: Callable[..., list[Task]]  # (split, data_dir, limit) -> tasks.
  splits: tuple[str, ...]            # The first is the default.


def _files(fn):
  return lambda split, data_dir, limit: fn(split, data_dir)


def _fixed(fn, split):
  return lambda _, data_dir, limit: fn(split, data_dir)


DATASETS = {
    "gsm8k": DatasetSpec(_files(load_gsm8k), ("train", "test")),
    "hotpotqa": DatasetSpec(_files(load_hotpotqa), ("dev", "train")),
    "musique": DatasetSpec(_files(load_musique), ("train",)),
    "math": DatasetSpec(_files(load_math), ("train", "test")),
    "math500": DatasetSpec(_fixed(load_math, "test"), ("test",)),
    "aime": DatasetSpec(_files(load_aime), ("2024", "2025")),
    "aime24": DatasetSpec(_fixed(load_aime, "2024"), ("test",)),
    "aime25": DatasetSpec(_fixed(load_aime, "2025"), ("test",)),
    "amc23": DatasetSpec(_files(load_amc23), ("test",)),
    # Synthetic sets are generated: `limit` is their size (default 100).
    "synthetic_arith": DatasetSpec(
        lambda split, _, limit: synthetic.arithmetic_tasks(
            limit or 100, seed=synthetic.SPLIT_SEEDS[split], split=split),
        tuple(synthetic.SPLIT_SEEDS)),
    "synthetic_chain": DatasetSpec(
        lambda split, _, limit: synthetic.chain_tasks(limit or 100, split),
        tuple(synthetic.SPLIT_SEEDS)),
    "synthetic_compute": DatasetSpec(
        lambda split, _, limit: synthetic.compute_tasks(limit or 100, split),
        tuple(synthetic.SPLIT_SEEDS)),
    "synthetic_multihop": DatasetSpec(
        lambda split, _, limit: synthetic.multihop_tasks(
            limit or 100, seed=synthetic.SPLIT_SEEDS[split], split=split),
        tuple(synthetic.SPLIT_SEEDS)),
}


def check(name: str, split: str | None = None) -> str:
  """The split `name` reads (its first when None); ConfigError naming the
  valid datasets or splits otherwise. 'tfds:' names are not checked."""
  if name.startswith("tfds:"):
    return split or "test"
  if name not in DATASETS:
    raise config_lib.ConfigError(
        f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))} "
        "or 'tfds:<name>'")
  spec = DATASETS[name]
  split = spec.splits[0] if split is None else str(split)
  if split not in spec.splits:
    raise config_lib.ConfigError(
        f"dataset {name!r} has no split {split!r}; splits: "
        f"{', '.join(spec.splits)}")
  return split


def load_tasks(name: str, split: str | None = None,
               data_dir: str | None = None,
               limit: int | None = None) -> list[Task]:
  """Tasks of dataset `name` (see DATASETS, or 'tfds:<name>'), in file
  order, the first `limit` of them."""
  if name.startswith("tfds:"):
    return _load_tfds(name[len("tfds:"):], split or "test", limit)
  split = check(name, split)
  tasks = DATASETS[name].loader(split, data_dir, limit)
  return tasks if limit is None else tasks[:limit]


def _load_tfds(name, split, limit):
  """`question` / `answer` examples of a TFDS dataset (GSM8K-style)."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        f"dataset 'tfds:{name}' needs tensorflow_datasets, which is not "
        "installed (pip install tensorflow-datasets tensorflow)") from e
  source = name.split("/")[0].split(":")[0]
  examples = tfds.as_numpy(tfds.load(name, split=split))
  tasks = []
  for i, ex in enumerate(examples):
    if limit is not None and i >= limit:
      break
    text = {k: v.decode() if isinstance(v, bytes) else v
            for k, v in ex.items()}
    answer = text.get("answer", "")
    if source == "gsm8k":
      answer = gsm8k_answer(answer)
    tasks.append(Task(id=f"{source}/{split}/{i}", question=text["question"],
                      answers=(str(answer),), source=source, split=split))
  return tasks
