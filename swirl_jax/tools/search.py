"""The `<search_query>` tool: BM25 (bm25s) over a local paragraph corpus.

A corpus is a list of `Passage(title, text)`. Loaders read HotPotQA
paragraphs (from a question file's `context`, or from the title -> text
corpus JSON), the MuSiQue corpus, and any JSONL of `{"title", "text"}`.
Each passage is indexed as its title and text together, which finds the
gold HotPotQA paragraph noticeably more often than the text alone.

The index is built once per corpus: it is cached in memory, and on disk
under `cache_dir` when given, keyed by a hash of the corpus content and the
tokeniser and scoring settings (bm25s `save` / `load`). A corpus file may
carry its index beside it (`index_dir`, made by `build_index`: the data
job does so for the 5.2M HotPotQA Wikipedia abstracts), which every tool
over that file loads instead of building its own.

The observation is `QUERY -> [1] Title: text ... [2] Title: text`, each
passage cut to `max_chars` characters.
"""

import ast
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
import threading

import bm25s
import numpy as np

from swirl_jax import jsonl

# Everything that changes the index is part of its cache key.
_SETTINGS = {"lower": True, "stopwords": "en", "k1": 1.5, "b": 0.75,
             "method": "lucene", "title_in_text": True,
             "bm25s": getattr(bm25s, "__version__", "?")}
_MEMORY_CACHE = {}
_MEMORY_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Passage:
  title: str
  text: str


# ---------------------------------------------------------------- loaders.


def _literal(x):
  """HotPotQA fields may be Python-literal strings instead of JSON."""
  return ast.literal_eval(x) if isinstance(x, str) else x


def _text(value) -> str:
  """Paragraph text from a string or a list of sentences (joined as is:
  HotPotQA sentences carry their own leading spaces)."""
  if isinstance(value, str):
    return value
  return "".join(value)


def _read(path):
  """(path, content) of a corpus file: JSONL values or a JSON document."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(
        f"corpus file not found: {path} (tools.search_corpus takes a corpus "
        "file or a named corpus such as hotpotqa:wiki, which the data job "
        "fetches: python -m swirl_jax.main "
        "--config=configs/data.py:datasets=hotpotqa_wiki --workdir=DIR)")
  if path.suffix == ".jsonl":
    return path, jsonl.read(path)
  return path, jsonl.read_json(path)


def _rows(path, data, parse) -> list:
  if not isinstance(data, list):
    raise jsonl.FormatError(f"{path}: expected rows (a JSON list or JSONL), "
                            f"got a JSON {type(data).__name__}")
  return jsonl.parse_items(path, data, parse)


def unique_passages(pairs) -> list[Passage]:
  """Passages from (title, text) pairs, first occurrence kept, in order."""
  seen, out = set(), []
  for title, text in pairs:
    key = (title, text)
    if key not in seen:
      seen.add(key)
      out.append(Passage(title, text))
  return out


def _context_pairs(row):
  return [(title, _text(sentences))
          for title, sentences in _literal(row["context"])]


def _context_passages(path, data) -> list[Passage]:
  return unique_passages(pair for pairs in _rows(path, data, _context_pairs)
                         for pair in pairs)


def hotpotqa_context_passages(path) -> list[Passage]:
  """The unique paragraphs of a HotPotQA question file's `context` fields
  (JSONL or a JSON list; fields may be Python-literal strings)."""
  return _context_passages(*_read(path))


def _title_text(row) -> Passage:
  return Passage(str(row.get("title", "")), _text(row.get("text", "")))


def _title_text_passages(path, data) -> list[Passage]:
  if isinstance(data, dict):
    return [Passage(str(t), _text(v)) for t, v in data.items()]
  return _rows(path, data, _title_text)


def load_title_text_json(path) -> list[Passage]:
  """A JSON object title -> text (or sentence list), like the HotPotQA
  train corpus; or a JSON list / JSONL of `{title, text}` rows."""
  return _title_text_passages(*_read(path))


def load_corpus(path) -> list[Passage]:
  """Any corpus file this module knows, by shape: a title -> text object,
  `{title, text}` rows (the MuSiQue corpus, JSONL corpora), or question
  rows with a HotPotQA `context`."""
  path, data = _read(path)
  if (isinstance(data, list) and data and isinstance(data[0], dict)
      and "context" in data[0]):
    return _context_passages(path, data)
  return _title_text_passages(path, data)


def write_jsonl(passages, path) -> None:
  """Writes passages as JSONL `{title, text}`, readable by `load_corpus`."""
  jsonl.write(path, ({"title": p.title, "text": p.text}
                     for p in as_passages(passages)))


# ------------------------------------------------------------------ index.


def as_passages(corpus) -> list[Passage]:
  """Passages from `Passage`s, `{title, text}` dicts or (title, text)."""
  out = []
  for p in corpus:
    if isinstance(p, Passage):
      out.append(p)
    elif isinstance(p, dict):
      out.append(Passage(str(p.get("title", "")), str(p.get("text", ""))))
    else:
      out.append(Passage(str(p[0]), str(p[1])))
  return out


def corpus_key(passages) -> str:
  """Hash of the corpus content and the index settings."""
  h = hashlib.sha256(json.dumps(_SETTINGS, sort_keys=True).encode())
  for p in passages:
    for field in (p.title, p.text):
      data = field.encode()
      h.update(len(data).to_bytes(8, "little"))
      h.update(data)
  return h.hexdigest()[:32]


def _tokenize(texts, return_ids):
  return bm25s.tokenize(texts, lower=_SETTINGS["lower"],
                        stopwords=_SETTINGS["stopwords"],
                        return_ids=return_ids, show_progress=False)


def _doc_text(p):
  return f"{p.title}\n{p.text}" if _SETTINGS["title_in_text"] else p.text


def _build(passages):
  retriever = bm25s.BM25(k1=_SETTINGS["k1"], b=_SETTINGS["b"],
                         method=_SETTINGS["method"])
  retriever.index(_tokenize([_doc_text(p) for p in passages], True),
                  show_progress=False)
  return retriever


def _load_or_build(passages, key, cache_dir):
  if cache_dir is None:
    return _build(passages)
  path = pathlib.Path(cache_dir) / f"bm25_{key}"
  if (path / "params.index.json").is_file():
    try:
      return bm25s.BM25.load(str(path), load_vocab=True, show_progress=False,
                             verbosity=0)
    except Exception:  # pylint: disable=broad-except
      pass  # A damaged cache entry is rebuilt below.
  retriever = _build(passages)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=path.parent, prefix=".tmp_bm25_")
  try:
    retriever.save(tmp, show_progress=False)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)  # Readers never see a half-written index.
  except OSError:
    shutil.rmtree(tmp, ignore_errors=True)
  return retriever


def index_dir(corpus_path) -> pathlib.Path:
  """Where a corpus file's own index lives: `<file stem>.bm25/` beside it."""
  p = pathlib.Path(corpus_path)
  return p.parent / (p.name.split(".")[0] + ".bm25")


