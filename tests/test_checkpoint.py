"""Checkpoints: resume after a crash, unreadable checkpoints, HF export."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from swirl_jax import sharding as shd
from swirl_jax.models import hf_io
from swirl_jax.models import presets
from swirl_jax.training import checkpoint as ckpt_lib
from swirl_jax.training import lora
from swirl_jax.training import metrics as metrics_lib
from swirl_jax.training import optimizer
from swirl_jax.training import state as state_lib
from test_train_step import host_params

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Trains the tiny model for 7 steps, saving every 2; with CRASH_AFTER=n it
# dies abruptly (no clean-up, saves possibly in flight) after n steps.
_DRIVER = textwrap.dedent("""
    import os, sys
    import jax, numpy as np
    jax.config.update("jax_default_matmul_precision", "highest")
    sys.path.insert(0, "tests")
    from swirl_jax.models import presets
    from swirl_jax.training import trainer
    from test_train_step import host_params

    crash_after = int(os.environ.get("CRASH_AFTER", "-1"))
    config = trainer.default_config()
    config.num_steps, config.checkpoint_every = 7, 2
    config.optim.lr, config.progress = 1e-3, False
    config.tensorboard = False  # Its import (torch) costs seconds here.

    def batches(pos):  # Batch i depends on i alone, as a real reader's would.
      while True:
        if pos == crash_after:
          os._exit(17)
        rng = np.random.default_rng(pos)
        yield dict(tokens=rng.integers(0, 256, (4, 12)),
                   loss_mask=(rng.random((4, 12)) > 0.3).astype(np.float32),
                   advantages=rng.normal(size=4).astype(np.float32),
                   behaviour_logprobs=np.full((4, 12), -5.5, np.float32))
        pos += 1

    cfg = presets.get_preset("tiny")
    trainer.train(config, sys.argv[1], cfg, batches, params=host_params(cfg))
    """)


def _run_driver(workdir, cache_dir, crash_after=None):
  env = dict(os.environ, PYTHONPATH=REPO, JAX_COMPILATION_CACHE_DIR=cache_dir,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  # Fast compiles; every run of the comparison uses the same flags.
  env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
  if crash_after is not None:
    env["CRASH_AFTER"] = str(crash_after)
  return subprocess.run([sys.executable, "-c", _DRIVER, str(workdir)],
                        cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=300)


def _losses(workdir):
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def test_resume_after_crash_continues_like_an_uninterrupted_run(tmp_path):
  cache = str(tmp_path / "jax_cache")
  full = _run_driver(tmp_path / "full", cache)
  assert full.returncode == 0, full.stderr[-3000:]
  crashed = _run_driver(tmp_path / "crash", cache, crash_after=5)
  assert crashed.returncode == 17, crashed.stderr[-3000:]
  ck = ckpt_lib.Checkpointer(str(tmp_path / "crash"), every=2)
  steps = ck.all_steps()
  ck.close()
  assert steps and max(steps) <= 4, steps  # Step 5 was never saved.
  resumed = _run_driver(tmp_path / "crash", cache)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  want, got = _losses(tmp_path / "full"), _losses(tmp_path / "crash")
  assert sorted(got) == sorted(want) == list(range(1, 8))
  np.testing.assert_allclose([got[s] for s in range(1, 8)],
                             [want[s] for s in range(1, 8)], rtol=1e-6)


@pytest.fixture(scope="module")
def tiny_state():
  cfg = presets.get_preset("tiny")
  mesh = shd.make_mesh([("data", 1)], jax.devices()[:1])
  lora_cfg = lora.default_config()
  lora_cfg.rank = 2
  tx, _ = optimizer.make_optimizer(None, 10)
  state, shardings = state_lib.create(cfg, tx, mesh, lora_cfg=lora_cfg,
                                      params=host_params(cfg))
  # Non-zero adapters, so a merge that dropped them would show.
  state = state.replace(params=jax.tree.map(lambda x: x + 0.01, state.params))
  return cfg, lora_cfg, state, shardings


def _corrupt(step_dir: pathlib.Path) -> None:
  """Truncates every array data file of a checkpoint."""
  files = [f for f in (step_dir / "state").rglob("*")
           if f.is_file() and "/d/" in str(f)]
  assert files
  for f in files:
    f.write_bytes(b"\0" * 7)


def test_unreadable_checkpoint_falls_back_then_errors(tiny_state, tmp_path):
  _, _, state, shardings = tiny_state
  target = ckpt_lib.abstract_state(state, shardings)
  ck = ckpt_lib.Checkpointer(str(tmp_path), every=1, async_save=False)
  assert ck.restore(target) is None  # Nothing yet: a fresh run.
  for step in (1, 2):
    assert ck.save(state.replace(step=jax.numpy.int32(step)))
  ck.wait()
  with pytest.raises(ckpt_lib.CheckpointError, match="no checkpoint for "
                     "step 7"):
    ck.restore(target, step=7)

  _corrupt(tmp_path / "checkpoints" / "2")
  with pytest.raises(ckpt_lib.CheckpointError, match="cannot restore"):
    ck.restore(target, step=2)
  restored, meta = ck.restore(target, frozen=state.frozen)
  assert meta["step"] == 1 and int(restored.step) == 1
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored),
               jax.device_get(state.replace(step=jax.numpy.int32(1))))
  # The unreadable one is kept, out of the way.
  assert ck.all_steps() == [1]
  assert list((tmp_path / "checkpoints.unreadable").iterdir())

  _corrupt(tmp_path / "checkpoints" / "1")
  with pytest.raises(ckpt_lib.CheckpointError, match="no checkpoint restores"):
    ck.restore(target)
  assert ck.all_steps() == [1]  # Nothing moved when nothing restores.
  ck.close()


def test_fs_type_reads_the_longest_mount_prefix(tmp_path):
  from swirl_jax import paths  # pylint: disable=g-import-not-at-top
  mounts = tmp_path / "mounts"
  mounts.write_text("/dev/sda1 / ext4 rw 0 0\n"
                    "bucket /mnt/gcs fuse.gcsfuse rw,nosuid 0 0\n"
                    "tmpfs /mnt/gcs\\040x tmpfs rw 0 0\n")
  assert paths.fs_type("/mnt/gcs/run/checkpoints", str(mounts)) == \
      "fuse.gcsfuse"
  assert paths.fs_type("/mnt/gcs x/a", str(mounts)) == "tmpfs"
  assert paths.fs_type("/mnt/gcsx", str(mounts)) == "ext4"
  assert paths.fs_type("/x", str(tmp_path / "none")) == ""


def test_checkpoints_on_a_mounted_bucket_commit_without_renames(
    tiny_state, tmp_path, monkeypatch):
  """On gcsfuse a directory rename copies every object: a save writes in
  place and is final once its commit file is there; a step directory
  without one (a save cut short) is not a checkpoint."""
  _, _, state, shardings = tiny_state
  target = ckpt_lib.abstract_state(state, shardings)
  monkeypatch.setattr(ckpt_lib.paths, "on_object_store", lambda p: True)
  from orbax.checkpoint._src.path import async_path  # pylint: disable=g-import-not-at-top
  renames, real_rename = [], async_path.rename

  async def rename(src, dst):  # What a finalising save would call.
    renames.append((src, dst))
    return await real_rename(src, dst)

  monkeypatch.setattr(async_path, "rename", rename)
  ck = ckpt_lib.Checkpointer(str(tmp_path), every=1, async_save=False)
  assert ck.save(state.replace(step=jax.numpy.int32(1)))
  ck.wait()
  step_dir = tmp_path / "checkpoints" / "1"
  assert (step_dir / "commit_success.txt").exists()
  assert not renames
  ck.close()
  partial = tmp_path / "checkpoints" / "2" / "state"
  partial.mkdir(parents=True)  # A save of step 2 that died mid-write.
  ck = ckpt_lib.Checkpointer(str(tmp_path), every=1, async_save=False)
  assert ck.all_steps() == [1]
  restored, meta = ck.restore(target, frozen=state.frozen)
  assert meta["step"] == 1 and int(restored.step) == 1
  ck.close()


def test_export_round_trip_merges_lora(tiny_state, tmp_path):
  cfg, lora_cfg, state, _ = tiny_state
  path = ckpt_lib.export_hf(state, cfg, str(tmp_path / "hf"),
                            lora_cfg=lora_cfg)
  cfg2, params = hf_io.load_hf_dir(path)
  assert cfg2.num_layers == cfg.num_layers
  merged = jax.device_get(state.model_params(lora_cfg))
  assert not np.allclose(merged["layers"]["attn"]["q"],
                         jax.device_get(state.frozen)["layers"]["attn"]["q"])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               jax.device_get(params), merged)


def test_metric_writer_truncates_on_resume(tmp_path):
  w = metrics_lib.MetricWriter(str(tmp_path), progress=False, enabled=True)
  for s in (1, 2, 3):
    w.write(s, {"loss": float(s), "bad": float("nan")})
  w.close()
  assert list((tmp_path / "tensorboard").iterdir())  # An event file.
  w = metrics_lib.MetricWriter(str(tmp_path), initial_step=2,
                               tensorboard=False, progress=False, enabled=True)
  w.write(3, {"loss": 30.0})
  w.close()
  rows = [json.loads(l) for l in
          (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.0),
                                                    (3, 30.0)]
  assert rows[0]["bad"] is None
