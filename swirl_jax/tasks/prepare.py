r"""The data job: downloads the datasets the configs use into a data dir.

  python -m swirl_jax.main \
      --config=configs/data.py:datasets=gsm8k,hotpotqa,math

Without --workdir it writes where runs look (`paths.data_job_dir()`:
`$SWIRL_JAX_DATA`, else `~/.cache/swirl_jax/data`, under
`$XDG_CACHE_HOME` if set); another --workdir needs
`export SWIRL_JAX_DATA=<it>` for runs to find it.

Each file comes from a Hugging Face Hub dataset repo pinned to a commit
(`SOURCES`), fetched with `huggingface_hub.hf_hub_download` (kept in the
Hugging Face cache; `HF_HUB_OFFLINE=1` reuses it), and converted into
exactly the layout and format the loaders read (tasks/datasets.py; the
data README):

  gsm8k/{train,test}.jsonl          openai/gsm8k main/*.parquet, as the
                                    upstream grade-school-math JSONL
  hotpotqa/dev_distractor_500.jsonl hotpotqa/hotpot_qa distractor
                                    validation, `hotpotqa_dev` questions
  hotpotqa/hotpotqa_train.json      distractor train (first shard),
  hotpotqa/hotpotqa_train_corpus.json  `hotpotqa_train` questions (10,000,
                                    the paper's) and the title -> sentences
                                    of their contexts (the CPU runs' closed
                                    corpus)
  hotpotqa/wiki_abstracts.jsonl     BeIR/hotpotqa corpus.jsonl.gz: the
  hotpotqa/wiki_abstracts.bm25/     HotPotQA Wikipedia abstracts (5.2M),
                                    `{title, text}`, and their BM25 index
                                    (built once here; search loads it)
  math/math_train_l3to5.parquet     hkust-nlp/SimpleRL-Zoo-Data level 3-5
  math/math500.parquet              HuggingFaceH4/MATH-500
  math/aime24.parquet               HuggingFaceH4/aime_2024
  math/aime25.parquet               math-ai/aime25
  math/amc23.parquet                math-ai/amc23 (40 problems)

The question samples are `random.Random(seed).sample` of the rows, kept in
file order. `<data dir>/manifest.json` records for every file written its
source repo, the revision asked for and the commit it resolved to, the
source files with their sha256, the selection, the row count and the
written file's sha256. A file whose manifest entry matches the request and
its bytes is not fetched again (`overwrite=True` forces it); a corpus's
index is built when missing. MuSiQue is read by `datasets.load_musique`
(the transfer evaluation's offline copy) and is not fetched.

One module on purpose: a table of products, each a few-line row
converter and reader, over the one download / manifest / index mechanism
they all go through, read top to bottom; each source's pin (`SOURCES`)
sits beside the converter that writes its layout.
"""

import dataclasses
import gzip
import hashlib
import io
import json
import pathlib
import random
import re
from typing import Callable

from absl import logging
import huggingface_hub
import pyarrow
import pyarrow.parquet as pq

from swirl_jax import errors, jsonl, paths
from swirl_jax.tasks import datasets
from swirl_jax.tools import search

MANIFEST = "manifest.json"


@dataclasses.dataclass(frozen=True)
class Source:
  repo: str  # A dataset repo on the Hub.
  revision: str  # A commit where known; a branch is resolved and recorded.


SOURCES = {
    "gsm8k": Source("openai/gsm8k", "740312add88f781978c0658806c59bc2815b9866"),
    "hotpotqa": Source("hotpotqa/hotpot_qa",
                       "1908d6afbbead072334abe2965f91bd2709910ab"),
    # The file SimpleTIR trains on (its datasets/simplelr_math_35).
    "math_train": Source("hkust-nlp/SimpleRL-Zoo-Data", "main"),
    "math500": Source("HuggingFaceH4/MATH-500",
                      "ff5b20257d8185524591543f8ff5993951537bb8"),
    "aime24": Source("HuggingFaceH4/aime_2024",
                     "2fe88a2f1091d5048c0f36abc874fb997b3dd99a"),
    "aime25": Source("math-ai/aime25",
                     "563bb8404243c5f09de6ec262f2db674fe5bce9b"),
    "amc23": Source("math-ai/amc23", "main"),
    # The Wikipedia abstracts HotPotQA was built on (BEIR's copy).
    "hotpotqa_wiki": Source("BeIR/hotpotqa",
                            "d01a1664af564332aeb82454911d50f83a8a05ee"),
}


