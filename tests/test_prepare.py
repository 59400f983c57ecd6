"""The data job: Hub file formats -> the project's files, and the download
path up to the network call.

There is no network here, so the Hub is played by a Hugging Face cache
directory built from the copies in the data directory
(`paths.default_data_dir()`), each written in the layout its Hub repo
holds (parquet with struct columns, JSONL...). The job
must turn them back into the project's files: byte for byte where the
project's file is the upstream one (GSM8K, HotPotQA), task for task where
it is a conversion (MATH, AIME).
"""

import gzip
import json
import os
import pathlib
import random
import subprocess
import sys

import huggingface_hub
import ml_collections
import pyarrow
import pyarrow.parquet as pq
import pytest

from swirl_jax import paths
from swirl_jax.tasks import datasets
from swirl_jax.tasks import prepare
from swirl_jax.tools import registry
from swirl_jax.tools import search

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAIN_COMMIT = "c0ffee" + "0" * 34  # What the fake Hub resolves 'main' to.


def _data_dir():
  d = paths.default_data_dir()
  if not d or not (pathlib.Path(d) / "math" / "aime25.parquet").is_file():
    pytest.skip("data directory not found")
  return pathlib.Path(d)


def _write_parquet(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  pq.write_table(pyarrow.Table.from_pylist(rows), path)


def _write_jsonl(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _hub_hotpotqa(r):
  """A HotPotQA row as the Hub's parquet holds it (struct of lists)."""
  return {"id": r["_id"], "question": r["question"], "answer": r["answer"],
          "type": r["type"], "level": r["level"],
          "supporting_facts": {"title": [t for t, _ in r["supporting_facts"]],
                               "sent_id": [s for _, s in
                                           r["supporting_facts"]]},
          "context": {"title": [t for t, _ in r["context"]],
                      "sentences": [s for _, s in r["context"]]}}


def _hub_files(data):
  """{(repo, filename): rows writer} of every Hub file the job reads, made
  from the project's files."""
  rows = lambda rel: datasets.read_rows(data / rel)
  math500 = rows("math/math500.parquet")
  return {
      ("openai/gsm8k", "main/train-00000-of-00001.parquet"):
          (_write_parquet, rows("gsm8k/train.jsonl")),
      ("openai/gsm8k", "main/test-00000-of-00001.parquet"):
          (_write_parquet, rows("gsm8k/test.jsonl")),
      ("hotpotqa/hotpot_qa", "distractor/validation-00000-of-00001.parquet"):
          (_write_parquet, [_hub_hotpotqa(r) for r in
                            rows("hotpotqa/dev_distractor_500.jsonl")]),
      ("hotpotqa/hotpot_qa", "distractor/train-00000-of-00002.parquet"):
          (_write_parquet, [_hub_hotpotqa(r) for r in
                            rows("hotpotqa/hotpotqa_train.json")]),
      # The file SimpleTIR copied is the Hub's own: served as it is.
      ("hkust-nlp/SimpleRL-Zoo-Data", "simplelr_qwen_level3to5/train.parquet"):
          (_write_parquet, rows("math/math_train_l3to5.parquet")),
      ("HuggingFaceH4/MATH-500", "test.jsonl"):
          (_write_jsonl, [{"problem": r["prompt"][0]["content"],
                           "solution": r["solution"],
                           "answer": r["reward_model"]["ground_truth"],
                           "subject": r["subject"],
                           "level": r["extra_info"]["level"],
                           "unique_id": r["unique_id"]} for r in math500]),
      ("HuggingFaceH4/aime_2024", "data/train-00000-of-00001.parquet"):
          (_write_parquet, [{"id": 60 + i, "problem": r["prompt"][0]["content"],
                             "solution": "", "url": "", "year": "2024",
                             "answer": r["reward_model"]["ground_truth"]}
                            for i, r in enumerate(
                                rows("math/aime24.parquet"))]),
      ("math-ai/aime25", "test.jsonl"):
          (_write_jsonl, [{"problem": r["prompt"][0]["content"],
                           "answer": r["reward_model"]["ground_truth"],
                           "id": r["id"]}
                          for r in rows("math/aime25.parquet")]),
      # Not in the data directory: made-up rows in the columns of the Hub copy
      # (answers as floats).
      ("math-ai/amc23", "test-00000-of-00001.parquet"):
          (_write_parquet, AMC_ROWS),
      # BEIR's corpus of the HotPotQA Wikipedia abstracts, played by the
      # train questions' own paragraphs.
      ("BeIR/hotpotqa", "corpus.jsonl.gz"):
          (_write_jsonl_gz, [
              {"_id": str(i), "title": t, "text": "".join(v), "metadata": {}}
              for i, (t, v) in enumerate(json.loads(
                  (data / "hotpotqa/hotpotqa_train_corpus.json")
                  .read_text()).items())]),
  }


AMC_ROWS = [{"id": i, "question": f"What is {i} + {i}?", "answer": 2.0 * i,
             "url": ""} for i in range(1, 4)] + [
                 {"id": 4, "question": "What is 1/2 + 1/4?", "answer": 0.75,
                  "url": ""}]


def _write_jsonl_gz(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  with gzip.open(path, "wt", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
  """A Hugging Face hub cache holding every file the job reads."""
  data = _data_dir()
  cache = tmp_path_factory.mktemp("hf") / "hub"
  by_repo = {s.repo: s for s in prepare.SOURCES.values()}
  for (repo, filename), (write, rows) in _hub_files(data).items():
    revision = by_repo[repo].revision
    commit = MAIN_COMMIT if revision == "main" else revision
    folder = cache / f"datasets--{repo.replace('/', '--')}"
    write(folder / "snapshots" / commit / filename, rows)
    if revision == "main":
      (folder / "refs").mkdir(exist_ok=True)
      (folder / "refs" / "main").write_text(commit)
  return cache


@pytest.fixture
def hub(hf_cache, monkeypatch):
  """`hf_hub_download` served from `hf_cache`; records the calls."""
  calls = []

  def fake(repo_id, filename, *, repo_type=None, revision=None, **kw):
    assert repo_type == "dataset" and not kw
    calls.append((repo_id, filename, revision))
    folder = hf_cache / f"datasets--{repo_id.replace('/', '--')}"
    if revision == "main":
      revision = (folder / "refs" / "main").read_text()
    path = folder / "snapshots" / revision / filename
    if not path.is_file():
      raise huggingface_hub.errors.LocalEntryNotFoundError(
          "An error happened while trying to locate the file on the Hub and "
          "we cannot find the requested files in the local cache.")
    return str(path)

  monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
  return calls


def _config(**kw):
  c = ml_collections.ConfigDict(dict(datasets=("gsm8k", "hotpotqa", "math"),
                                     hotpotqa_train=10000, hotpotqa_dev=500,
                                     seed=0, overwrite=False))
  c.update(kw)
  return c


def test_upstream_files_come_back_byte_for_byte(hub, tmp_path):
  prepare.prepare(("gsm8k", "hotpotqa"), tmp_path, _config())
  data = _data_dir()
  for rel in ("gsm8k/train.jsonl", "gsm8k/test.jsonl",
              "hotpotqa/dev_distractor_500.jsonl",
              "hotpotqa/hotpotqa_train.json",
              "hotpotqa/hotpotqa_train_corpus.json"):
    assert (tmp_path / rel).read_bytes() == (data / rel).read_bytes(), rel


def _tasks(name, split, data_dir):
  return [(t, t.metadata) for t in
          datasets.load_tasks(name, split, data_dir=str(data_dir))]


def test_math_files_convert_to_the_same_tasks(hub, tmp_path):
  prepare.prepare(("math",), tmp_path, _config())
  data = _data_dir()
  for name, split in (("math", "train"), ("math", "test"), ("aime", "2024"),
                      ("aime", "2025")):
    assert _tasks(name, split, tmp_path) == _tasks(name, split, data), name
  # math-ai/aime25 holds what the project's copy was made from.
  assert (pq.read_table(tmp_path / "math/aime25.parquet").to_pylist() ==
          pq.read_table(data / "math/aime25.parquet").to_pylist())
  amc = datasets.load_tasks("amc23", data_dir=str(tmp_path))
  assert [(t.id, t.question, t.answer) for t in amc] == [
      ("amc23/test/1", "What is 1 + 1?", "2"),
      ("amc23/test/2", "What is 2 + 2?", "4"),
      ("amc23/test/3", "What is 3 + 3?", "6"),
      ("amc23/test/4", "What is 1/2 + 1/4?", "0.75")]


def test_wiki_corpus_is_fetched_and_indexed_once(hub, tmp_path, monkeypatch):
  """hotpotqa_wiki: BEIR's corpus as {title, text} rows, its BM25 index
  beside it; the search tool over 'hotpotqa:wiki' loads that index."""
  prepare.prepare(("hotpotqa_wiki",), tmp_path, _config())
  rows = datasets.read_rows(tmp_path / "hotpotqa/wiki_abstracts.jsonl")
  train = json.loads((_data_dir() / "hotpotqa/hotpotqa_train_corpus.json")
                     .read_text())
  assert rows == [{"title": t, "text": "".join(v)} for t, v in train.items()]
  index = tmp_path / "hotpotqa/wiki_abstracts.bm25"
  assert len(list(index.glob("bm25_*/params.index.json"))) == 1
  monkeypatch.setattr(search, "_MEMORY_CACHE", {})
  monkeypatch.setattr(search, "_build", lambda p: pytest.fail("rebuilt"))
  tools = registry.build_tools(("search",), search_corpus="hotpotqa:wiki",
                               data_dir=str(tmp_path), cache_dir=None)
  title = next(iter(train))
  assert tools["search"]([title])[0].startswith(f"{title} -> [1] {title}:")
  prepare.prepare(("hotpotqa_wiki",), tmp_path, _config())  # Current.
  assert len(hub) == 1


def test_math_train_in_the_simplerl_zoo_columns(tmp_path):
  """Question and level as columns, the prompt templated: same tasks."""
  data = _data_dir()
  rows = datasets.read_rows(data / "math/math_train_l3to5.parquet")[:50]
  zoo = [{"question": r["extra_info"]["question"],
          "gt_answer": r["gt_answer"], "subject": r["subject"],
          "level": f"Level {r['extra_info']['level']}",
          "prompt": [{"role": "user", "content":
                      "<|im_start|>user\n" + r["extra_info"]["question"]}]}
         for r in rows]
  _write_parquet(tmp_path / "zoo.parquet", zoo)
  out = prepare._math_train([tmp_path / "zoo.parquet"], _config())
  (tmp_path / "d" / "math").mkdir(parents=True)
  data_bytes, n = out["math/math_train_l3to5.parquet"]
  (tmp_path / "d/math/math_train_l3to5.parquet").write_bytes(data_bytes)
  assert n == 50
  assert _tasks("math", "train", tmp_path / "d") == _tasks(
      "math", "train", data)[:50]


def test_hotpotqa_samples_are_seeded_and_in_file_order(hub, tmp_path):
  prepare.prepare(("hotpotqa",), tmp_path,
                  _config(hotpotqa_dev=7, hotpotqa_train=3, seed=5))
  data = _data_dir()
  dev = datasets.read_rows(data / "hotpotqa/dev_distractor_500.jsonl")
  want = [dev[i] for i in sorted(random.Random(5).sample(range(500), 7))]
  assert datasets.read_rows(
      tmp_path / "hotpotqa/dev_distractor_500.jsonl") == want
  train = datasets.read_rows(tmp_path / "hotpotqa/hotpotqa_train.json")
  corpus = json.loads((tmp_path / "hotpotqa/hotpotqa_train_corpus.json")
                      .read_text())
  assert len(train) == 3
  assert sorted(corpus) == sorted({t for r in train for t, _ in r["context"]})


def test_manifest_records_sources_and_reruns_fetch_nothing(hub, tmp_path):
  c = _config(datasets=("gsm8k", "math"))
  prepare.run(c, str(tmp_path))
  manifest = json.loads((tmp_path / "manifest.json").read_text())
  assert sorted(manifest) == [
      "gsm8k/test.jsonl", "gsm8k/train.jsonl", "math/aime24.parquet",
      "math/aime25.parquet", "math/amc23.parquet", "math/math500.parquet",
      "math/math_train_l3to5.parquet"]
  train = manifest["gsm8k/train.jsonl"]
  src = hub[0]
  assert src == ("openai/gsm8k", "main/train-00000-of-00001.parquet",
                 "740312add88f781978c0658806c59bc2815b9866")
  assert train["repo"] == "openai/gsm8k"
  assert train["revision"] == train["commit"] == src[2]
  assert train["rows"] == 7473 and train["selection"] == "all rows"
  assert train["sha256"] == prepare._file_sha256(tmp_path / "gsm8k/train.jsonl")
  assert list(train["source_files"]) == ["main/train-00000-of-00001.parquet"]
  zoo = manifest["math/math_train_l3to5.parquet"]
  assert (zoo["revision"], zoo["commit"]) == ("main", MAIN_COMMIT)
  assert len(hub) == 7
  prepare.run(c, str(tmp_path))  # Everything current: no download.
  assert len(hub) == 7
  (tmp_path / "gsm8k/test.jsonl").write_text("{}\n")  # Changed on disk.
  prepare.run(c, str(tmp_path))
  assert hub[7:] == [("openai/gsm8k", "main/test-00000-of-00001.parquet",
                      src[2])]
  assert (tmp_path / "gsm8k/test.jsonl").read_bytes() == (
      _data_dir() / "gsm8k/test.jsonl").read_bytes()


def test_download_failure_is_one_line(hub, tmp_path, monkeypatch):
  monkeypatch.setitem(prepare.SOURCES, "gsm8k", prepare.Source(
      "openai/gsm8k", "f" * 40))
  with pytest.raises(prepare.DownloadError) as e:
    prepare.prepare(("gsm8k",), tmp_path, _config())
  assert str(e.value) == (
      f"openai/gsm8k@{'f' * 40}: main/train-00000-of-00001.parquet: download "
      "failed (An error happened while trying to locate the file on the Hub "
      "and we cannot find the requested files in the local cache.); check "
      "the connection to huggingface.co, or run with HF_HUB_OFFLINE=1 to use "
      "files already in the Hugging Face cache")
  assert not (tmp_path / "manifest.json").exists()


def test_default_data_dir_env_then_per_user_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
  monkeypatch.delenv("SWIRL_JAX_DATA", raising=False)
  home = tmp_path / "home" / ".cache" / "swirl_jax" / "data"
  assert paths.user_data_dir() == paths.data_job_dir() == str(home)
  assert paths.default_data_dir() == ""  # Not made yet: no data.
  home.mkdir(parents=True)
  assert paths.default_data_dir() == str(home)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  xdg = str(tmp_path / "xdg" / "swirl_jax" / "data")
  assert paths.user_data_dir() == paths.data_job_dir() == xdg
  monkeypatch.setenv("SWIRL_JAX_DATA", str(tmp_path / "mine"))
  assert paths.default_data_dir() == paths.data_job_dir() == str(
      tmp_path / "mine")


def test_missing_data_names_the_command(tmp_path, monkeypatch):
  with pytest.raises(FileNotFoundError) as e:
    datasets.load_tasks("gsm8k", "train", data_dir=str(tmp_path))
  assert str(e.value) == (
      f"gsm8k split 'train': missing file {tmp_path}/gsm8k/train.jsonl; "
      "fetch it with: python -m swirl_jax.main "
      f"--config=configs/data.py:datasets=gsm8k --workdir={tmp_path}")
  with pytest.raises(FileNotFoundError) as e:
    datasets.load_tasks("aime24", data_dir=str(tmp_path))
  assert str(e.value).endswith("datasets=math "
                               f"--workdir={tmp_path}")
  monkeypatch.setattr(paths, "default_data_dir", lambda: "")
  with pytest.raises(FileNotFoundError) as e:
    datasets.load_tasks("hotpotqa", "train")
  # No --workdir: the data job's default is where runs look.
  assert str(e.value) == (
      "hotpotqa split 'train': no data directory (expected "
      "hotpotqa/hotpotqa_train.json under $SWIRL_JAX_DATA or "
      f"{paths.user_data_dir()}); fetch it with: python -m "
      "swirl_jax.main --config=configs/data.py:datasets=hotpotqa")
  assert "\n" not in str(e.value)


def test_data_job_from_the_command_line(hf_cache, tmp_path):
  """The real `huggingface_hub` resolves the pinned revisions from its cache
  (offline), and `main` runs the job."""
  env = dict(os.environ, HF_HUB_CACHE=str(hf_cache), HF_HUB_OFFLINE="1",
             PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  out = tmp_path / "data"
  proc = subprocess.run(
      [sys.executable, "-m", "swirl_jax.main",
       "--config=configs/data.py:datasets=gsm8k,math", f"--workdir={out}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (out / "gsm8k/train.jsonl").read_bytes() == (
      _data_dir() / "gsm8k/train.jsonl").read_bytes()
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["math/math_train_l3to5.parquet"]["commit"] == MAIN_COMMIT
  assert len(datasets.load_tasks("aime25", data_dir=str(out))) == 30
