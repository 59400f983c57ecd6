"""SimpleTIR oversampling: more prompts drawn than an iteration needs, and
groups taken as they complete.

An iteration draws ceil(prompts_per_step * oversample) prompts (SimpleTIR's
`oversample_multiplier`) and runs their G samples each through the rollout
engine. On one host each group (one prompt's G samples) is scored the
moment its last sample ends; once `prompts_per_step` complete groups pass
the group filters (nonzero reward variance, accuracy band), the engine
starts no further pair, and groups cut short by the stop are not used. On
several hosts every drawn group runs (stopping early would need the hosts
to agree on each group as it ends). Either way an iteration trains on the
first `prompts_per_step` passing groups in draw order, on any host count:
one host drops the `surplus` groups from the iteration (`keep_passing`);
several keep them out of the loss (`grpo.select_rows(want=)`), since each
host holds only its own rows. The failing groups stay for the iteration's
statistics; the filters drop them from the loss.
"""

import math

import numpy as np

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


def surplus(rewards, groups_config, want: int) -> np.ndarray:
  """Row flags of the passing groups after the first `want` (rows in
  groups of G, in order): an iteration trains on `want` prompts."""
  G = groups_config.group_size
  out, kept = np.zeros(len(rewards), bool), 0
  for i in range(0, len(rewards), G):
    if passes(rewards[i:i + G], G, groups_config):
      kept += 1
      out[i:i + G] = kept > want
  return out


def keep_passing(trajs, groups_config, want: int):
  """Scored complete groups (G rows each, in order) without the `surplus`
  ones."""
  drop = surplus([t.reward or 0.0 for t in trajs], groups_config, want)
  return [t for t, d in zip(trajs, drop) if not d]


def complete_groups(trajs, group_size: int):
  """The trajectories of groups with all `group_size` samples, in order
  (the engine returns a group's samples together, in pair order)."""
  count: dict[str, int] = {}
  for t in trajs:
    count[t.task_id] = count.get(t.task_id, 0) + 1
  return [t for t in trajs if count[t.task_id] == group_size]


def rollout(engine, batch_tasks, groups_config, want: int):
  """The iteration's trajectories, G per prompt; with more prompts drawn
  than `want`, the complete groups once `want` of them pass the filters."""
  G = groups_config.group_size
  if len(batch_tasks) <= want:
    return engine.run(batch_tasks, samples_per_task=G)
  stop = BandGroups(batch_tasks, G, groups_config, want)
  trajs = engine.run_pairs([(t, k) for t in batch_tasks for k in range(G)],
                           stop_admitting=stop)
  return complete_groups(trajs, G)
