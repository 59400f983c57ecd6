"""BM25 search tool: loaders, observations, caching, HotPotQA recall."""

import json
import os
import pathlib

import pytest

from swirl_jax import paths
from swirl_jax.tasks import datasets
from swirl_jax.tools import registry
from swirl_jax.tools import search
from swirl_jax.tools.search import Passage

CORPUS = [
    Passage("Apple Inc.", "Apple designs the iPhone. It was founded by Steve "
            "Jobs, Steve Wozniak and Ronald Wayne in 1976."),
    Passage("Banana", "A banana is an elongated, edible fruit."),
    Passage("Cherry", "A cherry is the fruit of many plants of the genus "
            "Prunus. " + "Cherries are red. " * 60),
    Passage("Steve Jobs", "Steven Paul Jobs was an American businessman."),
]


def test_search_observation_format():
  tool = search.SearchTool(CORPUS, k=2, max_chars=80)
  obs = tool("who founded Apple,  Steve Jobs?")
  assert obs.startswith("who founded Apple, Steve Jobs? -> [1] Apple Inc.: "
                        "Apple designs")
  assert "\n[2] Steve Jobs: Steven Paul Jobs" in obs
  long = tool("cherry genus Prunus")
  first = long.split("\n")[0]
  assert first.endswith(" ...") and len(first) < 140  # Passage cut.
  assert tool("the of and") == "the of and -> No results."
  assert tool("zzzz qqqq") == "zzzz qqqq -> No results."


def test_retrieve_indices_and_k():
  tool = search.SearchTool(CORPUS, k=1)
  assert tool.retrieve(["banana fruit", "Steven Paul Jobs"]) == [[1], [3]]
  assert len(tool.retrieve(["fruit"], k=10)[0]) == 2  # Only matching ones.
  assert [p.title for p in tool.search("edible fruit banana")] == ["Banana"]
  assert tool.batch(["banana"]) == [tool("banana")]


def test_loaders_and_jsonl_round_trip(tmp_path):
  path = tmp_path / "c.jsonl"
  search.write_jsonl(CORPUS, path)
  assert search.load_corpus(path) == CORPUS
  obj = tmp_path / "c.json"
  obj.write_text(json.dumps({"A": ["One.", " Two."], "B": "Text."}))
  assert search.load_corpus(obj) == [Passage("A", "One. Two."),
                                     Passage("B", "Text.")]
  rows = [{"context": "[['T', ['a.', ' b.']], ['U', ['c.']]]"},
          {"context": [["T", ["a.", " b."]]]}]
  qa = tmp_path / "q.json"
  qa.write_text(json.dumps(rows))
  assert search.load_corpus(qa) == [Passage("T", "a. b."), Passage("U", "c.")]
  with pytest.raises(FileNotFoundError):
    search.load_corpus(tmp_path / "missing.jsonl")


def test_index_cached_on_disk(tmp_path, monkeypatch):
  corpus = CORPUS + [Passage("Durian", f"unique durian text {os.getpid()}")]
  monkeypatch.setattr(search, "_MEMORY_CACHE", {})
  first = search.SearchTool(corpus, cache_dir=tmp_path)
  entries = list(pathlib.Path(tmp_path).glob("bm25_*"))
  assert len(entries) == 1
  # A fresh process would load it: build must not be called again.
  monkeypatch.setattr(search, "_MEMORY_CACHE", {})
  monkeypatch.setattr(search, "_build", lambda _: pytest.fail("rebuilt"))
  second = search.SearchTool(corpus, cache_dir=tmp_path)
  assert second("durian") == first("durian")
  # Different content, different key.
  assert search.corpus_key(corpus) != search.corpus_key(corpus[:-1])


def test_index_memory_cache_is_shared():
  a = search.SearchTool(CORPUS)
  b = search.SearchTool(list(CORPUS), k=1)
  assert search.get_index(a.passages) is search.get_index(b.passages)


def _data_dir():
  d = paths.default_data_dir()
  hotpot = pathlib.Path(d or ".") / "hotpotqa" / "dev_distractor_500.jsonl"
  if not d or not hotpot.is_file():
    pytest.skip("HotPotQA data not found")
  return d


def test_hotpotqa_dev_recall_subset():
  data_dir = _data_dir()
  passages = registry.corpus("hotpotqa:dev", data_dir)
  assert len(passages) == 4947
  tasks = datasets.load_tasks("hotpotqa", "dev", data_dir=data_dir, limit=50)
  tool = search.SearchTool(passages, k=5)
  found = []
  for task, ids in zip(tasks, tool.retrieve([t.question for t in tasks])):
    gold = {title for title, _ in task.metadata["supporting_facts"]}
    got = {passages[i].title for i in ids}
    found.append(len(gold & got) / len(gold))
  recall = sum(found) / len(found)
  assert 0.55 < recall < 0.9, recall  # About 0.7 over all 500.
