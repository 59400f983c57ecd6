"""Answer checkers: maths equivalence, GSM8K numbers, QA EM / F1."""

import concurrent.futures
import pathlib

import pytest

from swirl_jax import paths
from swirl_jax.tasks import checkers
from swirl_jax.tasks import datasets
from swirl_jax.tasks.records import Task

MATH_SAME = [
    ("\\frac{1}{2}", "0.5"),
    ("\\frac{1}{2}", "\\frac12"),
    ("\\frac{1}{2}", "\\boxed{1/2}"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
    ("(-\\infty, 2]", "(-\\infty,2]"),
    ("[1, 3)", "[1,3)"),
    ("\\sqrt{2}", "2^{1/2}"),
    ("x^2+2x+1", "(x+1)^2"),
    ("\\text{(C)}", "C"),
    ("3, 5", "5, 3"),
    ("118", "118.0"),
    ("\\text{Monday}", "Monday"),
]
MATH_DIFFERENT = [
    ("\\frac{1}{2}", "0.51"),
    ("[1, 3)", "(1, 3)"),
    ("(-\\infty, 2]", "(-\\infty, 2)"),
    ("118", "117"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi)"),
    ("\\sqrt{2}", "2"),
    ("\\text{Monday}", "Tuesday"),
]


@pytest.mark.parametrize("gold,pred", MATH_SAME)
def test_math_equal(gold, pred):
  assert checkers.math_equal(gold, pred)


@pytest.mark.parametrize("gold,pred", MATH_DIFFERENT)
def test_math_near_misses(gold, pred):
  assert not checkers.math_equal(gold, pred)


def test_math_equal_empty():
  assert not checkers.math_equal("1", None)
  assert not checkers.math_equal("1", "  ")


def test_math_equal_from_threads():
  # math-verify's alarm-based timeout only works in the main thread; from
  # other threads the check runs in a worker process.
  pairs = MATH_SAME[:3] + MATH_DIFFERENT[:2]
  with concurrent.futures.ThreadPoolExecutor(2) as ex:
    got = list(ex.map(lambda p: checkers.math_equal(*p), pairs))
  assert got == [True] * 3 + [False] * 2


def test_math500_golds_match_reformatted():
  d = paths.default_data_dir()
  if not d or not (pathlib.Path(d) / "math" / "math500.parquet").is_file():
    pytest.skip("MATH500 not found")
  tasks = datasets.load_tasks("math500", data_dir=d, limit=40)
  # Each gold is equal to itself boxed inside a sentence, ...
  assert all(checkers.check(t, f"The answer is \\boxed{{{t.answer}}}.")
             for t in tasks)
  # ... and not to the gold of a different problem.
  wrong = [checkers.check(a, b.answer) for a, b in zip(tasks, tasks[1:])
           if checkers.normalize_answer(a.answer)
           != checkers.normalize_answer(b.answer)]
  assert sum(wrong) <= 1  # Distinct golds may still be equal values.
  # Batched in worker processes: the same verdicts.
  preds = [f"\\boxed{{{t.answer}}}" for t in tasks[:8]] + ["0.123456"] * 2
  assert checkers.check_batch(tasks[:10], preds) == [True] * 8 + [False] * 2


# Answers to a gold of 18, the same value or not.
_AS_18 = ("18", "$18", "18 dollars", "The answer is 18.", "#### 18",
          "\\boxed{18}")
_NOT_18 = ("17", "18.5", "no idea", None)


@pytest.mark.parametrize("gold,pred,same", [
    *(("18", pred, True) for pred in _AS_18),
    ("1000", "1,000", True), ("0.5", "1/2", True), ("-3", "-3.0", True),
    *(("18", pred, False) for pred in _NOT_18),
])
def test_numeric_equal(gold, pred, same):
  assert checkers.numeric_equal(gold, pred) == same


def test_qa_metrics():
  assert checkers.normalize_answer("The  Chief of Protocol!") == (
      "chief of protocol")
  assert checkers.exact_match("Chief of Protocol", "the chief of protocol.")
  assert not checkers.exact_match("Chief of Protocol", "Chief")
  assert checkers.f1_score("Chief of Protocol", "Chief of Protocol") == 1.0
  assert checkers.f1_score("Chief of Protocol", "chief") == pytest.approx(0.5)
  assert checkers.f1_score("yes", "yes indeed") == 0.0  # HotPotQA rule.
  assert checkers.f1_score("a", "b") == 0.0
  assert checkers.qa_f1(["G. Stanley Hall", "Stanley Hall"], "Hall") == (
      pytest.approx(2 / 3))


def test_check_dispatch():
  gsm = Task("g", "q", ("72",), "gsm8k")
  assert checkers.check(gsm, "$72") and not checkers.check(gsm, "71")
  qa = Task("m", "q", ("G. Stanley Hall", "Stanley Hall"), "musique")
  assert checkers.check(qa, "stanley hall")
  assert checkers.score(qa, "Hall") == {"correct": 0.0,
                                        "f1": pytest.approx(2 / 3)}
  maths = Task("x", "q", ("\\frac{1}{2}",), "math")
  assert checkers.check(maths, "0.5") and not checkers.check(maths, None)
  assert checkers.score(maths, "0.5") == {"correct": 1.0, "f1": 1.0}
  with pytest.raises(ValueError, match="no answer checker"):
    checkers.check(Task("z", "q", ("1",), "unknown"), "1")
