"""SWiRL on two hosts against one process with the same 8 devices
(tests/multihost_launch.py): the pipeline's stages, and stage 1 with a
host killed mid-run."""

import pathlib
import signal
import subprocess
import time

import numpy as np

from swirl_jax import jsonl
from swirl_jax.swirl import stage1

import multihost_launch as launch
import testutil


def test_swirl_stages_on_two_hosts_match_one(tmp_path):
  """SWiRL stage 1 (tiny model) -> filter -> stage 2 (with the KL term's
  reference log-probs): each host generates half of stage 1's pairs into
  its own shard, judges half of the filter's steps and samples half of
  each stage 2 step's states; the filter's files and stage 2's losses and
  params equal one process's. Two runs of the pipeline: minutes."""
  one, two = launch.jobs("swirl", tmp_path, timeout=400)["work"]
  t1 = stage1.read_trajectories(str(one / "stage1"))
  t2 = stage1.read_trajectories(str(two / "stage1"))
  assert sorted(t.id for t in t2) == sorted(t.id for t in t1)
  assert len(t2) == len({t.id for t in t2}) == 6
  _assert_same_trajectories(t2, t1)
  shards = sorted(p.name for p in (two / "stage1").iterdir())
  assert shards == ["shard_00000-host000.jsonl", "shard_00000-host001.jsonl"]
  assert [len(jsonl.read(two / "stage1" / s)) for s in shards] == [3, 3]
  for name in ("units.jsonl", "units_none.jsonl"):
    got, want = (jsonl.read(w / "filter" / name) for w in (two, one))
    assert len(got) == len(want)
    for g, w in zip(got, want):  # Log-probs: to float rounding, as above.
      np.testing.assert_allclose(g.pop("action_logprobs"),
                                 w.pop("action_logprobs"), atol=1e-5)
      assert g == w
  assert (two / "filter" / "report.json").read_bytes() == \
      (one / "filter" / "report.json").read_bytes()
  l1, l2 = launch.losses(one / "rl" / "metrics.jsonl"), launch.losses(
      two / "rl" / "metrics.jsonl")
  assert len(l2) == len(l1) == 2
  np.testing.assert_allclose([l for _, l in l2], [l for _, l in l1],
                             atol=1e-5)
  launch.compare_params(launch.params(one / "rl"),
                        launch.params(two / "rl"))


def _assert_same_trajectories(got, want) -> None:
  """The same trajectories, every field equal but the sampler's log-probs,
  which agree to float rounding (one program sharded over two hosts, the
  other over one process's devices)."""
  got, want = {t.id: t for t in got}, {t.id: t for t in want}
  assert sorted(got) == sorted(want)
  for k, w in want.items():
    g = got[k]
    for tg, tw in zip(g.turns, w.turns, strict=True):
      np.testing.assert_allclose(tg.action_logprobs, tw.action_logprobs,
                                 atol=1e-5, err_msg=k)
      tg.action_logprobs = tw.action_logprobs
    assert g == w, k


def _shard_lines(directory: pathlib.Path) -> list[dict]:
  return testutil.shard_rows(directory, torn_tail=True)


def test_stage1_host_killed_then_rerun_has_each_pair_once(tmp_path):
  """SIGKILL of host 1 mid-run (after it wrote two batches), then both
  rerun: every (question, sample) once, equal to one uninterrupted process,
  and what the survivor wrote is kept. Three launches, one paced to be
  killed: about a minute."""
  two = tmp_path / "two"
  procs = launch.start_pair("stage1", two, PAUSE_S=1)
  mine = two / "work" / "stage1" / "shard_00000-host001.jsonl"
  deadline = time.monotonic() + 120
  try:
    while time.monotonic() < deadline and procs[1].poll() is None:
      if mine.exists() and mine.read_bytes().count(b"\n") >= 2:
        break
      time.sleep(0.05)
    assert procs[1].poll() is None, procs[1].communicate()[0][-3000:]
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    try:  # The survivor's next gather has no peer: it fails, or is stopped.
      procs[0].wait(timeout=30)
    except subprocess.TimeoutExpired:
      procs[0].kill()
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
      p.communicate()
  before = _shard_lines(two / "work" / "stage1")
  assert 4 <= len(before) < 12, len(before)  # Killed mid-run.
  codes, outputs, _ = launch.run_pair("stage1", two, timeout=120)
  assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
  after = _shard_lines(two / "work" / "stage1")
  assert all(r in after for r in before)  # Nothing lost.
  ids = [(r["task_id"], r["sample_index"]) for r in after]
  assert len(ids) == len(set(ids)) == 12
  launch.run_single("stage1", tmp_path / "one", timeout=120)
  one = _shard_lines(tmp_path / "one" / "work" / "stage1")
  key = lambda r: (r["task_id"], r["sample_index"])
  assert sorted(after, key=key) == sorted(one, key=key)
