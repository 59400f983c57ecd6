"""One SimpleTIR iteration's batch: rewards -> advantages -> filters -> rows.

Pure host code over trajectories, so every rule is unit-testable: GRPO
advantages over each prompt's G samples, void trajectories (and overlong
ones) kept in the group statistics but out of the loss, groups with zero
reward variance or mean accuracy outside the band dropped.
"""

import dataclasses
from typing import Sequence

import numpy as np

from swirl_jax import config_lib
from swirl_jax.ops import advantages as adv_lib
from swirl_jax.rollout import batching, turns
from swirl_jax.rollout.records import Trajectory
from swirl_jax.simpletir import void as void_lib


@dataclasses.dataclass(frozen=True)
class GroupConfig:
  group_size: int = 16
  filter_void: bool = True
  mask_overlong: bool = True
  drop_zero_variance: bool = True
  accuracy_band: tuple[float, float] | None = (0.1, 0.9)
  use_std: bool = True

  @classmethod
  def from_config(cls, c) -> "GroupConfig":
    g = config_lib.from_config(cls, c)
    return g if g.accuracy_band else dataclasses.replace(g, accuracy_band=None)


def _advantages(trajs: Sequence[Trajectory], g: GroupConfig):
  """(rewards, rows in the loss, void flags, advantages of every row)."""
  rewards = np.array([t.reward or 0.0 for t in trajs], np.float32)
  in_loss, void = void_lib.loss_rows(trajs, filter_void=g.filter_void,
                                     mask_overlong=g.mask_overlong)
  adv = adv_lib.grpo_advantages(rewards, g.group_size, use_std=g.use_std,
                                loss_row_mask_B=in_loss)
  return rewards, in_loss, void, adv


def select_rows(trajs: Sequence[Trajectory], g: GroupConfig):
  """(row indices in the loss, their advantages, stats dict)."""
  rewards, in_loss, void, adv = _advantages(trajs, g)
  keep = in_loss.copy()
  if g.drop_zero_variance:
    keep &= adv_lib.nonzero_variance_filter(rewards, g.group_size)
  if g.accuracy_band:
    lo, hi = g.accuracy_band
    keep &= adv_lib.accuracy_band_filter(rewards, g.group_size, lo=lo, hi=hi)
  rows = np.flatnonzero(keep)
  stats = {**turns.response_stats(trajs, "simpletir"),
           "reward": float(rewards.mean()),
           "rows_in_loss": float(len(rows)),
           "groups_kept": float(len(set(rows // g.group_size))),
           **void_lib.token_stats(trajs, void), **void_lib.tool_stats(trajs)}
  return rows, adv[rows], stats


def void_rows(trajs: Sequence[Trajectory], g: GroupConfig):
  """(void row indices, their GRPO advantages): the rows the void filter
  takes out, with the advantages they would have had in the loss."""
  rewards, _, void, _ = _advantages(trajs, g)
  # Same group statistics (void rows always count in them), unmasked.
  adv = adv_lib.grpo_advantages(rewards, g.group_size, use_std=g.use_std)
  rows = np.flatnonzero(void)
  return rows, adv[rows]


def make_batch(trajs: Sequence[Trajectory], rows, advantages, *,
               mini_batch_size: int, max_len: int | None = None):
  seqs = [trajs[i].token_sequence() for i in rows]
  return batching.collate(seqs, advantages, row_multiple=mini_batch_size,
                          min_rows=mini_batch_size, max_len=max_len)
