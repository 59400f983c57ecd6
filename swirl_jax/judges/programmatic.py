"""Exact step labels for synthetic tasks, from their solution graphs."""

import math
from typing import Any, Sequence

from swirl_jax.judges import base
from swirl_jax.tasks import checkers
from swirl_jax.tools import calculator, parsing


def _solution(task) -> dict[str, Any]:
  """The one place that reads `tasks/synthetic.py`'s solution graphs.

  Returns {'kind': 'arith', 'values': every step's value} or
  {'kind': 'multihop', 'hops': [(entity, answer), ...]}.
  """
  graph = task.metadata.get("solution_graph")
  if graph is None:
    raise ValueError(f"task {task.id} has no metadata['solution_graph']")
  if task.source == "synthetic_arith":
    return {"kind": "arith", "values": [float(s["value"]) for s in graph]}
  if task.source == "synthetic_multihop":
    return {"kind": "multihop",
            "hops": [(h["entity"], h["answer"]) for h in graph]}
  raise ValueError(f"no programmatic judge for source {task.source!r}")


def _calculator_value(expression: str) -> float | None:
  """The number the calculator tool would return, or None."""
  try:  # In-process: the walker bounds powers and factorials itself.
    text = calculator.evaluate(expression)
    return float(text.split("≈")[-1])
  except Exception:  # pylint: disable=broad-except
    return None


def _norm(text: str) -> str:
  return " ".join(text.lower().split())


class ProgrammaticJudge(base.Judge):
  """Exact step labels for synthetic tasks, from their solution graphs.

  GOOD (1.0) when the step (parsed in the SWiRL format) is
    arithmetic: a `<math_exp>` whose value is one of the graph's values
        (an intermediate or the final one), or the right `<answer>`;
    multi-hop: a `<search_query>` naming the entity of a hop not yet
        resolved (its answer does not appear in the state), or the right
        `<answer>`.
  Anything else (void or invalid turns, the wrong tool, a wrong answer) is
  BAD (0.0). Tasks are found by `task_ids`, else by their question text
  appearing in the state.
  """

  def __init__(self, tasks: Sequence[Any], threshold: float = 0.5):
    self.tasks = {t.id: t for t in tasks}
    self.threshold = threshold

  def _task(self, state: str, task_id: str | None):
    if task_id is not None and task_id in self.tasks:
      return self.tasks[task_id]
    found = [t for t in self.tasks.values() if t.question in state]
    if not found:
      raise ValueError(f"no task for id {task_id!r} or the state's question")
    return max(found, key=lambda t: len(t.question))

  def score_or_none(self, states, actions, *, task_ids=None) -> list[float]:
    base.check_lengths(states, actions)
    ids = list(task_ids) if task_ids is not None else [None] * len(states)
    return [self.score_one(self._task(s, i), s, a)
            for s, a, i in zip(states, actions, ids)]

  def score_one(self, task, state: str, action: str) -> float:
    turn = parsing.parse_turn(action, "swirl")
    if turn.is_answer:
      return float(checkers.check(task, turn.answer))
    if not turn.is_call:
      return 0.0
    sol = _solution(task)
    if sol["kind"] == "arith" and turn.tool == "calculator":
      v = _calculator_value(turn.argument)
      return float(v is not None and any(
          math.isclose(v, x, rel_tol=1e-9, abs_tol=1e-6)
          for x in sol["values"]))
    if sol["kind"] == "multihop" and turn.tool == "search":
      seen, query = _norm(state), _norm(turn.argument)
      return float(any(_norm(e) in query and _norm(a) not in seen
                       for e, a in sol["hops"]))
    return 0.0
