"""Errors a user reads: one line `error: ...`, exit status 2, nothing lost.

Most faults run `main` in this process as the command line would (flags
parsed, `os._exit` caught); the read-only and full disks need a mount, so
they run the CLI in a user and mount namespace (`unshare -rm`) with a
read-only bind or a 64 KiB tmpfs, and are skipped where that is refused.
"""

import io
import logging as std_logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import ml_collections
import pytest
from absl import flags
from absl import logging

from swirl_jax import chat, config_lib, errors, main
from swirl_jax.models import presets
from swirl_jax.rollout import engine, turns
from swirl_jax.sampling.sampler import SamplerConfig
from swirl_jax.simpletir import grpo
from swirl_jax.swirl import stage2
from swirl_jax.tools import registry
from swirl_jax.training import step as step_lib

REPO = pathlib.Path(__file__).resolve().parents[1]


class _Exit(Exception):
  def __init__(self, code):
    super().__init__(code)
    self.code = code


def _raise_exit(code):
  raise _Exit(code)


def _unparse():
  """Forgets a parse, with the `--config.x` flags bound to its config."""
  flags.FLAGS.unparse_flags()
  for name in [n for n in flags.FLAGS if n.startswith("config.")]:
    delattr(flags.FLAGS, name)


@pytest.fixture
def cli(monkeypatch, capsys):
  """run(*args) -> (status, stderr) of `python -m swirl_jax.main *args`."""
  monkeypatch.chdir(REPO)
  monkeypatch.setattr(main.os, "_exit", _raise_exit)
  monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # Restored.

  def run(*args):
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["main", *args])  # Read by config_flags.
    try:
      main._parse_flags(sys.argv)  # pylint: disable=protected-access
      main.main(["main"])
      code = 0
    except _Exit as e:
      code = e.code
    finally:
      _unparse()
    return code, capsys.readouterr().err

  yield run
  quiet = main._quiet_orbax  # pylint: disable=protected-access
  logging.get_absl_handler().removeFilter(quiet)


def _snapshot(root: pathlib.Path) -> dict:
  return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
          for p in sorted(root.rglob("*"))}


@pytest.fixture
def workdir(tmp_path):
  """A workdir that already holds a file and a folder of a finished run."""
  w = tmp_path / "work"
  (w / "earlier").mkdir(parents=True)
  (w / "earlier" / "results.json").write_text('{"accuracy": 0.5}\n')
  (w / "notes.txt").write_text("do not touch\n")
  return w


def _assert_one_line_error(code, err, line):
  assert (code, err) == (2, f"error: {line}\n")


def _assert_fails_leaving_workdir(cli, workdir, args, line):
  """`main` with `args` and `workdir` fails with `error: line` alone, and
  the workdir is as it was."""
  before = _snapshot(workdir)
  code, err = cli(*args, f"--workdir={workdir}")
  _assert_one_line_error(code, err, line)
  assert _snapshot(workdir) == before


def test_unknown_stage_fails_before_any_stage(cli, workdir):
  # The workdir unchanged: the warm start never ran.
  _assert_fails_leaving_workdir(
      cli, workdir, ("--config=configs/demo.py:smoke",
                     "--config.stages=warmstart,fitler"),
      "unknown SWiRL stage 'fitler'; valid: warmstart, stage1, filter, rl, "
      "sft, eval, report")


def test_unknown_filter_strategy_fails_before_any_stage(cli, workdir):
  _assert_fails_leaving_workdir(
      cli, workdir, ("--config=configs/demo.py:smoke",
                     "--config.filter.strategy=proces"),
      "unknown filter strategy 'proces'; valid: none, process, outcome, "
      "process_outcome")


def test_missing_data_file_names_the_fetch_command(cli, workdir, tmp_path):
  empty = tmp_path / "no_data"
  empty.mkdir()
  _assert_fails_leaving_workdir(
      cli, workdir, ("--config=configs/swirl_gsm8k.py:runlocal",
                     "--config.job=swirl_stage1",
                     f"--config.data.data_dir={empty}"),
      f"gsm8k split 'train': missing file {empty}/gsm8k/train.jsonl; fetch "
      "it with: python -m swirl_jax.main --config=configs/data.py:"
      f"datasets=gsm8k --workdir={empty}")


