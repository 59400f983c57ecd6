"""Task loaders on the real files, the registry, and synthetic tasks."""

import contextlib
import io
import pathlib

import pytest

from swirl_jax import paths
from swirl_jax.tasks import checkers
from swirl_jax.tasks import datasets
from swirl_jax.tasks import records
from swirl_jax.tasks import synthetic
from swirl_jax.tools import calculator
from swirl_jax.tools import parsing
from swirl_jax.tools import registry
from swirl_jax.tools import search


@pytest.fixture(scope="module")
def data_dir():
  d = paths.default_data_dir()
  if not d or not (pathlib.Path(d) / "gsm8k" / "test.jsonl").is_file():
    pytest.skip("data directory not found")
  return d


@pytest.mark.parametrize("name,split,rows", [
    ("gsm8k", "train", 7473), ("gsm8k", "test", 1319),
    ("hotpotqa", "dev", 500), ("hotpotqa", "train", 100),
    ("musique", "train", 100), ("math", "train", 8523),
    ("math500", None, 500), ("aime24", None, 30), ("aime25", None, 30),
])
def test_row_counts(data_dir, name, split, rows):
  tasks = datasets.load_tasks(name, split, data_dir=data_dir)
  assert len(tasks) == rows
  assert len({t.id for t in tasks}) == rows
  assert all(t.question.strip() for t in tasks)
  # Upstream MATH train has two problems with an empty answer (kept).
  assert sum(not t.answer.strip() for t in tasks) <= (2 if name == "math"
                                                      else 0)


def test_gold_answers_parsed(data_dir):
  gsm = datasets.load_tasks("gsm8k", "train", data_dir=data_dir, limit=3)
  assert [t.answer for t in gsm] == ["72", "10", "5"]
  assert gsm[0].question.startswith("Natalia sold clips")
  assert "<<48/2=24>>" in gsm[0].metadata["solution"]
  big = [t for t in datasets.load_tasks("gsm8k", "test", data_dir=data_dir)
         if "," in t.metadata["solution"].split("\n")[-1]]
  assert all("," not in t.answer for t in big)

  hot = datasets.load_tasks("hotpotqa", "dev", data_dir=data_dir, limit=1)[0]
  assert hot.answer == "Chief of Protocol"
  assert ["Shirley Temple", 0] in hot.metadata["supporting_facts"]
  train = datasets.load_tasks("hotpotqa", "train", data_dir=data_dir)[0]
  assert isinstance(train.metadata["context"], list)  # Literal parsed.

  mus = datasets.load_tasks("musique", data_dir=data_dir)[0]
  assert mus.answers == ("G. Stanley Hall", "Stanley Hall")
  assert mus.metadata["question_decomposition"][0]["answer"] == (
      "American Psychological Association")

  m500 = datasets.load_tasks("math500", data_dir=data_dir, limit=1)[0]
  assert m500.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
  assert m500.question.startswith("Convert the point $(0,3)$")
  assert m500.metadata["level"] == 2 and "solution" in m500.metadata
  aime = datasets.load_tasks("aime24", data_dir=data_dir, limit=1)[0]
  assert aime.answer == "204" and aime.source == "aime"
  math_train = datasets.load_tasks("math", "train", data_dir=data_dir,
                                   limit=1)[0]
  assert math_train.answer == "118" and math_train.metadata["level"] == 5


def test_corpora(data_dir):
  assert len(registry.corpus("hotpotqa:train", data_dir)) == 994
  assert len(registry.corpus("musique", data_dir)) == 1890
  assert registry.corpus("synthetic_multihop:test",
                         corpora=datasets.CORPORA) == search.as_passages(
      synthetic.multihop_corpus(seed=1))


def test_registry_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="gsm8k/test.jsonl"):
    datasets.load_tasks("gsm8k", "test", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="unknown dataset"):
    datasets.load_tasks("nope")
  with pytest.raises(ValueError, match="no split"):
    datasets.load_tasks("gsm8k", "validation", data_dir=str(tmp_path))


def test_tfds_is_optional():
  try:
    # pylint: disable-next=g-import-not-at-top,unused-import
    import tensorflow_datasets
    pytest.skip("tensorflow_datasets is installed")
  except ImportError:
    pass
  with pytest.raises(ImportError, match="tensorflow_datasets"):
    datasets.load_tasks("tfds:gsm8k", "test")


def test_task_json_round_trip():
  task = records.Task("a/1", "q?", ("x", "y"), "hotpotqa", "dev",
                      {"k": [1, 2]})
  again = records.Task.from_json(task.to_json())
  assert again == task and again.metadata == task.metadata
  assert records.Task("b", "q", "only", "gsm8k").answers == ("only",)


# --------------------------------------------------------------- synthetic.


