"""One SimpleTIR iteration's batch: rewards -> advantages -> filters -> rows.

Pure host code over trajectories, so every rule is unit-testable: GRPO
advantages over each prompt's G samples, void trajectories (and overlong
ones) kept in the group statistics but out of the loss, groups with zero
reward variance or mean accuracy outside the band dropped.

On many hosts each host passes its own block of the iteration's rows
(`distributed.host_block`, equal blocks) and keeps them: group statistics
take every host's rewards and flags (small arrays, `distributed.gather`),
stats are each host's as one (`distributed.mean_over_hosts`) and
`make_batch` builds the global batch from each host's rows. These are
collectives then: every host calls them, in the same order.
"""

import dataclasses
from typing import Sequence

import numpy as np

from swirl_jax import config_lib, distributed
from swirl_jax.ops import advantages as adv_lib
from swirl_jax.rollout import batching, turns
from swirl_jax.rollout.records import Trajectory
from swirl_jax.simpletir import oversample
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


def _flags(trajs: Sequence[Trajectory], g: GroupConfig):
  """(rewards, rows in the loss, void flags) of every host's rows, and
  the slice of them that is this host's `trajs`."""
  in_loss, void = void_lib.loss_rows(trajs, filter_void=g.filter_void,
                                     mask_overlong=g.mask_overlong)
  rows = distributed.gather(dict(
      reward=np.array([t.reward or 0.0 for t in trajs], np.float32),
      in_loss=in_loss, void=void))
  mine = distributed.host_block(len(rows["reward"]))
  return rows["reward"], rows["in_loss"], rows["void"], mine


def select_rows(trajs: Sequence[Trajectory], g: GroupConfig,
                want: int = 0):
  """(this host's row indices in the loss, their advantages, stats dict of
  every host's rows). With `want`, the passing groups after the first
  `want` stay out of the loss (oversampling on several hosts, where every
  drawn group runs and each host keeps its rows)."""
  rewards, in_loss, void, mine = _flags(trajs, g)
  if want:
    in_loss = in_loss & ~oversample.surplus(rewards, g, want)
  adv = adv_lib.grpo_advantages(rewards, g.group_size, use_std=g.use_std,
                                loss_row_mask_B=in_loss)
  keep = in_loss.copy()
  if g.drop_zero_variance:
    keep &= adv_lib.nonzero_variance_filter(rewards, g.group_size)
  if g.accuracy_band:
    lo, hi = g.accuracy_band
    keep &= adv_lib.accuracy_band_filter(rewards, g.group_size, lo=lo, hi=hi)
  local = {**turns.response_stats(trajs, "simpletir"),
           **void_lib.token_stats(trajs, void[mine]),
           **void_lib.tool_stats(trajs)}
  stats = {**distributed.mean_over_hosts(
      local, mins=[k for k in local if k.startswith("min_")]),
           "reward": float(rewards.mean()),
           "rows_in_loss": float(keep.sum()),
           "groups_kept": float(len(set(np.flatnonzero(keep)
                                        // g.group_size)))}
  rows = np.flatnonzero(keep[mine])
  return rows, adv[mine][rows], stats


def void_rows(trajs: Sequence[Trajectory], g: GroupConfig):
  """(this host's void row indices, their GRPO advantages): the rows the
  void filter takes out, with the advantages they would have had in the
  loss."""
  rewards, _, void, mine = _flags(trajs, g)
  # Same group statistics (void rows always count in them), unmasked.
  adv = adv_lib.grpo_advantages(rewards, g.group_size, use_std=g.use_std)
  rows = np.flatnonzero(void[mine])
  return rows, adv[mine][rows]


def make_batch(trajs: Sequence[Trajectory], rows, advantages, *,
               mini_batch_size: int, max_len: int | None = None):
  """The batch of every host's `rows` of its `trajs`, end to end by host."""
  seqs = [trajs[i].token_sequence() for i in rows]
  return batching.collate_over_hosts(
      seqs, advantages, row_multiple=mini_batch_size,
      min_rows=mini_batch_size, max_len=max_len)
