"""The warm start's stopping criterion: the greedy copy rate on held-out
demonstration prompts (`warmstart.copy_rate`), checked every few steps."""

import json
import os

import pytest

from swirl_jax import config_lib, warmstart
from swirl_jax.rollout.records import Trajectory, Turn
from swirl_jax.tasks import datasets, synthetic
from swirl_jax.tools import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _traj(tool, argument):
  return Trajectory(turns=[Turn(tool=tool, argument=argument)])


def test_copy_rate_counts_tool_calls_with_the_first_steps_numbers():
  compute = synthetic.compute_tasks(1, "demo")[0]
  q = compute.metadata["quantities"]
  nums = sorted(q.values())
  assert warmstart.first_step_numbers(compute) == set(nums)
  expr = compute.metadata["solution_graph"][0]["expression"]
  chain = synthetic.chain_tasks(1, "demo")[0]
  first = chain.metadata["solution_graph"][0]
  want = {q2 if isinstance(q2, int) else chain.metadata["quantities"][q2]
          for q2 in first["operands"]}
  assert warmstart.first_step_numbers(chain) == want
  chain_expr = first["expression"]
  trajs = [_traj("python", f"print( {expr} )"),  # Every number: copied.
           _traj("python", f"print( {nums[0] + 1} * {nums[-1]} )"),
           _traj(None, f"print( {expr} )"),  # No tool call: a guess.
           Trajectory(turns=[]),
           _traj("calculator", chain_expr)]
  tasks = [compute] * 4 + [chain]
  assert warmstart.copy_rate(trajs, tasks) == pytest.approx(2 / 5)
  assert warmstart.copy_rate([], []) == 0.0


class _FakeTrainer:
  def __init__(self):
    self.step, self.data_pos = 0, 0

  def update(self, batch):
    del batch
    self.step += 1


def _batches(pos):
  return iter(range(pos, 10 ** 6))


def test_training_stops_at_the_first_check_that_holds():
  checked = []

  def check(reached_at):
    return lambda step: checked.append(step) or step >= reached_at
  tr = _FakeTrainer()
  assert warmstart.train_until(tr, _batches, 100, check(25), every=10)
  assert tr.step == 30 and checked == [10, 20, 30]
  # Never reached: every check, then one at the cap.
  tr, checked[:] = _FakeTrainer(), []
  assert warmstart.train_until(tr, _batches, 35, check(10 ** 6),
                               every=10) is False
  assert tr.step == 35 and checked == [10, 20, 30, 35]
  tr = _FakeTrainer()  # No check: a fixed count.
  assert warmstart.train_until(tr, _batches, 7) is None and tr.step == 7


def test_split_held_out_takes_the_last_tasks():
  w = warmstart.default_config()
  w.tasks, w.criterion.tasks, w.criterion.min_copy_rate = 6, 2, 0.5
  assert warmstart.task_count(w) == 8
  assert warmstart.split_held_out(w, list(range(8))) == (
      list(range(6)), [6, 7])
  w.criterion.min_copy_rate = 0.0  # No criterion: nothing held out.
  assert warmstart.task_count(w) == 6
  assert warmstart.split_held_out(w, list(range(6))) == (list(range(6)), [])
  w.criterion.min_copy_rate = 0.5
  with pytest.raises(ValueError, match="none to train on"):
    warmstart.split_held_out(w, [1, 2])


def test_a_real_warm_start_logs_each_check(tmp_path):
  """The SimpleTIR demo's smoke warm start (4 steps) with a check every 2
  steps: it cannot copy yet, so it stops at the cap and says so."""
  mod = config_lib.load_config_module(
      os.path.join(ROOT, "configs", "simpletir_demo.py"))
  c = mod.get_config("smoke=True")
  w = c.warmstart
  w.criterion.update(min_copy_rate=0.5, every=2, tasks=4)
  tasks = datasets.load_tasks(c.data.train, w.split, None,
                              warmstart.task_count(w))
  warmstart.run(c, str(tmp_path), tasks, registry.from_config(c.tools, None))
  log = json.loads((tmp_path / "warmstart" / "criterion.json").read_text())
  assert [r["step"] for r in log] == [2, 4]
  assert all(0 <= r["copy_rate"] <= 1 and not r["reached"] for r in log)
  assert warmstart.criterion_line(tmp_path).startswith(
      f"Warm start: copy rate {log[-1]['copy_rate']:.3f} missed")
  assert (warmstart.hf_dir(tmp_path) / "config.json").exists()