class DownloadError(errors.UserError, OSError):
  """A Hub file that could not be fetched (one-line message)."""


def _first_line(e: BaseException) -> str:
  lines = [l for l in str(e).splitlines() if l.strip()]
  return lines[0] if lines else type(e).__name__


def download(source: Source, filename: str) -> tuple[pathlib.Path, str]:
  """(local path, commit) of one file of `source`, via the Hub cache."""
  try:
    path = huggingface_hub.hf_hub_download(
        source.repo, filename, repo_type="dataset", revision=source.revision)
  except (OSError, huggingface_hub.errors.EntryNotFoundError) as e:
    raise DownloadError(
        f"{source.repo}@{source.revision}: {filename}: download failed "
        f"({_first_line(e)}); check the connection to huggingface.co, or run "
        "with HF_HUB_OFFLINE=1 to use files already in the Hugging Face "
        "cache") from e
  path = pathlib.Path(path)
  # The cache keeps each file under snapshots/<commit>/<filename>.
  commit = path.parents[len(pathlib.PurePosixPath(filename).parts) - 1].name
  if not re.fullmatch(r"[0-9a-f]{40}", commit):
    commit = source.revision
  return path, commit


# ------------------------------------------------------------- converters.
# Each takes the downloaded files and the config and returns
# {path under the data dir: (bytes, rows)}.


def _sample(k: int, seed: int) -> Callable[[int], list[int]]:
  """`k` of n row indices, seeded, in file order (all rows if k >= n)."""
  def pick(n):
    return list(range(n)) if k >= n else sorted(
        random.Random(seed).sample(range(n), k))
  return pick


def _jsonl_bytes(rows, ensure_ascii: bool) -> bytes:
  return "".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n"
                 for r in rows).encode("utf-8")


def _parquet_bytes(rows) -> bytes:
  buf = io.BytesIO()
  pq.write_table(pyarrow.Table.from_pylist(rows), buf)
  return buf.getvalue()


def _gsm8k_row(r):
  datasets.gsm8k_answer(r["answer"])  # Fails early on a row with no '####'.
  return {"question": r["question"], "answer": r["answer"]}


def _gsm8k(split):
  def convert(files, c):
    rows = datasets.read_rows(files[0], _gsm8k_row)
    return {f"gsm8k/{split}.jsonl": (_jsonl_bytes(rows, True), len(rows))}
  return convert


_DEV_KEYS = ("_id", "answer", "question", "supporting_facts", "context",
             "type", "level")
_TRAIN_KEYS = ("supporting_facts", "level", "question", "context", "answer",
               "_id", "type")


def _hotpotqa_row(r):
  """A Hub row (struct-of-lists fields) in HotPotQA's own JSON form."""
  facts, context = r["supporting_facts"], r["context"]
  return {"_id": r["id"], "answer": r["answer"], "question": r["question"],
          "supporting_facts": [[t, s] for t, s in
                               zip(facts["title"], facts["sent_id"])],
          "context": [[t, list(s)] for t, s in
                      zip(context["title"], context["sentences"])],
          "type": r["type"], "level": r["level"]}


def _hotpotqa_dev(files, c):
  rows = datasets.read_rows(files[0], _hotpotqa_row,
                            _sample(c.hotpotqa_dev, c.seed))
  rows = [{k: r[k] for k in _DEV_KEYS} for r in rows]
  return {datasets.HOTPOTQA_FILES["dev"]: (_jsonl_bytes(rows, False),
                                           len(rows))}


