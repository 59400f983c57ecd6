"""One SimpleTIR iteration's batch: rewards -> advantages -> filters -> rows.

Pure host code over trajectories, so every rule is unit-testable: GRPO
advantages over each prompt's G samples, void trajectories (and overlong
ones) kept in the group statistics but out of the loss, groups with zero
reward variance or mean accuracy outside the band dropped, and rows
sampled by a policy more than `staleness` versions old dropped.

Every host keeps the trajectories it rolled out (any count each). What
the rules and statistics need of them is a few numbers a row (`Rows`:
reward, flags, lengths, counts), which one exchange gives every host
(`figures`, a collective: every host calls it, in the same order); from
there every host computes the same advantages and statistics, equal to
one process holding every row, and `make_batch` builds the global batch
from each host's own rows.
"""

import dataclasses
from typing import NamedTuple, Sequence

import numpy as np

from swirl_jax import config_lib, distributed
from swirl_jax.ops import advantages as adv_lib
from swirl_jax.rollout import batching
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


# A row's figures, in `Rows.table` column order. `version`: the oldest
# policy version that sampled it (-1: not stamped); `lp_*`: count, count
# below log(void.LOW_P) and min of its recorded action log-probs.
FIELDS = ("reward", "in_loss", "void", "overlong", "turn_cap", "turns",
          "response_len", "tool_calls", "lp_n", "lp_low", "lp_min",
          "version")


class Rows(NamedTuple):
  """Every host's rows of an iteration (end to end by host, in draw
  order) as `table` [N, len(FIELDS)] float64, and `mine`, the slice of
  them that is this host's trajectories, in order."""
  table: np.ndarray
  mine: slice

  def col(self, name: str) -> np.ndarray:
    return self.table[:, FIELDS.index(name)]

  @property
  def rewards(self) -> np.ndarray:
    return self.col("reward").astype(np.float32)  # Exact: float32 went in.

  def subset(self, keep: np.ndarray) -> "Rows":
    """The rows flagged in `keep` [N] (this host's: those of its own)."""
    start = int(keep[:self.mine.start].sum())
    return Rows(self.table[keep],
                slice(start, start + int(keep[self.mine].sum())))


def _row(t: Trajectory, in_loss: bool, void: bool) -> list[float]:
  lp = np.concatenate([np.asarray(x.action_logprobs, np.float64)
                       for x in t.turns if x.action_logprobs] or [[]])
  return [t.reward or 0.0, in_loss, void, bool(t.meta.get("overlong")),
          bool(t.meta.get("turn_cap")), len(t.turns),
          sum(len(x.action_ids) for x in t.turns),
          sum(x.tool is not None for x in t.turns), lp.size,
          int(np.sum(lp < np.log(void_lib.LOW_P))),
          lp.min() if lp.size else np.inf, t.meta.get("policy_version", -1)]


def figures(trajs: Sequence[Trajectory], g: GroupConfig) -> Rows:
  """Every host's rows' figures, from each host's own `trajs` (any
  count): one exchange of a few numbers a row."""
  in_loss, void = void_lib.loss_rows(trajs, filter_void=g.filter_void,
                                     mask_overlong=g.mask_overlong)
  mine = np.array([_row(t, *f) for t, f in zip(trajs, zip(in_loss, void))],
                  np.float64).reshape(-1, len(FIELDS))
  return Rows(*distributed.gather_own_rows(mine))


def stale(rows: Rows, iteration: int, staleness: int) -> np.ndarray:
  """Row flags: sampled by a policy more than `staleness` versions older
  than the one iteration `iteration` updates (rows without a version:
  never)."""
  v = rows.col("version")
  return (v >= 0) & (iteration - v > staleness)


def select_rows(rows: Rows, g: GroupConfig, *, iteration: int = 0,
                staleness: int | None = None):
  """(this host's row indices in the loss, their advantages, stats of
  every host's rows). With `staleness`, rows too old for iteration
  `iteration` (`stale`) leave the loss, counted in `stale_rows`; they
  keep their place in the group statistics, as void rows do."""
  rewards = rows.rewards
  in_loss = rows.col("in_loss") > 0
  extra = {}
  if staleness is not None:
    old = stale(rows, iteration, staleness)
    in_loss &= ~old
    v = rows.col("version")
    extra = {"stale_rows": float(old.sum()),
             "policy_lag": float(np.mean(iteration - v[v >= 0]))
                           if (v >= 0).any() else 0.0}
  adv = adv_lib.grpo_advantages(rewards, g.group_size, use_std=g.use_std,
                                loss_row_mask_B=in_loss)
  keep = in_loss.copy()
  if g.drop_zero_variance:
    keep &= adv_lib.nonzero_variance_filter(rewards, g.group_size)
  if g.accuracy_band:
    lo, hi = g.accuracy_band
    keep &= adv_lib.accuracy_band_filter(rewards, g.group_size, lo=lo, hi=hi)
  stats = {**stats_of(rows), **extra,
           "reward": float(rewards.mean()),
           "rows_in_loss": float(keep.sum()),
           "groups_kept": float(len(set(np.flatnonzero(keep)
                                        // g.group_size)))}
  mine = np.flatnonzero(keep[rows.mine])
  return mine, adv[rows.mine][mine], stats


def stats_of(rows: Rows) -> dict[str, float]:
  """The rollout statistics of every row: `turns.response_stats` (as
  SimpleTIR parses void turns), `void.token_stats` and
  `void.tool_stats`, from the figures."""
  n = max(1, len(rows.table))
  share = lambda name: float(np.sum(rows.col(name) > 0)) / n
  turns = rows.col("turns")
  out = {"turns": float(np.mean(turns)) if len(turns) else 0.0,
         "void_rate": share("void"), "turn_cap_rate": share("turn_cap"),
         "overlong_rate": share("overlong"),
         "response_len": float(np.mean(rows.col("response_len")))
                         if len(turns) else 0.0,
         "tool_call_rate": float(rows.col("tool_calls").sum()) / max(
             1.0, float(turns.sum())),
         "tool_calls": float(rows.col("tool_calls").sum()) / n,
         "single_turn_rate": float(np.sum(turns == 1)) / n}
  void = rows.col("void") > 0
  for name, side in (("void", void), ("nonvoid", ~void)):
    count = float(rows.col("lp_n")[side].sum())
    if count:
      out[f"low_p_share_{name}"] = float(rows.col("lp_low")[side].sum()
                                         ) / count
      out[f"min_logp_{name}"] = float(rows.col("lp_min")[side].min())
  return out


def void_rows(rows: Rows, g: GroupConfig):
  """(this host's void row indices, their GRPO advantages): the rows the
  void filter takes out, with the advantages they would have had in the
  loss."""
  # Same group statistics (void rows always count in them), unmasked.
  adv = adv_lib.grpo_advantages(rows.rewards, g.group_size,
                                use_std=g.use_std)
  mine = np.flatnonzero(rows.col("void")[rows.mine] > 0)
  return mine, adv[rows.mine][mine]


def make_batch(trajs: Sequence[Trajectory], rows, advantages, *,
               mini_batch_size: int, max_len: int | None = None):
  """The batch of every host's `rows` of its `trajs`, end to end by host."""
  seqs = [trajs[i].token_sequence() for i in rows]
  return batching.collate_over_hosts(
      seqs, advantages, row_multiple=mini_batch_size,
      min_rows=mini_batch_size, max_len=max_len)
