"""SimpleTIR with bounded staleness (swirl_jax/simpletir/pipeline.py):
staleness 1 samples each iteration on the version before, whatever the
timing, with the behaviour log-probs of that version; a row older than
the staleness never reaches the trainer. Staleness 0 is the synchronous
loop, record for record: tests/test_simpletir.py's
test_grpo_steps_with_real_sandbox[trainer] (the same scripted run).

Killed -9 and resumed: tests/test_resume_simpletir.py. Two processes
against one: tests/test_multihost_simpletir.py."""

import time

import jax
import numpy as np
import pytest

from swirl_jax.models import loading
from swirl_jax.rollout.records import Trajectory, Turn
from swirl_jax.simpletir import grpo, stages, train
from swirl_jax.tasks import checkers
from swirl_jax.training import trainer as trainer_lib

import simpletir_script
import testutil

_lines = testutil.read_jsonl


def _traj(i, version, reward):
  return Trajectory(task_id=f"q{i // 4}", sample_index=i % 4, reward=reward,
                    prompt_ids=[1, 2], meta={"policy_version": version},
                    turns=[Turn(text="```python\nprint(1)\n```",
                                action_ids=[5 + i], action_logprobs=[-1.0])])


def test_rows_older_than_the_staleness_leave_the_loss():
  """Iteration 3 at staleness 1: a row of version 1 (2 behind) is out of
  the loss, counted, and keeps its place in its group's statistics; rows
  of version 2 train."""
  g = grpo.GroupConfig(group_size=4, accuracy_band=None)
  rewards = [1.0, 0.0, 1.0, 0.0]
  trajs = [_traj(i, v, r) for i, (v, r) in enumerate(zip([2, 1, 2, 2],
                                                         rewards))]
  rows = grpo.figures(trajs, g)
  sel, adv, stats = grpo.select_rows(rows, g, iteration=3, staleness=1)
  assert sel.tolist() == [0, 2, 3]
  assert stats["stale_rows"] == 1 and stats["policy_lag"] == 1.25
  r = np.array(rewards)
  np.testing.assert_allclose(adv, ((r - r.mean()) / r.std(ddof=1))[[0, 2, 3]],
                             rtol=1e-6)
  sel, _, stats = grpo.select_rows(rows, g, iteration=3, staleness=2)
  assert sel.tolist() == [0, 1, 2, 3] and stats["stale_rows"] == 0
  assert "stale_rows" not in grpo.select_rows(rows, g)[2]  # Synchronous.


def test_a_stale_trajectory_is_never_trained_on(tmp_path, monkeypatch):
  """Staleness 1, the scripted run; one trajectory of iteration 2 made to
  look sampled 2 versions back (as a generator that fell behind would
  give it): no batch the trainer gets holds its tokens, and the
  iteration's records count it; the same trajectory, not stale, does
  train."""
  c = simpletir_script.config()
  c.staleness, c.train.loss.tis_cap = 1, 2.0
  real_collect, batches = stages.collect, []
  target = {}

  def collect(loop, it, feed):
    trajs = real_collect(loop, it, feed)
    if it == 2:  # Sample 0 of the first group: right, in the loss.
      trajs[0].meta["policy_version"] = target.get("version", 0)
      target["tokens"] = trajs[0].token_sequence()[0]
    return trajs

  real_update = trainer_lib.Trainer.update

  def update(self, batch, extra=None):
    if extra["iteration"] == 2:
      batches.append(np.asarray(batch["tokens"]))
    return real_update(self, batch, extra)

  monkeypatch.setattr(stages, "collect", collect)
  monkeypatch.setattr(trainer_lib.Trainer, "update", update)

  def trained(version):
    target["version"] = version
    batches.clear()
    simpletir_script.run(c, tmp_path / f"v{version}", monkeypatch.setattr)
    t = target["tokens"]
    rows = np.concatenate(batches)
    recs = [r for r in _lines(tmp_path / f"v{version}" / "metrics.jsonl")
            if r["iteration"] == 2]
    return (any(np.array_equal(row[:len(t)], t) for row in rows),
            {r["stale_rows"] for r in recs})

  assert trained(0) == (False, {1.0})  # 2 versions behind iteration 2.
  assert trained(1) == (True, {0.0})  # 1 behind: allowed.


def _learning_config():
  """The tiny model sampling at temperature 1, rewards by sample parity
  (set by the test), every row in the loss, a large step: the policy
  moves visibly each iteration."""
  c = simpletir_script.config(temperature=1.0)
  c.grpo.update(filter_void=False, mask_overlong=False)
  c.train.optim.lr = 1e-2
  c.staleness, c.train.loss.tis_cap = 1, 2.0
  return c


def _parity_rewards(trajs, tasks):
  del tasks
  for t in trajs:
    t.outcome = t.sample_index % 2 == 0
    t.reward = float(t.outcome)


def test_staleness_1_samples_on_the_version_before_whatever_the_timing(
    tmp_path, monkeypatch):
  """The tiny model, staleness 1, 3 iterations: iteration i's rollouts are
  stamped and sampled with version max(0, i - 1) (their behaviour
  log-probs are that version's, not the newer one's the trainer updates),
  and a second run whose trainer is slowed down (so the generator runs
  further ahead) writes the same records and rollouts. Two runs of the
  model: over a minute."""
  monkeypatch.setattr(checkers, "score_trajectories", _parity_rewards)
  published = {}
  real_policy = stages.policy

  def policy(loop):
    p = real_policy(loop)
    published[p.version] = jax.tree.map(np.asarray,
                                        loop.trainer.policy_params())
    return p

  monkeypatch.setattr(stages, "policy", policy)
  c = _learning_config()
  updated = []
  train.run(c, str(tmp_path / "fast"))
  real_update = trainer_lib.Trainer.update

  def slow_update(self, batch, extra=None):
    time.sleep(2.0)
    updated.append(extra["iteration"])
    return real_update(self, batch, extra)

  monkeypatch.setattr(trainer_lib.Trainer, "update", slow_update)
  train.run(c, str(tmp_path / "slow"))
  assert updated == [0.0, 1.0, 2.0]
  fast, slow = tmp_path / "fast", tmp_path / "slow"
  assert _lines(slow / "metrics.jsonl") == _lines(fast / "metrics.jsonl")
  cfg = loading.load_policy(c.model)[0]
  for it in range(3):
    name = f"rollouts/iter_{it:06d}.jsonl"
    trajs = [Trajectory.from_dict(r) for r in _lines(fast / name)]
    assert _lines(slow / name) == _lines(fast / name), name
    assert {t.meta["policy_version"] for t in trajs} == {max(0, it - 1)}
    if it:  # Behaviour log-probs: version it - 1's, not version it's.
      sampled = testutil.teacher_forced_gap(cfg, published[it - 1], trajs)
      newer = testutil.teacher_forced_gap(cfg, published[it], trajs)
      assert sampled < 2e-4 and newer > 1e-2, (it, sampled, newer)