def test_synthetic_deterministic():
  a = synthetic.arithmetic_tasks(20, seed=3)
  assert a == synthetic.arithmetic_tasks(20, seed=3)
  assert [t.metadata for t in a] == [
      t.metadata for t in synthetic.arithmetic_tasks(20, seed=3)]
  assert a != synthetic.arithmetic_tasks(20, seed=4)
  m = synthetic.multihop_tasks(20, seed=3)
  assert m == synthetic.multihop_tasks(20, seed=3)
  assert synthetic.multihop_corpus(3) == synthetic.multihop_corpus(3)
  assert datasets.load_tasks("synthetic_arith", "test", limit=5) == (
      synthetic.arithmetic_tasks(5, seed=1, split="test"))


def test_compute_tasks_need_code_and_splits_are_disjoint():
  """Held-out computations share no question with training or the
  demonstrations, at any size; each answer is what Python computes."""
  splits = {s: synthetic.compute_tasks(300, s)
            for s in ("train", "test", "demo")}
  questions = {s: {t.question for t in ts} for s, ts in splits.items()}
  assert all(len(q) == 300 for q in questions.values())  # Distinct.
  assert not questions["test"] & (questions["train"] | questions["demo"])
  assert not questions["train"] & questions["demo"]
  assert synthetic.compute_tasks(300, "test") == splits["test"]
  assert datasets.load_tasks("synthetic_compute", "test", limit=5) == (
      splits["test"][:5])
  for t in splits["test"][:50]:
    step, = t.metadata["solution_graph"]
    # What Python prints (the sandbox runs the same expression).
    assert str(eval(step["expression"], {})) == t.answer  # pylint: disable=eval-used
    assert 2 <= int(t.answer) < 100 and checkers.check(t, t.answer)
    # No answer is a number of the question: copying one never answers.
    assert t.answer not in t.question.replace("?", "").replace(
        ",", "").split()


def test_arithmetic_solution_graph_is_right():
  tasks = synthetic.arithmetic_tasks(40, seed=0)
  assert {len(t.metadata["solution_graph"]) for t in tasks} == {2, 3, 4}
  for t in tasks:
    values = {}
    for step in t.metadata["solution_graph"]:
      # Each step uses the problem's numbers or earlier steps only.
      for operand in step["operands"]:
        assert (isinstance(operand, int) or operand in t.metadata["quantities"]
                or operand in values)
      got = calculator.evaluate(step["expression"])
      assert got == str(step["value"]), (t.question, step)
      values[f"s{step['step']}"] = step["value"]
    assert t.answer == str(t.metadata["solution_graph"][-1]["value"])
    assert checkers.check(t, t.answer)


def test_reference_trajectories_parse():
  for t in synthetic.arithmetic_tasks(5) + synthetic.multihop_tasks(5):
    turns = synthetic.reference_turns(t)
    for turn in turns[:-1]:
      parsed = parsing.parse_turn(turn["action"], "swirl")
      assert parsed.kind == "call" and turn["observation"]
    final = parsing.parse_turn(turns[-1]["action"], "swirl")
    assert final.kind == "answer" and checkers.check(t, final.answer)
    text = synthetic.reference_trajectory(t)
    assert text.endswith(f"<answer>{t.answer}</answer>")


@pytest.mark.parametrize("spaced", [False, True])
def test_simpletir_reference_trajectories_run_and_answer(spaced):
  """Each step's code prints the step's value; the last turn boxes the
  answer. Divisions are integer divisions, so printed values stay whole."""
  tasks = synthetic.arithmetic_tasks(40)
  assert any(s["op"] == "/" for t in tasks
             for s in t.metadata["solution_graph"])
  for t in tasks:
    turns = synthetic.reference_turns(t, spaced=spaced, fmt="simpletir")
    for turn, step in zip(turns, t.metadata["solution_graph"]):
      parsed = parsing.parse_turn(turn["action"], "simpletir")
      assert parsed.kind == "call" and not parsed.final
      out = io.StringIO()
      with contextlib.redirect_stdout(out):
        exec(parsed.argument, {})  # pylint: disable=exec-used
      assert out.getvalue() == f"{step['value']}\n"
      assert turn["observation"] == (
          f"\nCode execution result: {step['value']}\n\n")
    final = parsing.parse_turn(turns[-1]["action"], "simpletir")
    assert final.kind == "answer" and checkers.check(t, final.answer)
  with pytest.raises(ValueError, match="arithmetic only"):
    synthetic.reference_turns(synthetic.multihop_tasks(1)[0], fmt="simpletir")
  with pytest.raises(ValueError, match="unknown format"):
    synthetic.reference_turns(tasks[0], fmt="xml")


