"""SimpleTIR's rollout queue and the saves around it, where they went
wrong: trailing filtered iterations never saved, another run's queue read
as this one's, the queue kept whole, a generator fault without its cause
or one that reached only its own host; and the one dispatcher, which no
device program of either thread bypasses.

The pipeline itself (staleness, exact resume): test_async_simpletir.py,
test_resume_simpletir.py."""

import json
import pathlib
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from swirl_jax import errors
from swirl_jax.models import presets
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.simpletir import pipeline, stages, train
from swirl_jax.training import trainer as trainer_lib

import simpletir_script
import testutil
from test_train_step import host_params


# ------------------------------------------- skipped batches: the trainer.


def _trainer(workdir) -> trainer_lib.Trainer:
  c = trainer_lib.default_config()
  c.num_steps, c.checkpoint_every = 10, 1
  c.progress = c.tensorboard = False
  cfg = presets.get_preset("tiny")
  return trainer_lib.Trainer(c, str(workdir), cfg, params=host_params(cfg))


def _batch(pos: int) -> dict:
  rng = np.random.default_rng(pos)
  return dict(tokens=rng.integers(0, 256, (4, 12)),
              loss_mask=(rng.random((4, 12)) > 0.3).astype(np.float32),
              advantages=rng.normal(size=4).astype(np.float32),
              behaviour_logprobs=np.full((4, 12), -5.5, np.float32))


def test_batches_skipped_after_the_last_step_are_saved(tmp_path):
  """One step (checkpointed), then two batches skipped (every group
  filtered) and the trainer closed: a new trainer resumes past the
  skipped batches, at the same step. Breaks if checkpoints hold only what
  an optimizer step made: the skipped batches come back (data_pos 1),
  though a staleness run's finished queue no longer has their rollouts."""
  t = _trainer(tmp_path)
  t.update(_batch(0))
  t.skip({"reward": 0.0})
  t.skip({"reward": 0.0})
  t.close()
  t = _trainer(tmp_path)
  assert (t.step, t.data_pos) == (1, 3)
  t.close()


# ------------------------------------------------ whose queue it is.


def _manifest(edit=lambda c: None, **kw) -> dict:
  """The queue manifest of the scripted staleness run, `edit`ed."""
  c = simpletir_script.config()
  c.staleness, c.train.loss.tis_cap = 1, 2.0
  edit(c)
  return stages.queue_manifest(train.resolve(c), **kw)


def test_a_queue_of_another_run_is_refused(tmp_path):
  """A queue made by one config, reopened: with the same config, or one
  differing only in where and how often it saves and logs or how far it
  goes, it is this run's; with another seed, another sampling setting or
  another host count, one line names the field and both values. Breaks if
  queue files are matched by (iteration, version) alone: another run's
  rollouts would be trained on as this run's."""
  q = tmp_path / "queue"
  pipeline.Queue(q, _manifest())
  assert (q / pipeline.MANIFEST).exists()
  pipeline.Queue(q, _manifest())

  def elsewhere(c):
    c.num_iterations, c.train.checkpoint_every = 9, 1
    c.data.data_dir = "/elsewhere"
  pipeline.Queue(q, _manifest(elsewhere))
  cases = [
      (_manifest(lambda c: setattr(c, "seed", 1)),
       "seed = 0; this run has 1"),
      (_manifest(lambda c: setattr(c.rollout, "temperature", 0.5)),
       "rollout.temperature = 1.0; this run has 0.5"),
      (_manifest(process_count=2), "process_count = 1; this run has 2"),
  ]
  for manifest, says in cases:
    with pytest.raises(pipeline.Mismatch) as e:
      pipeline.Queue(q, manifest)
    line = errors.one_line(e.value)
    assert line.startswith(f"queue {q} was written by a run with {says}: ")
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)


# ------------------------ the queue's length; a finished run's end.


def _filtered_last(real_collect, last: int):
  """`stages.collect` with iteration `last`'s rewards all 0: every group
  without variance, filtered out; the iteration trains nothing."""
  def collect(loop, it, feed):
    trajs = real_collect(loop, it, feed)
    if it == last:
      for traj in trajs:
        traj.reward, traj.outcome = 0.0, False
    return trajs
  return collect


def test_a_staleness_run_keeps_a_short_queue_and_reruns_finished(
    tmp_path, monkeypatch):
  """Staleness 1, 3 iterations: 2 steps each, a checkpoint every 2 steps,
  the last all filtered (no step). At every checkpoint the queue holds
  the rollouts a resume from it needs and those of at most k + 1
  iterations (none before the checkpoint on disk before it). The same
  command again then finishes at once: no update, the same records and
  checkpoints. Breaks if queue files outlive the checkpoints that cover
  them (the queue grows with the run), or if the skipped iteration is not
  saved (the rerun resumes before it, whose rollouts went with the
  finished run's queue). One run of the job and a rerun: under a minute
  on an idle machine."""
  monkeypatch.setattr(stages, "collect", _filtered_last(stages.collect, 2))
  c = simpletir_script.config()
  c.staleness, c.train.checkpoint_every = 1, 2
  # Nothing the test reads: no trainer forward, TensorBoard or export.
  c.old_logprobs, c.log_mismatch = "sampler", False
  c.train.tensorboard = c.train.export_hf = False
  held, real_saved = [], pipeline.Generator.saved

  def saved(self, data_pos):
    real_saved(self, data_pos)
    names = [p.name for p in (tmp_path / "queue").glob("iter_*")]
    held.append((data_pos, sorted(int(n[5:11]) for n in names)))
    assert set(range(data_pos, min(data_pos + self.k, self.stop))) <= \
        set(held[-1][1]), held

  monkeypatch.setattr(pipeline.Generator, "saved", saved)
  simpletir_script.run(c, tmp_path, monkeypatch.setattr)
  assert {1, 2} <= {pos for pos, _ in held}  # A checkpoint each update.
  assert max(len(its) for _, its in held) <= c.staleness + 1, held
  metrics = testutil.read_jsonl(tmp_path / "metrics.jsonl")
  assert [r["iteration"] for r in metrics if "skipped_batch" in r] == [2]
  steps = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
  updates, real_update = [], trainer_lib.Trainer.update

  def update(self, batch, extra=None):
    updates.append(extra["iteration"])
    return real_update(self, batch, extra)
  monkeypatch.setattr(trainer_lib.Trainer, "update", update)
  simpletir_script.run(c, tmp_path, monkeypatch.setattr)
  assert not updates
  assert testutil.read_jsonl(tmp_path / "metrics.jsonl") == metrics
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == steps
  assert not (tmp_path / "queue").exists()


