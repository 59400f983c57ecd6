"""Demonstrations that err at known rates (tasks/demonstrations.py)."""

import collections

import pytest

from swirl_jax.judges.programmatic import ProgrammaticJudge
from swirl_jax.tasks import checkers
from swirl_jax.tasks import demonstrations as demos
from swirl_jax.tasks import synthetic
from swirl_jax.tools import parsing


def test_styles_follow_the_mix_and_the_seed():
  tasks = synthetic.compute_tasks(2000, "demo")
  mix = dict(tool=0.5, direct=0.25, bad_code=0.1, void=0.15)
  got = demos.styles(tasks, mix, "simpletir", seed=0)
  assert got == demos.styles(tasks, mix, "simpletir", seed=0)
  assert got != demos.styles(tasks, mix, "simpletir", seed=1)
  share = {k: v / len(tasks) for k, v in collections.Counter(got).items()}
  for style, weight in mix.items():
    assert share[style] == pytest.approx(weight, abs=0.03)
  with pytest.raises(ValueError, match="styles are gold, operand, skip, slip, detour"):
    demos.styles(tasks, dict(tool=1.0), "swirl", seed=0)


def test_simpletir_styles_err_as_named():
  for task in synthetic.compute_tasks(30, "demo"):
    tool = demos.reference_turns(task, "tool", spaced=True, fmt="simpletir")
    call = parsing.parse_turn(tool[0]["action"], "simpletir")
    assert call.tool == "python"
    assert str(eval(call.argument.strip()[len("print("):-1])) == \
        task.answer  # pylint: disable=eval-used
    direct, = demos.reference_turns(task, "direct", fmt="simpletir")
    answer = parsing.parse_turn(direct["action"], "simpletir")
    assert answer.is_answer and not checkers.check(task, answer.answer)
    void, = demos.reference_turns(task, "void", fmt="simpletir")
    assert parsing.is_void(void["action"], "simpletir")
    bad, guess = demos.reference_turns(task, "bad_code", fmt="simpletir")
    code = parsing.parse_turn(bad["action"], "simpletir").argument
    with pytest.raises(SyntaxError):
      compile(code, "<demo>", "exec")
    assert not checkers.check(
        task, parsing.parse_turn(guess["action"], "simpletir").answer)


def test_swirl_errors_sit_at_the_last_step():
  """The judge calls every step before the last GOOD and the erring one
  BAD, and the answer is wrong."""
  tasks = synthetic.arithmetic_tasks(40, seed=2, split="demo")
  judge = ProgrammaticJudge(tasks)
  wrong_calls = 0
  for task in tasks:
    n = len(task.metadata["solution_graph"])
    for style, steps in (("gold", n + 1), ("operand", n + 1), ("skip", n)):
      turns = demos.reference_turns(task, style, spaced=True, fmt="swirl")
      assert len(turns) == steps
      labels = [judge.score_one(task, task.question, t["action"])
                for t in turns]
      answer = parsing.parse_turn(turns[-1]["action"], "swirl").answer
      if style == "gold":
        assert labels == [1.0] * steps and checkers.check(task, answer)
        continue
      assert labels[:n - 1] == [1.0] * (n - 1), (style, turns)
      assert labels[-1] == 0.0 and not checkers.check(task, answer)
      if style == "operand":  # The wrong calculation is the last call.
        wrong_calls += labels[n - 1] == 0.0
  # A wrong operand can land on another step's value (then it is GOOD).
  assert wrong_calls >= 0.8 * len(tasks)


def test_swirl_slips_and_detours_err_at_any_step():
  """A slip: the steps before it GOOD, it and the rest BAD, the answer
  wrong. A detour: one BAD call among GOOD ones, the answer right. Both
  land on every step of the graph across tasks."""
  tasks = synthetic.arithmetic_tasks(60, seed=3, split="demo")
  judge = ProgrammaticJudge(tasks)
  where = {"slip": collections.Counter(), "detour": collections.Counter()}
  for task in tasks:
    n = len(task.metadata["solution_graph"])
    for style in where:
      turns = demos.reference_turns(task, style, spaced=True, fmt="swirl")
      assert turns == demos.reference_turns(task, style, spaced=True,
                                            fmt="swirl")
      labels = [judge.score_one(task, task.question, t["action"])
                for t in turns]
      right = checkers.check(
          task, parsing.parse_turn(turns[-1]["action"], "swirl").answer)
      bad = [i for i, x in enumerate(labels) if x == 0.0]
      if style == "slip":
        assert len(turns) == n + 1 and not right and labels[-1] == 0.0
        # A wrong number can land on another step's value (then GOOD).
        where[style][bad[0] if bad[0] < n else -1] += 1
      else:
        assert len(turns) == n + 2 and right and labels[-1] == 1.0
        where[style][bad[0] if len(bad) == 1 else -1] += 1
  for style, at in where.items():
    assert {0, 1, 2} <= set(at), (style, at)
    assert at[-1] <= 0.2 * len(tasks), (style, at)