def test_multihop_hops_are_searchable(tmp_path):
  path = tmp_path / "world.jsonl"
  synthetic.write_corpus_jsonl(synthetic.multihop_corpus(0), path)
  tool = search.SearchTool(search.load_corpus(path), k=1)
  tasks = synthetic.multihop_tasks(30, seed=0)
  assert {len(t.metadata["solution_graph"]) for t in tasks} == {2, 3}
  hops = [h for t in tasks for h in t.metadata["solution_graph"]]
  top1 = [tool.search(h["query"])[0].title == h["title"] for h in hops]
  assert (sum(top1), len(top1)) == (74, 74)  # Every hop's paragraph first.
  for t in tasks:  # Each hop's answer is the next hop's entity.
    graph = t.metadata["solution_graph"]
    for a, b in zip(graph, graph[1:]):
      assert a["answer"] == b["entity"] and a["answer"] in a["paragraph"]
    assert graph[-1]["answer"] == t.answer
    assert graph[-1]["answer"] in graph[-1]["paragraph"]


# ------------------------------------------------- faults in input files.


def _copy(data_dir, rel, tmp_path, edit):
  """`rel` of the data dir copied under tmp_path with `edit(bytes)` applied;
  returns (its path, its bytes)."""
  path = tmp_path / rel
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(edit((pathlib.Path(data_dir) / rel).read_bytes()))
  return path, path.read_bytes()


def _fails(path, want, load):
  before = path.read_bytes()
  with pytest.raises(ValueError) as e:
    load()
  assert str(e.value) == f"{path}{want}"
  assert path.read_bytes() == before  # A failed read changes nothing.


def test_truncated_gsm8k_file(data_dir, tmp_path):
  def cut(data):  # The download stopped 40 bytes into the last line.
    return data[:data.rstrip(b"\n").rindex(b"\n") + 1 + 40]
  path, _ = _copy(data_dir, "gsm8k/train.jsonl", tmp_path, cut)
  _fails(path, ":7473: bad JSON (Unterminated string starting at column 14)",
         lambda: datasets.load_tasks("gsm8k", "train", str(tmp_path)))


def test_hotpotqa_file_cut_inside_a_multibyte_character(data_dir, tmp_path):
  data = (pathlib.Path(data_dir) / "hotpotqa/dev_distractor_500.jsonl"
          ).read_bytes()
  start = data.rstrip(b"\n").rindex(b"\n") + 1
  k = next(i for i in range(start, len(data)) if data[i] >= 0xc0)
  path, _ = _copy(data_dir, "hotpotqa/dev_distractor_500.jsonl", tmp_path,
                  lambda d: d[:k + 1])
  _fails(path, f":500: not UTF-8 (byte 0x{data[k]:02x} at column "
         f"{k - start + 1})",
         lambda: datasets.load_tasks("hotpotqa", "dev", str(tmp_path)))


@pytest.mark.parametrize("line,reason", [
    (b'{"question": "q"}', "bad record (missing field 'answer')"),
    (b'{"question": "q", "answer": "42"}',
     "bad record (no '####' in GSM8K solution: '42')"),
    (b'{"question": "caf\xe9", "answer": "#### 1"}',
     "not UTF-8 (byte 0xe9 at column 18)"),
])
def test_bad_gsm8k_line(data_dir, tmp_path, line, reason):
  def replace_line_3(data):
    lines = data.split(b"\n")
    return b"\n".join(lines[:2] + [line] + lines[3:])
  path, _ = _copy(data_dir, "gsm8k/test.jsonl", tmp_path, replace_line_3)
  _fails(path, f":3: {reason}",
         lambda: datasets.load_tasks("gsm8k", "test", str(tmp_path)))


def test_corrupt_parquet(data_dir, tmp_path):
  path, _ = _copy(data_dir, "math/aime24.parquet", tmp_path,
                  lambda d: d[:len(d) // 2])
  _fails(path, ": not a readable parquet file (Parquet magic bytes not found "
         "in footer. Either the file is corrupted or this is not a parquet "
         "file.)", lambda: datasets.load_tasks("aime24", None, str(tmp_path)))


def test_parquet_row_without_its_answer(data_dir, tmp_path):
  import pyarrow  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  rows = pq.read_table(pathlib.Path(data_dir) / "math/aime25.parquet"
                       ).to_pylist()
  rows[1]["reward_model"] = None
  path = tmp_path / "math/aime25.parquet"
  path.parent.mkdir()
  pq.write_table(pyarrow.Table.from_pylist(rows), path)
  _fails(path, ": [1]: bad record ('NoneType' object is not subscriptable)",
         lambda: datasets.load_tasks("aime25", None, str(tmp_path)))


def test_truncated_json_document(data_dir, tmp_path):
  path, _ = _copy(data_dir, "hotpotqa/hotpotqa_train.json", tmp_path,
                  lambda d: b"\n".join(d.split(b"\n")[:6]) + b"\n")
  _fails(path, ":7: bad JSON (Expecting ',' delimiter at column 1)",
         lambda: datasets.load_tasks("hotpotqa", "train", str(tmp_path)))
  path, _ = _copy(data_dir, "hotpotqa/hotpotqa_train_corpus.json", tmp_path,
                  lambda d: d.replace(b"Demon Dice", b"Demon \xffDice", 1))
  _fails(path, ":2: not UTF-8 (byte 0xff)",
         lambda: registry.corpus("hotpotqa:train", str(tmp_path)))
