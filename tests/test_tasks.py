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
  assert registry.corpus("synthetic_multihop:test") == search.as_passages(
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
  assert sum(top1) / len(top1) > 0.95
  for t in tasks:  # Each hop's answer is the next hop's entity.
    graph = t.metadata["solution_graph"]
    for a, b in zip(graph, graph[1:]):
      assert a["answer"] == b["entity"] and a["answer"] in a["paragraph"]
    assert graph[-1]["answer"] == t.answer
    assert graph[-1]["answer"] in graph[-1]["paragraph"]
