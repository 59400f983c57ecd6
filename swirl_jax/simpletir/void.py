"""Void turns (METHODS.md): neither a complete code block nor a final answer.

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