# ----------------------------------------------------- its faults.


def test_a_generator_fault_names_the_iteration_and_the_cause():
  """A collect that raises at iteration 2 (staleness 1): `take` raises in
  the main thread, one line with the iteration, its policy version and
  the original error; a user error's (a bad file) stays one `main` prints
  alone. Breaks if the message only says that the generator failed."""
  head = "the rollout generator failed at iteration 2 (policy version 1): "
  for cause, cls, says in (
      (ZeroDivisionError("boom at row 3\nmore"), pipeline.Failed,
       "ZeroDivisionError: boom at row 3"),
      (errors.UserError("q.jsonl:4: not JSON"), pipeline.FailedUserError,
       "q.jsonl:4: not JSON")):
    def collect(it, policy, cause=cause):
      policy()
      if it == 2:
        raise cause
      return []
    gen = pipeline.Generator(collect, staleness=1, start=0, stop=4)
    gen.publish(engine_lib.Policy(0, None))
    assert gen.take(0) == [] and gen.take(1) == []
    gen.publish(engine_lib.Policy(1, None))
    with pytest.raises(pipeline.Failed) as e:
      gen.take(2)
    assert type(e.value) is cls and e.value.__cause__ is cause
    assert str(e.value) == head + says
    user = cls is pipeline.FailedUserError  # `main` prints the line alone.
    assert errors.one_line(e.value) == (head + says if user else None)
    gen.close()


WORKER = pathlib.Path(__file__).resolve().parent / "fault_worker.py"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_a_generator_fault_on_one_host_ends_every_host_in_seconds(tmp_path):
  """Two hosts at staleness 1; host 1's generator raises while it samples
  iteration 2 (fault_worker.py; by then every program is compiled, so
  host 1's trainer reaches `take` within an update). Both processes end
  within 30 s of the fault: host 1 with its own error (the iteration, the version, the
  cause), host 0 with one `error:` line naming host 1 and the same cause.
  Before every host met in `take`, host 0 went on into the next
  collective and waited there for the coordination service's timeout."""
  address = f"127.0.0.1:{_free_port()}"
  env = testutil.cpu_env(
      JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES="2",
      XLA_FLAGS="--xla_force_host_platform_device_count=4 "
      + testutil.FAST_XLA_FLAGS, FAULT_AT="2",
      PYTHONPATH=str(WORKER.parents[1]), **testutil.jax_cache_env())
  procs = [subprocess.Popen(
      [sys.executable, str(WORKER), str(tmp_path / "work")],
      env={**env, "JAX_PROCESS_ID": str(i)}, cwd=WORKER.parents[1],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  try:  # A generous limit for start-up on a loaded machine.
    outputs = [p.communicate(timeout=300)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  ended = time.time()
  codes = [p.returncode for p in procs]
  fault = [float(t) for t in re.findall(r"FAULT_AT (\d+\.\d+)",
                                        outputs[1])]
  assert len(fault) == 1, outputs[1][-3000:]
  assert ended - fault[0] < 30, (ended - fault[0], outputs)
  cause = ("the rollout generator failed at iteration 2 (policy version "
           "1): RuntimeError: injected fault")
  assert codes[1] == 1 and f"Failed: {cause}" in outputs[1], \
      outputs[1][-3000:]
  assert codes[0] == 2, outputs[0][-3000:]
  assert f"error: this run stopped: host 1: {cause}" in outputs[0], \
      outputs[0][-3000:]
  assert outputs[0].count("error:") == 1


def test_every_program_beside_the_generator_is_queued_by_the_dispatcher(
    tmp_path):
  """SimpleTIR at staleness 1 on 4 CPU devices, the trainer's mesh over
  all 4 and the sampler tensor-parallel over 2 (dispatch_check.py): every
  program on more than one device that either thread queues while the
  generator runs holds `dispatch.LOCK`, so no two threads' collectives
  can be queued in different orders on different devices. Breaks if a
  call site of either thread queues without it (each is named)."""
  checker = pathlib.Path(__file__).resolve().parent / "dispatch_check.py"
  proc = subprocess.run(
      [sys.executable, str(checker), str(tmp_path / "work")],
      cwd=checker.parents[1], env=testutil.cpu_env(
          PYTHONPATH=str(checker.parents[1]), **testutil.jax_cache_env()),
      capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  out = json.loads(proc.stdout.splitlines()[-1])
  assert out["threads"] == ["MainThread", "generator"], out
  assert out["unlocked"] == [], out["unlocked"]
