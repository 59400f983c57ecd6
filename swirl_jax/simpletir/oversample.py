"""SimpleTIR oversampling: more prompts drawn than an iteration needs, and
groups taken as they complete.

An iteration draws ceil(prompts_per_step * oversample) prompts (SimpleTIR's
`oversample_multiplier`) and runs their G samples each through the rollout
engine. It keeps, in draw order, every group up to and including the
`prompts_per_step`-th one that passes the group filters (nonzero reward
variance, accuracy band): `kept_groups`, on every host count the same
groups, which the iteration's statistics, rollouts file and loss all
read. The failing groups among them stay for the statistics; the filters
drop them from the loss.

A host that runs every drawn pair (one host) scores each group (one
prompt's G samples) the moment its last sample ends; once
`prompts_per_step` complete groups pass, the engine starts no further
pair, and groups cut short by the stop are not used. Admission is in draw
order, so every group before the last one admitted whole completes: the
kept groups are all there. Several hosts run every drawn group, each its
block of the pairs (stopping early would need the hosts to agree on each
group as it ends).
"""

import math

import numpy as np

from swirl_jax import distributed
from swirl_jax.ops import advantages as adv_lib
from swirl_jax.tasks import checkers


def prompts_drawn(per_step: int, oversample: float) -> int:
  """Prompts an iteration draws; `oversample` < 1 is a config error."""
  if not oversample >= 1.0:
    raise ValueError(f"oversample must be >= 1 (got {oversample})")
  return math.ceil(per_step * oversample - 1e-9)


class BandGroups:
  """`stop_admitting` for `RolloutEngine.run_pairs`: scores each group as
  it completes; True once `want` complete groups pass the filters."""

  def __init__(self, tasks, group_size: int, groups_config, want: int):
    self.tasks = {t.id: t for t in tasks}
    self.G, self.g, self.want = group_size, groups_config, want
    self.open: dict[str, list] = {}
    self.complete, self.passing = 0, 0

  def __call__(self, traj) -> bool:
    group = self.open.setdefault(traj.task_id, [])
    group.append(traj)
    if len(group) == self.G:
      checkers.score_trajectories(group, [self.tasks[traj.task_id]])
      self.complete += 1
      self.passing += bool(self.passes([t.reward or 0.0 for t in group]))
    return self.passing >= self.want

  def passes(self, rewards) -> bool:
    return passes(rewards, self.G, self.g)


def passes(rewards, group_size: int, groups_config) -> bool:
  """Whether one group's rewards pass the group filters."""
  r = np.asarray(rewards, np.float64)
  keep = np.ones(len(r), bool)
  if groups_config.drop_zero_variance:
    keep &= adv_lib.nonzero_variance_filter(r, group_size)
  if groups_config.accuracy_band:
    lo, hi = groups_config.accuracy_band
    keep &= adv_lib.accuracy_band_filter(r, group_size, lo=lo, hi=hi)
  return bool(keep.all())


def kept_groups(rewards, groups_config, want: int) -> np.ndarray:
  """Row flags (rows in groups of G, in draw order): every group up to and
  including the `want`-th that passes the filters (all of them when fewer
  pass)."""
  G = groups_config.group_size
  keep, passed = np.zeros(len(rewards), bool), 0
  for i in range(0, len(rewards), G):
    if passed >= want:
      break
    keep[i:i + G] = True
    passed += passes(rewards[i:i + G], G, groups_config)
  return keep


def complete_groups(trajs, group_size: int):
  """The trajectories of groups with all `group_size` samples, in order
  (the engine returns a group's samples together, in pair order)."""
  count: dict[str, int] = {}
  for t in trajs:
    count[t.task_id] = count.get(t.task_id, 0) + 1
  return [t for t in trajs if count[t.task_id] == group_size]


def rollout(engine, batch_tasks, groups_config, want: int, policy=None):
  """This host's trajectories of the iteration (its `host_block` of the
  (task, sample) pairs, G per prompt, in order), each scored once by its
  checker. A host that runs every pair, with more prompts drawn than
  `want`, stops admitting once `want` complete groups pass the filters and
  returns the complete groups. `policy`: `RolloutEngine.run_pairs`'s. No
  exchange between hosts."""
  G = groups_config.group_size
  pairs = [(t, k) for t in batch_tasks for k in range(G)]
  mine = pairs[distributed.host_block(len(pairs))]
  if len(mine) < len(pairs) or len(batch_tasks) <= want:
    trajs = engine.run_pairs(mine, policy=policy)
    checkers.score_trajectories(trajs, batch_tasks)
    return trajs
  stop = BandGroups(batch_tasks, G, groups_config, want)
  return complete_groups(
      engine.run_pairs(mine, stop_admitting=stop, policy=policy), G)