def _hotpotqa_train(files, c):
  rows = datasets.read_rows(files[0], _hotpotqa_row,
                            _sample(c.hotpotqa_train, c.seed))
  corpus = {}  # Title -> sentences, first occurrence kept.
  for r in rows:
    for title, sentences in r["context"]:
      corpus.setdefault(title, sentences)
  rows = [{k: r[k] for k in _TRAIN_KEYS} for r in rows]
  return {datasets.HOTPOTQA_FILES["train"]: (
              json.dumps(rows, indent=4).encode(), len(rows)),
          "hotpotqa/hotpotqa_train_corpus.json": (
              json.dumps(corpus, indent=4).encode(), len(corpus))}


def _verl_row(data_source, question, gold, extra, **columns):
  """A row as the verl-style parquet files hold it (datasets._verl_row)."""
  return {**columns, "data_source": data_source,
          "prompt": [{"content": question, "role": "user"}],
          "ability": "math",
          "reward_model": {"ground_truth": str(gold), "style": "rule"},
          "extra_info": extra}


def _level(x) -> int:
  """MATH levels come as 3 or as 'Level 3'."""
  return int(str(x).split()[-1])


def _math_train_row(r):
  extra = datasets.literal(r.get("extra_info")) or {}
  reward = datasets.literal(r.get("reward_model")) or {}
  question = r.get("question", extra.get("question"))
  gold = r.get("gt_answer", reward.get("ground_truth"))
  level = r.get("level", extra.get("level"))
  if question is None or gold is None or level is None:
    raise ValueError("needs question (or extra_info.question), gt_answer "
                     "(or reward_model.ground_truth) and level; fields: "
                     f"{sorted(r)}")
  return question, gold, _level(level), r.get("subject")


def _math_train(files, c):
  repo = SOURCES["math_train"].repo
  rows = [_verl_row(repo, q, gold, {"answer": str(gold), "index": i,
                                    "level": level, "question": q,
                                    "split": "train"}, subject=subject)
          for i, (q, gold, level, subject) in enumerate(
              datasets.read_rows(files[0], _math_train_row))]
  return {datasets.MATH_FILES["train"]: (_parquet_bytes(rows), len(rows))}


def _math500_row(r):
  return (r["problem"], r["answer"], _level(r["level"]), r["subject"],
          r["solution"], r["unique_id"])


def _math500(files, c):
  repo = SOURCES["math500"].repo
  rows = [_verl_row(repo, q, gold, {"answer": gold, "index": i,
                                    "level": level, "question": q,
                                    "split": "test"},
                    solution=solution, subject=subject, unique_id=uid)
          for i, (q, gold, level, subject, solution, uid) in enumerate(
              datasets.read_rows(files[0], _math500_row))]
  return {datasets.MATH_FILES["test"]: (_parquet_bytes(rows), len(rows))}


def _aime(year, keep_id):
  """AIME `year`: ids kept as a column (2025) or left to the row index
  (2024, as the file the project used before)."""
  key = f"aime{year % 100}"

  def convert(files, c):
    repo = SOURCES[key].repo
    parsed = datasets.read_rows(
        files[0], lambda r: (str(r["id"]), r["problem"], str(r["answer"])))
    rows = [_verl_row(repo, q, gold, {"index": i, "split": "test"},
                      **({"id": rid} if keep_id else {}))
            for i, (rid, q, gold) in enumerate(parsed)]
    return {datasets.AIME_FILES[str(year)]: (_parquet_bytes(rows), len(rows))}
  return convert


def _amc23_row(r):
  """(question, gold) of a math-ai/amc23 row; answers stored as floats
  (12.0) are written as the integers they are."""
  question = r.get("question", r.get("problem"))
  gold = r.get("answer")
  if question is None or gold is None:
    raise ValueError(f"needs question (or problem) and answer; fields: "
                     f"{sorted(r)}")
  if isinstance(gold, float) and gold.is_integer():
    gold = int(gold)
  return str(r.get("id", "")), question, str(gold)


