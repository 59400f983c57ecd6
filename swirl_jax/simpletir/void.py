"""Void turns (SimpleTIR, arXiv 2509.02479): neither a complete code block
nor a final answer.

A trajectory with one void turn is masked out of the policy loss whole, yet
keeps its place in its GRPO group's reward statistics.
"""

from typing import Sequence

import numpy as np

from swirl_jax.rollout.records import Trajectory
from swirl_jax.tools import parsing


def is_void_turn(text: str) -> bool:
  return parsing.is_void(text, "simpletir")


def has_void_turn(traj: Trajectory) -> bool:
  """Re-parses each turn, so records written elsewhere are judged alike."""
  return any(is_void_turn(t.text) for t in traj.turns)


def loss_rows(trajs: Sequence[Trajectory], *, filter_void: bool,
              mask_overlong: bool) -> tuple[np.ndarray, np.ndarray]:
  """(rows that enter the loss, void flags), both bool [B]."""
  void = np.array([has_void_turn(t) for t in trajs], bool)
  keep = np.ones(len(trajs), bool)
  if filter_void:
    keep &= ~void
  if mask_overlong:
    keep &= ~np.array([bool(t.meta.get("overlong")) for t in trajs], bool)
  return keep, void


# SimpleTIR's account of the gradient blow-up: void turns carry tokens the
# policy gave almost no probability, whose log-prob gradients are large.
LOW_P = 1e-3


def token_stats(trajs: Sequence[Trajectory], void_B) -> dict[str, float]:
  """Over the sampler's action log-probs, void vs non-void trajectories:
  `low_p_share_*` (tokens with p < LOW_P) and `min_logp_*`. A side with no
  recorded log-prob has no entry (trajectories without them are skipped).
  """
  out = {}
  for name, want in (("void", True), ("nonvoid", False)):
    lp = [np.asarray(t.action_logprobs, np.float64)
          for tr, v in zip(trajs, void_B) if bool(v) == want
          for t in tr.turns if t.action_logprobs]
    lp = np.concatenate(lp) if lp else np.zeros(0)
    if lp.size:
      out[f"low_p_share_{name}"] = float(np.mean(lp < np.log(LOW_P)))
      out[f"min_logp_{name}"] = float(lp.min())
  return out


def tool_stats(trajs: Sequence[Trajectory]) -> dict[str, float]:
  """`tool_call_rate` (turns that call a tool), `tool_calls` and
  `single_turn_rate` per trajectory: a collapse to answering in one turn
  without code shows here before it shows in the reward."""
  turns = [t for tr in trajs for t in tr.turns]
  calls = sum(t.tool is not None for t in turns)
  n = max(1, len(trajs))
  return {"tool_call_rate": calls / max(1, len(turns)),
          "tool_calls": calls / n,
          "single_turn_rate": sum(len(tr.turns) == 1 for tr in trajs) / n}
