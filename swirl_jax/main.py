"""Entry point: `python -m swirl_jax.main --config=configs/x.py[:args]
--workdir=DIR [--config.a.b=v]`. Dispatches on `config.job`."""

import os
import sys

import jax
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from swirl_jax import jobs

config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with ':args'.", lock_config=True)
flags.DEFINE_string("workdir", None, "Where outputs and checkpoints go.")
flags.DEFINE_boolean("traceback", False,
                     "Show the traceback of a known user error.")
flags.DEFINE_boolean("checkpoint_info", False,
                     "Log the checkpoint library's INFO lines.")
flags.mark_flags_as_required(["config", "workdir"])

# Set by launchers when several processes form one job.
_MULTIPROCESS_ENV = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS")


def _is_multiprocess() -> bool:
  if any(os.environ.get(k) for k in _MULTIPROCESS_ENV):
    return True
  if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
    return True
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return len([h for h in hosts.split(",") if h]) > 1


def _quiet_orbax(record) -> bool:
  """Drops orbax's INFO lines and its threads' error dumps (the error is
  raised again in the main thread and reported there)."""
  if "/orbax/" not in record.pathname:
    return True
  if record.levelno < 30:
    return False
  return "raised an exception" not in str(record.msg)


def _warn_ignored_presets(config) -> None:
  """`--config.X.preset=` does nothing when X.checkpoint is set."""
  for arg in sys.argv[1:]:
    name = arg.split("=", 1)[0]
    if not (name.startswith("--config.") and name.endswith(".preset")):
      continue
    block = config
    for key in name[len("--config."):-len(".preset")].split("."):
      block = block.get(key) if hasattr(block, "get") else None
    if block is not None and block.get("checkpoint"):
      logging.warning("%s is ignored: the model comes from checkpoint %r, "
                      "which holds its own architecture", arg,
                      block.checkpoint)


def _run_job(job, config, workdir):
  from swirl_jax import config_lib  # pylint: disable=g-import-not-at-top
  try:
    config_lib.check_writable(workdir)
    _warn_ignored_presets(config)
    return job(config, workdir)
  except Exception as e:  # pylint: disable=broad-except
    msg = config_lib.user_message(e)
    if msg is None or flags.FLAGS.traceback:
      raise
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _is_multiprocess():
    jax.distributed.initialize()
  config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
  try:
    job = jobs.get(config.get("job", ""))
  except OSError as e:  # ml_collections defers a failed config load.
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    sys.exit(f"error: cannot load --config: {lines[-1] if lines else e}")
  except KeyError as e:
    sys.exit(f"error: {e.args[0]}")
  if not flags.FLAGS.checkpoint_info:
    logging.get_absl_handler().addFilter(_quiet_orbax)
  logging.info("job %s, workdir %s, %d processes, %d devices", config.job,
               workdir, jax.process_count(), jax.device_count())
  _run_job(job, config, workdir)


def _parse_flags(argv):
  """absl flag parsing, with a bad config reported in one line."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, OSError, KeyError, AttributeError, ValueError) as e:
    text = str(e).replace("\\n", "\n")
    lines = [l.strip().strip("'\"") for l in text.splitlines() if l.strip()]
    if isinstance(e, (KeyError, AttributeError)):  # --config.bad.key=...
      sys.exit(f"error: unknown config key {' '.join(lines)}")
    sys.exit(f"error: {lines[-1] if lines else type(e).__name__}")


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