def _amc23(files, c):
  repo = SOURCES["amc23"].repo
  rows = [_verl_row(repo, q, gold, {"index": i, "split": "test"},
                    **({"id": rid} if rid else {}))
          for i, (rid, q, gold) in enumerate(
              datasets.read_rows(files[0], _amc23_row))]
  return {datasets.AMC_FILES["2023"]: (_parquet_bytes(rows), len(rows))}


def _wiki_row(r):
  return {"title": str(r["title"]), "text": str(r["text"])}


def _gzip_jsonl(path, parse) -> list:
  """`parse` of each line of a gzipped JSONL file; errors name the line."""
  out = []
  with gzip.open(path, "rt", encoding="utf-8") as f:
    for no, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        out.append(parse(json.loads(line)))
      except (ValueError, KeyError, TypeError) as e:
        raise jsonl.FormatError(f"{path}:{no}: bad record ({e})") from e
  return out


def _hotpotqa_wiki(files, c):
  """BEIR's corpus.jsonl.gz (`_id, title, text, metadata` a line) as
  `{title, text}` JSONL, in file order."""
  rows = _gzip_jsonl(files[0], _wiki_row)
  return {WIKI_CORPUS: (_jsonl_bytes(rows, False), len(rows))}


WIKI_CORPUS = "hotpotqa/wiki_abstracts.jsonl"


@dataclasses.dataclass(frozen=True)
class Product:
  """Files of the data dir made from files of one source."""
  outputs: tuple[str, ...]  # Paths under the data dir.
  source: str  # Key of SOURCES.
  files: tuple[str, ...]  # Files of the source repo.
  convert: Callable  # (local paths, config) -> {output: (bytes, rows)}.
  selection: Callable = lambda c: "all rows"
  index: bool = False  # Its first output is a search corpus: index it.


def _sampled(what, key):
  return lambda c: (f"{c[key]} {what} sampled with random.Random({c.seed}), "
                    "in file order")


PRODUCTS = {
    "gsm8k": [
        Product(("gsm8k/train.jsonl",), "gsm8k",
                ("main/train-00000-of-00001.parquet",), _gsm8k("train")),
        Product(("gsm8k/test.jsonl",), "gsm8k",
                ("main/test-00000-of-00001.parquet",), _gsm8k("test")),
    ],
    "hotpotqa": [
        Product((datasets.HOTPOTQA_FILES["dev"],), "hotpotqa",
                ("distractor/validation-00000-of-00001.parquet",),
                _hotpotqa_dev, _sampled("dev questions", "hotpotqa_dev")),
        Product((datasets.HOTPOTQA_FILES["train"],
                 "hotpotqa/hotpotqa_train_corpus.json"), "hotpotqa",
                ("distractor/train-00000-of-00002.parquet",), _hotpotqa_train,
                _sampled("train questions (first shard)", "hotpotqa_train")),
    ],
    "math": [
        Product((datasets.MATH_FILES["train"],), "math_train",
                ("simplelr_qwen_level3to5/train.parquet",), _math_train),
        Product((datasets.MATH_FILES["test"],), "math500", ("test.jsonl",),
                _math500),
        Product((datasets.AIME_FILES["2024"],), "aime24",
                ("data/train-00000-of-00001.parquet",),
                _aime(2024, keep_id=False)),
        Product((datasets.AIME_FILES["2025"],), "aime25", ("test.jsonl",),
                _aime(2025, keep_id=True)),
        Product((datasets.AMC_FILES["2023"],), "amc23",
                ("test-00000-of-00001.parquet",), _amc23),
    ],
    "hotpotqa_wiki": [
        Product((WIKI_CORPUS,), "hotpotqa_wiki", ("corpus.jsonl.gz",),
                _hotpotqa_wiki, index=True),
    ],
}