def test_truncated_data_file_names_file_and_line(cli, workdir, tmp_path):
  data = tmp_path / "data"
  (data / "gsm8k").mkdir(parents=True)
  (data / "gsm8k" / "train.jsonl").write_text(
      '{"question": "What is 2+2?", "answer": "#### 4"}\n{"question": "Wh')
  _assert_fails_leaving_workdir(
      cli, workdir, ("--config=configs/swirl_gsm8k.py:runlocal",
                     "--config.job=swirl_stage1",
                     f"--config.data.data_dir={data}"),
      f"{data}/gsm8k/train.jsonl:2: bad JSON (Unterminated string starting "
      "at column 14)")


def test_url_workdir_says_to_mount_it(cli, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # A local 'gs:' directory would land here.
  code, err = cli(f"--config={REPO}/configs/demo.py:smoke",
                  "--workdir=gs://b/run")
  _assert_one_line_error(
      code, err, "workdir gs://b/run: a URL; mount the bucket and pass the "
      "mount path (launch/tpu_vm.sh run --workdir=gs://... mounts it with "
      "gcsfuse on every host)")
  assert not list(tmp_path.iterdir())


def test_missing_checkpoint(cli, workdir, tmp_path):
  gone = tmp_path / "no_model"
  _assert_fails_leaving_workdir(
      cli, workdir, (f"--config=configs/chat.py:checkpoint={gone}",),
      f"{gone}: checkpoint is missing (a .gguf file or a Hugging Face "
      "directory)")


def test_missing_tokenizer(cli, workdir, tmp_path):
  gone = tmp_path / "no_tokenizer"
  _assert_fails_leaving_workdir(
      cli, workdir, ("--config=configs/chat.py:model=tiny",
                     f"--config.model.tokenizer={gone}"),
      f"tokenizer '{gone}': not a .gguf file or a Hugging Face directory")


def test_bad_preset(cli, workdir):
  _assert_fails_leaving_workdir(
      cli, workdir, ("--config=configs/chat.py:model=smollm3",),
      "unknown model preset 'smollm3'; valid: "
      + ", ".join(sorted(presets.PRESETS)))


def test_traceback_flag_shows_the_error(cli, workdir):
  with pytest.raises(config_lib.ConfigError, match="'fitler'"):
    cli("--config=configs/demo.py:smoke", "--config.stages=fitler",
        "--traceback", f"--workdir={workdir}")


def test_workdir_that_is_a_file(cli, tmp_path):
  path = tmp_path / "a_file"
  path.write_text("keep\n")
  code, err = cli("--config=configs/chat.py", f"--workdir={path}/work")
  _assert_one_line_error(code, err, f"workdir {path}/work: Not a directory")
  assert path.read_text() == "keep\n"


@pytest.mark.parametrize("cls, key", [
    (turns.RolloutConfig, "max_turn"), (stage2.Stage2Config, "samples"),
    (grpo.GroupConfig, "groupsize"), (SamplerConfig, "max_cache"),
    (engine.EngineConfig, "slot")])
def test_from_config_rejects_unknown_keys(cls, key):
  valid = ", ".join(sorted(f.name for f in cls.__dataclass_fields__.values()))
  with pytest.raises(config_lib.ConfigError) as e:
    cls.from_config({key: 1})
  assert str(e.value) == f"{cls.__name__}: unknown key '{key}'; valid: {valid}"
  assert errors.one_line(e.value) == str(e.value)


def test_tools_block_rejects_unknown_keys():
  with pytest.raises(config_lib.ConfigError, match=r"^tools: unknown key "
                     r"'search_kk'; valid: names, sandbox_cpus, "
                     r"sandbox_memory_mb, sandbox_timeout_s, search_corpus, "
                     r"search_k$"):
    registry.from_config(config_lib.parse_arg("", names=("calculator",),
                                              search_kk=3))


def test_rollout_format_is_checked():
  with pytest.raises(config_lib.ConfigError, match="^unknown rollout format "
                     "'simpletr'; valid: swirl, simpletir$"):
    turns.RolloutConfig.from_config({"fmt": "simpletr"})


def test_preset_override_with_a_checkpoint_warns(cli, workdir, tmp_path,
                                                 caplog):
  gone = tmp_path / "no_model"
  with caplog.at_level(std_logging.WARNING):
    code, _ = cli(f"--config=configs/chat.py:checkpoint={gone}",
                  "--config.model.preset=qwen3_0_6b", f"--workdir={workdir}")
  assert code == 2
  assert (f"--config.model.preset=qwen3_0_6b is ignored: the model comes from"
          f" checkpoint '{gone}', which holds its own architecture"
          in caplog.text)


def test_random_weights_warn(cli, workdir, caplog, monkeypatch):
  loaded = []  # What chat asks for; loading and replying are tested elsewhere.
  monkeypatch.setattr(chat.loading, "load_policy",
                      lambda m, seed: loaded.append(m.preset))
  monkeypatch.setattr(chat, "reply", lambda *a, **k: "")
  with caplog.at_level(std_logging.WARNING):
    code, _ = cli("--config=configs/chat.py:model=tiny", f"--workdir={workdir}")
  assert (code, loaded) == (0, ["tiny"])
  assert ("model.checkpoint is empty: preset 'tiny' has random weights"
          in caplog.text)


def test_disk_errors_read_as_one_line():
  # Tensorstore (orbax) reports the OS error only in its text.
  e = ValueError('RESOURCE_EXHAUSTED: Error writing "x" in OCDBT database at '
                 'local file "/w/ck/": Failed writing: "/w/ck/d/ab12": '
                 "Failed to write 32627 bytes to file 5: No space left on "
                 "device [os_error_code='28']")
  assert errors.one_line(e) == ("disk full: /w/ck/d/ab12: No space left on "
                                "device")
  wrapped = RuntimeError("save failed")
  wrapped.__cause__ = OSError(28, os.strerror(28), "/w/metrics.jsonl")
  assert errors.one_line(wrapped) == ("disk full: /w/metrics.jsonl: No space "
                                      "left on device")
  assert errors.one_line(RuntimeError("a bug")) is None


def _orbax_lines(checkpoint_info: bool, tmp_path) -> list[str]:
  """The lines orbax's own INFO logging leaves through main's filter."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  handler = logging.get_absl_handler()
  stream = io.StringIO()
  old_stream, old_level = handler.python_handler.stream, logging.get_verbosity()
  handler.python_handler.stream = stream
  root = std_logging.getLogger()
  root.addHandler(handler)
  flags.FLAGS(["main", "--config=configs/chat.py", "--workdir=x",
               f"--checkpoint_info={checkpoint_info}"])
  handler.addFilter(main._quiet_orbax)  # pylint: disable=protected-access
  logging.set_verbosity(logging.INFO)
  try:
    ocp.CheckpointManager(tmp_path / f"ck_{checkpoint_info}").close()
    logging.info("a line of our own")
  finally:
    _unparse()
    logging.set_verbosity(old_level)
    root.removeHandler(handler)
    handler.python_handler.stream = old_stream
  return stream.getvalue().splitlines()


def test_orbax_info_lines_only_with_checkpoint_info(tmp_path, monkeypatch):
  monkeypatch.chdir(REPO)
  quiet = _orbax_lines(False, tmp_path)
  assert len(quiet) == 1 and quiet[0].endswith("] a line of our own")
  loud = _orbax_lines(True, tmp_path)
  assert any("checkpoint_manager.py" in l for l in loud), loud
  assert loud[-1].endswith("] a line of our own")


# --- faults that need a mount: the CLI in a user and mount namespace --------

_DISK_JOB = textwrap.dedent("""
    import sys
    import jax
    import jax.numpy as jnp
    from absl import app
    from swirl_jax import jobs, main
    from swirl_jax.training import checkpoint, state

    def run(config, workdir):  # One checkpoint of 256 KiB into 64 KiB.
      w = jax.random.normal(jax.random.key(0), (256, 256))  # Incompressible.
      s = state.TrainState(step=jnp.int32(1), params={"w": w}, opt_state={},
                           rng=jnp.zeros(2, jnp.uint32),
                           data_pos=jnp.int32(0), skipped=jnp.int32(0))
      ck = checkpoint.Checkpointer(workdir, every=1)
      ck.save(s)
      ck.wait()

    sys.modules["disk_job"] = sys.modules[__name__]
    jobs.register("disk_job", "disk_job:run")
    app.run(main.main, flags_parser=main._parse_flags)
    """)


def _in_namespace(script: str, tmp_path) -> subprocess.CompletedProcess:
  if shutil.which("unshare") is None:
    pytest.skip("no unshare")
  probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "tmpfs",
                          str(tmp_path)], capture_output=True, check=False)
  if probe.returncode:
    pytest.skip(f"no user mount namespace: {probe.stderr.decode()[:200]}")
  env = dict(os.environ, PYTHONPATH=str(REPO))
  return subprocess.run(["unshare", "-rm", "sh", "-ec", script], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=300,
                        check=False)


def test_read_only_workdir(tmp_path, workdir):
  before = _snapshot(workdir)
  proc = _in_namespace(
      f"mount --bind {workdir} {workdir}; "
      f"mount -o remount,ro,bind {workdir}; "
      f"{sys.executable} -m swirl_jax.main --config=configs/chat.py "
      f"--workdir={workdir}", tmp_path)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.splitlines()[-1] == (
      f"error: workdir {workdir}: Read-only file system")
  assert "Traceback" not in proc.stderr
  assert _snapshot(workdir) == before


def test_disk_full_during_a_checkpoint(tmp_path):
  disk = tmp_path / "disk"
  disk.mkdir()
  (tmp_path / "job.py").write_text(_DISK_JOB)
  (tmp_path / "cfg.py").write_text(
      "import ml_collections\n\ndef get_config():\n"
      "  return ml_collections.ConfigDict(dict(job='disk_job'))\n")
  proc = _in_namespace(
      f"mount -t tmpfs -o size=64k tmpfs {disk}; mkdir {disk}/w; "
      f"echo kept > {disk}/w/notes.txt; "
      f"{sys.executable} {tmp_path}/job.py --config={tmp_path}/cfg.py "
      f"--workdir={disk}/w || echo status=$?; cat {disk}/w/notes.txt; "
      f"find {disk}/w -name '*.orbax-checkpoint-tmp*'", tmp_path)
  out, err = proc.stdout.splitlines(), proc.stderr.splitlines()
  # No half-written checkpoint is left behind (find prints none).
  assert out[-2:] == ["status=2", "kept"], proc.stdout + proc.stderr[-3000:]
  assert re.fullmatch(
      rf"error: disk full: {disk}/w/checkpoints/1\.orbax-checkpoint-tmp/\S+: "
      r"No space left on device", err[-1]), err[-1]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert len(err) < 10, proc.stderr  # Was 594 lines of orbax tracebacks.
  # The log lines come from our own files (and jax's backend search) only.
  logged = {m.group(1) for m in (re.match(r"[IWEF]\d{4} \S+ +\d+ (\S+):\d+\]",
                                          l) for l in err) if m}
  assert logged <= {"main.py", "xla_bridge.py"}, proc.stderr


def test_unknown_loss_kind_is_a_config_error():
  c = ml_collections.ConfigDict(dict(loss=dict(kind="ppo_typo")))
  with pytest.raises(config_lib.ConfigError, match="loss.kind 'ppo_typo'"):
    step_lib.TrainStep(None, c, None, None, None, None)