def build_index(corpus_path) -> int:
  """Indexes a corpus file into its `index_dir` (kept if current);
  returns the number of passages."""
  passages = load_corpus(corpus_path)
  get_index(passages, index_dir(corpus_path))
  return len(passages)


def get_index(passages, cache_dir=None):
  """(BM25 index of `passages`, its lock), from memory, disk, or built.

  Tools over the same corpus share one index and one lock.
  """
  key = corpus_key(passages)
  with _MEMORY_LOCK:
    if key not in _MEMORY_CACHE:
      _MEMORY_CACHE[key] = (_load_or_build(passages, key, cache_dir),
                            threading.Lock())
    return _MEMORY_CACHE[key]


# ------------------------------------------------------------------- tool.


def _cut(text, max_chars):
  text = " ".join(text.split())
  if len(text) <= max_chars:
    return text
  cut = text[:max_chars]
  space = cut.rfind(" ")
  return (cut[:space] if space > max_chars // 2 else cut) + " ..."


class SearchTool:
  """BM25 search over a fixed corpus.

  `tool(query)` gives the observation text; `retrieve(queries, k)` gives
  passage indices, best first; `search(query)` gives passages.
  """

  def __init__(self, corpus, k: int = 5, max_chars: int = 500,
               cache_dir: str | None = None):
    self.passages = as_passages(corpus)
    if not self.passages:
      raise ValueError("SearchTool needs a non-empty corpus")
    self.k = k
    self.max_chars = max_chars
    self._index, self._lock = get_index(self.passages, cache_dir)

  def retrieve(self, queries, k: int | None = None) -> list[list[int]]:
    """Indices of the top-k passages per query; passages with no query
    term in common are left out."""
    k = min(self.k if k is None else k, len(self.passages))
    queries = [str(q) for q in queries]
    if not queries or k <= 0:
      return [[] for _ in queries]
    tokens = _tokenize(queries, False)
    with self._lock:
      docs, scores = self._index.retrieve(tokens, k=k, show_progress=False,
                                          n_threads=0)
    return [[int(d) for d, s in zip(row_d, row_s) if s > 0]
            for row_d, row_s in zip(np.asarray(docs), np.asarray(scores))]

  def search(self, query: str, k: int | None = None) -> list[Passage]:
    return [self.passages[i] for i in self.retrieve([query], k)[0]]

  def __call__(self, query: str) -> str:
    return self.observation(query, self.search(query))

  def batch(self, queries) -> list[str]:
    hits = self.retrieve(queries)
    return [self.observation(q, [self.passages[i] for i in ids])
            for q, ids in zip(queries, hits)]

  def observation(self, query, passages) -> str:
    query = " ".join(str(query).split())
    if not passages:
      return f"{query} -> No results."
    lines = [f"[{i}] {p.title}: {_cut(p.text, self.max_chars)}"
             for i, p in enumerate(passages, 1)]
    return f"{query} -> " + "\n".join(lines)