# What the loaders read of each dataset, checked after writing.
_CHECKS = {
    "gsm8k": [("gsm8k", "train"), ("gsm8k", "test")],
    "hotpotqa": [("hotpotqa", "dev"), ("hotpotqa", "train")],
    "math": [("math", "train"), ("math", "test"), ("aime", "2024"),
             ("aime", "2025"), ("amc23", "test")],
    "hotpotqa_wiki": [],
}


# -------------------------------------------------------------------- job.


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _file_sha256(path: pathlib.Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _is_current(entry, want, path: pathlib.Path) -> bool:
  return (bool(entry) and all(entry.get(k) == v for k, v in want.items())
          and path.is_file() and _file_sha256(path) == entry.get("sha256"))


def _make(product: Product, c, data_dir: pathlib.Path, manifest: dict) -> None:
  source = SOURCES[product.source]
  want = {"repo": source.repo, "revision": source.revision,
          "selection": product.selection(c)}
  if not c.overwrite and all(
      _is_current(manifest.get(rel), want, data_dir / rel)
      for rel in product.outputs):
    logging.info("data: %s up to date", ", ".join(product.outputs))
    _index(product, data_dir)
    return
  fetched = [download(source, f) for f in product.files]
  written = product.convert([path for path, _ in fetched], c)
  assert sorted(written) == sorted(product.outputs), (written.keys(), product)
  sources = {f: _file_sha256(path) for f, (path, _) in
             zip(product.files, fetched)}
  for rel, (data, rows) in written.items():
    jsonl.write_bytes(data_dir / rel, data)
    manifest[rel] = {**want, "commit": fetched[0][1], "source_files": sources,
                     "rows": rows, "sha256": _sha256(data)}
    logging.info("data: wrote %s (%d rows) from %s@%s", rel, rows,
                 source.repo, fetched[0][1])
  # After every product, so an interrupted job keeps what it finished.
  jsonl.write_bytes(data_dir / MANIFEST, json.dumps(
      manifest, indent=2, sort_keys=True).encode() + b"\n")
  _index(product, data_dir)


def _index(product: Product, data_dir: pathlib.Path) -> None:
  """A corpus's BM25 index, beside it (`search.index_dir`), built once."""
  if product.index:
    path = data_dir / product.outputs[0]
    n = search.build_index(path)
    logging.info("data: %s indexed (%d passages) in %s", path, n,
                 search.index_dir(path))


def prepare(names, data_dir, c) -> dict:
  """Fetches the named datasets into `data_dir`; returns the manifest."""
  unknown = [n for n in names if n not in PRODUCTS]
  if unknown or not names:
    raise ValueError(f"data job: unknown datasets {unknown}; valid: "
                     f"{', '.join(PRODUCTS)}")
  data_dir = pathlib.Path(data_dir)
  path = data_dir / MANIFEST
  manifest = jsonl.read_json(path) if path.exists() else {}
  for name in names:
    for product in PRODUCTS[name]:
      _make(product, c, data_dir, manifest)
    for dataset, split in _CHECKS[name]:  # The loaders must read them.
      n = len(datasets.load_tasks(dataset, split, data_dir=str(data_dir)))
      logging.info("data: %s %s reads as %d tasks", dataset, split, n)
  return manifest


def run(config, workdir: str) -> dict:
  """The `data` job: the data dir is the workdir."""
  manifest = prepare(tuple(config.datasets), workdir, config)
  if _same_dir(workdir, paths.default_data_dir()):
    logging.info("data ready in %s, where runs look for it", workdir)
  else:
    logging.info("data ready in %s; point the configs at it with: "
                 "export SWIRL_JAX_DATA=%s", workdir, workdir)
  return manifest


def _same_dir(a: str, b: str) -> bool:
  return bool(b) and pathlib.Path(a).resolve() == pathlib.Path(b).resolve()
