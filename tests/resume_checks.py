"""Kill -9 at seeded random points, rerun, compare: shared by the resume
tests (tests/resume_driver.py runs the jobs)."""

import json
import os
import pathlib
import random
import struct
import subprocess
import sys

import numpy as np
from tensorboardX import summary as tb_summary
from tensorboardX.proto import event_pb2

import testutil  # pylint: disable=g-bad-import-order

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODES = ("before", "after", "torn")


def run(scenario: str, work, cache, kill: str = ""):
  """The driver on `work`; `kill`: 'STAGE:K:MODE' or '' (to the end).
  Compiled programs go to the session's cache (`cache` where it is off)."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_COMPILATION_CACHE_DIR=
             testutil.cache_dir() or str(cache),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             XLA_FLAGS=testutil.FAST_XLA_FLAGS)
  args = [sys.executable, str(ROOT / "tests" / "resume_driver.py"),
          scenario, str(work)] + ([kill] if kill else [])
  return subprocess.run(args, cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=600, check=False)


def reference(scenario: str, work, cache) -> dict:
  """Runs uninterrupted; each stage's number of kill points."""
  proc = run(scenario, work, cache)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.splitlines()[-1])


def kill_plan(counts: dict, stages, seed: int) -> list[str]:
  """A kill point per entry of `stages`: a seeded random one in the first
  half of that stage's points (a rerun redoes some, so every kill lands)."""
  rng = random.Random(seed)
  return [f"{s}:{rng.randint(1, max(1, counts[s] // 2))}:"
          f"{rng.choice(MODES)}" for s in stages]


def kill_and_resume(scenario: str, work, cache, plan) -> None:
  """Each kill of `plan` in turn on `work` (each must kill), then a rerun
  to the end."""
  for kill in plan:
    proc = run(scenario, work, cache, kill)
    assert proc.returncode == -9, (kill, proc.returncode,
                                   proc.stderr[-3000:])
  proc = run(scenario, work, cache)
  assert proc.returncode == 0, (plan, proc.stderr[-3000:])


records = testutil.read_jsonl  # The name the resume tests call it by.


def assert_same_records(got: list[dict], want: list[dict], rtol=1e-5):
  """Equal lists of records: same keys, numbers within `rtol`."""
  assert [sorted(r) for r in got] == [sorted(r) for r in want]
  for g, w in zip(got, want):
    for k in w:
      if isinstance(w[k], float):
        np.testing.assert_allclose(g[k], w[k], rtol=rtol, atol=1e-7,
                                   err_msg=k)
      else:
        assert g[k] == w[k], (k, g, w)


def tensorboard_scalars(logdir) -> list[tuple[int, str, float]]:
  """(step, tag, value) as TensorBoard shows them: the events files in name
  order, a restart (SessionLog START at step s) hiding what earlier files
  had at steps >= s."""
  shown = []
  for path in sorted(pathlib.Path(logdir).glob("events.out.tfevents.*")):
    data, i = path.read_bytes(), 0
    while i < len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      i += 12 + n + 4
      if ev.HasField("session_log") and \
          ev.session_log.status == event_pb2.SessionLog.START:
        shown = [x for x in shown if x[0] < ev.step]
      shown += [(ev.step, v.tag, v.simple_value) for v in ev.summary.value]
  return shown


def assert_tensorboard_matches(workdir) -> None:
  """TensorBoard holds each metrics.jsonl value once, at its step (under
  its tag as TensorBoard spells it: `avg@k` as `avg_k`)."""
  workdir = pathlib.Path(workdir)
  tag = tb_summary._clean_tag  # pylint: disable=protected-access
  want = sorted((r["step"], tag(k), float(np.float32(v)))
                for r in records(workdir / "metrics.jsonl")
                for k, v in r.items() if k != "step" and v is not None)
  got = sorted(tensorboard_scalars(workdir / "tensorboard"))
  assert got == want
  assert len(list((workdir / "tensorboard").iterdir())) == 1


def assert_same_params(got_hf, want_hf) -> None:
  """The two Hugging Face exports hold the same weights, bit for bit."""
  got, want = testutil.load_weights(got_hf), testutil.load_weights(want_hf)
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
