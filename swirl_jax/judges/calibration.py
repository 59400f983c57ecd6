"""How well a judge agrees with exact step labels (judge calibration).

SWiRL's claim is that a process judge without gold labels filters well. On
the synthetic tasks every step has an exact label (`ProgrammaticJudge`,
from the task's solution graph), so any judge (model, HTTP, programmatic)
can be scored against it:

  report = calibrate(judge, reference, units)

`report` holds the confusion matrix (rows: reference BAD / GOOD; columns:
judge BAD / GOOD), agreement, Cohen's kappa, both GOOD rates, and the same
by step position (`step_index`); over all steps also the AUC of the judge's
P(GOOD) against the labels and its mean P(GOOD) on each side, which show a
judge that ranks steps well but sits on the wrong side of its threshold. A step the judge gave no readable reply
counts as BAD, as the filter counts it, and is counted in `unreadable`.
"""

from typing import Sequence

import numpy as np

from swirl_jax.judges import base
from swirl_jax.rollout.records import StepUnit


def confusion(judge_good, ref_good) -> np.ndarray:
  """[[ref BAD & judge BAD, ref BAD & judge GOOD], [ref GOOD & ..., ...]]."""
  j = np.asarray(judge_good, bool)
  r = np.asarray(ref_good, bool)
  if j.shape != r.shape:
    raise ValueError(f"label counts differ: {j.shape} vs {r.shape}")
  return np.array([[np.sum(~r & ~j), np.sum(~r & j)],
                   [np.sum(r & ~j), np.sum(r & j)]], np.int64)


def cohen_kappa(cm: np.ndarray) -> float | None:
  """(p_o - p_e) / (1 - p_e) of a 2x2 confusion matrix; None when p_e = 1
  (both sides give one and the same label: chance explains everything)."""
  n = cm.sum()
  if n == 0:
    return None
  p_o = np.trace(cm) / n
  p_e = float(np.dot(cm.sum(0), cm.sum(1))) / n ** 2
  if p_e >= 1.0:
    return None
  return float((p_o - p_e) / (1.0 - p_e))


def agreement(judge_good, ref_good) -> dict:
  """Counts, agreement, kappa and the two GOOD rates of one label set."""
  cm = confusion(judge_good, ref_good)
  n = int(cm.sum())
  return dict(
      steps=n, confusion=cm.tolist(),
      agreement=float(np.trace(cm) / n) if n else None,
      kappa=cohen_kappa(cm),
      judge_good_rate=float(cm[:, 1].sum() / n) if n else None,
      ref_good_rate=float(cm[1].sum() / n) if n else None)


def auc(judge_probs, ref_good) -> float | None:
  """P(a reference-GOOD step scores above a reference-BAD one), ties half:
  how well P(GOOD) ranks the steps at any threshold (0.5: chance). None
  without both classes."""
  p = np.asarray(judge_probs, np.float64)
  r = np.asarray(ref_good, bool)
  pos, neg = p[r], p[~r]
  if not len(pos) or not len(neg):
    return None
  diff = pos[:, None] - neg[None, :]
  return float(np.mean((diff > 0) + 0.5 * (diff == 0)))


def report(judge_probs: Sequence[float | None], ref_probs: Sequence[float],
           positions: Sequence[int], *, threshold: float = 0.5,
           ref_threshold: float = 0.5) -> dict:
  """The whole report from P(GOOD) per step (None: no readable reply)."""
  base.check_lengths(judge_probs, ref_probs, positions)
  j = np.array([p is not None and p > threshold for p in judge_probs])
  r = np.asarray(ref_probs, np.float64) > ref_threshold
  pos = np.asarray(positions, np.int64)
  out = agreement(j, r)
  out["unreadable"] = sum(p is None for p in judge_probs)
  read = np.array([p is not None for p in judge_probs], bool)
  probs = np.array([p for p in judge_probs if p is not None], np.float64)
  out["auc"] = auc(probs, r[read])
  for name, side in (("ref_good", r[read]), ("ref_bad", ~r[read])):
    out[f"mean_prob_{name}"] = float(probs[side].mean()) if side.any() \
        else None
  out["by_position"] = {int(k): agreement(j[pos == k], r[pos == k])
                        for k in np.unique(pos)}
  return out


def calibrate(judge: base.Judge, reference: base.Judge,
              units: Sequence[StepUnit], chunk: int = 256) -> dict:
  """`report` of `judge` against `reference` on `units`."""
  if not units:
    raise ValueError("judge calibration: no steps to judge")
  got, ref = [], []
  for i in range(0, len(units), chunk):
    part = units[i:i + chunk]
    args = ([u.state_text for u in part], [u.action_text for u in part])
    ids = [u.task_id for u in part]
    got += judge.score_or_none(*args, task_ids=ids)
    ref += reference.score(*args, task_ids=ids)
    # Over all the steps, after each chunk: a broken judge stops early.
    judge.check_readable(sum(p is None for p in got), len(units))
  return report(got, ref, [u.step_index for u in units],
                threshold=judge.threshold, ref_threshold=reference.threshold)
