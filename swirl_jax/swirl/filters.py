"""SWiRL data filters over judged step units.

Strategies (the paper's four): 'none', 'process' (the judge called the steps
GOOD), 'outcome' (the trajectory's final answer is correct) and
'process_outcome' (both). Process-only works best in the paper; its best
set keeps wrong-answer trajectories whose steps were reasonable.

Granularity of the process test:
  'trajectory' (default) keeps every unit of a trajectory whose every step
      is GOOD, and none of the others. The paper's Figure 1 reads: "process
      filtering keeps trajectories whose every step is judged reasonable",
      and its filter diagram asks "every step reasonable?" per trajectory.
  'step' keeps each GOOD unit on its own, dropping only the BAD ones (the
      per-step reading of the method: a decision is judged at its state).
The outcome test is per trajectory by nature: all its units share it.
"""

import collections
from typing import Any, Sequence

from swirl_jax import errors
from swirl_jax.rollout.records import StepUnit

STRATEGIES = ("none", "process", "outcome", "process_outcome")
GRANULARITIES = ("trajectory", "step")


def _require(units: Sequence[StepUnit], field: str) -> None:
  for u in units:
    if getattr(u, field) is None:
      raise ValueError(f"step {u.trajectory_id}#{u.step_index} has no "
                       f"{field!r} label; run the judge / checker first")


def _keep_mask(units, strategy: str, granularity: str) -> list[bool]:
  keep = [True] * len(units)
  if strategy in ("process", "process_outcome"):
    _require(units, "process_good")
    if granularity == "step":
      keep = [k and u.process_good for k, u in zip(keep, units)]
    else:
      all_good = collections.defaultdict(lambda: True)
      for u in units:
        all_good[u.trajectory_id] &= bool(u.process_good)
      keep = [k and all_good[u.trajectory_id] for k, u in zip(keep, units)]
  if strategy in ("outcome", "process_outcome"):
    _require(units, "outcome")
    keep = [k and u.outcome for k, u in zip(keep, units)]
  return keep


def filter_units(units: Sequence[StepUnit], strategy: str = "process",
                 granularity: str = "trajectory",
                 ) -> tuple[list[StepUnit], dict[str, Any]]:
  """(kept units in input order, report of what each stage kept)."""
  if strategy not in STRATEGIES:
    raise ValueError(f"filter strategy {strategy!r}; valid: {STRATEGIES}")
  if granularity not in GRANULARITIES:
    raise ValueError(f"filter granularity {granularity!r}; valid: "
                     f"{GRANULARITIES}")
  keep = _keep_mask(units, strategy, granularity)
  kept = [u for u, k in zip(units, keep) if k]
  return kept, _report(units, keep, strategy, granularity)


def _report(units, keep, strategy, granularity) -> dict[str, Any]:
  steps = collections.Counter(u.trajectory_id for u in units)
  kept_steps = collections.Counter(
      u.trajectory_id for u, k in zip(units, keep) if k)
  outcome = {u.trajectory_id: u.outcome for u in units}
  good = sum(1 for u in units if u.process_good)
  return dict(
      strategy=strategy, granularity=granularity,
      steps_in=len(units), steps_kept=sum(keep),
      steps_judged_good=good,
      trajectories_in=len(steps),
      trajectories_kept=len(kept_steps),  # At least one unit kept.
      trajectories_kept_whole=sum(
          1 for t, n in kept_steps.items() if n == steps[t]),
      # The paper's point: process filtering keeps some wrong answers.
      trajectories_kept_wrong=sum(
          1 for t in kept_steps if outcome[t] is False),
  )


class NothingKept(errors.UserError, ValueError):
  """A filter kept no step: stage 2 and SFT have nothing to train on."""


def nothing_kept(path: str, strategy: str, report: dict | None,
                 judge: str, samples: int) -> NothingKept:
  """The one-line error for a filter that kept no step: why (the judge's
  GOOD rate, stage 1's accuracy) and the knobs that change it."""
  why = ""
  if report and report.get("steps_in"):
    n, good = report["steps_in"], report.get("steps_judged_good", 0)
    why = (f": the {judge} judge called {good} of {n} steps GOOD "
           f"(GOOD rate {good / n:.3f})")
    if strategy in ("outcome", "process_outcome"):
      why += (f", {report.get('trajectories_kept', 0)} of "
              f"{report.get('trajectories_in', 0)} trajectories kept")
  return NothingKept(
      f"{path}: the {strategy!r} filter kept no step{why}; try "
      "--config.filter.strategy=none, another judge (--config.judge.kind, "
      "--config.judge.threshold) or more stage 1 samples "
      f"(--config.stage1.samples, now {samples})")
