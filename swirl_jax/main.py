"""Entry point: `python -m swirl_jax.main --config=configs/x.py[:args]
--workdir=DIR [--config.a.b=v]`. Dispatches on `config.job`."""

import logging as py_logging
import os
import sys

import jax
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from swirl_jax import errors, jobs
from swirl_jax import distributed
from swirl_jax import jobs

config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with ':args'.", lock_config=True)
flags.DEFINE_string("workdir", None, "Where outputs and checkpoints go.")
flags.DEFINE_boolean("traceback", False,
                     "Show the traceback of a known user error.")
flags.DEFINE_boolean("checkpoint_info", False,
                     "Log the checkpoint library's INFO lines.")
flags.mark_flags_as_required(["config", "workdir"])

def _quiet_orbax(record) -> bool:
  """Drops the checkpoint library's INFO lines, and its threads' reports of
  an error that is raised again in the main thread (and reported there)."""
  if "/orbax/" not in record.pathname:
    return True
  if record.levelno < py_logging.WARNING:  # absl's WARNING is another scale.
    return flags.FLAGS.checkpoint_info
  return flags.FLAGS.traceback or not (
      record.exc_info or "raised an exception" in str(record.msg))


def _quiet_unraisable(u) -> None:
  """Drops tensorstore's callbacks into the event loop orbax closed after a
  failed write (each prints a traceback; the write's error is reported)."""
  if u.exc_type is RuntimeError and str(u.exc_value) == "Event loop is closed":
    return
  sys.__unraisablehook__(u)


def _warn_ignored_presets(config, overrides) -> None:
  """`--config.X.preset=` does nothing when X.checkpoint is set."""
  for key, value in overrides.items():
    block = config
    for part in key.split(".")[:-1]:
      block = block.get(part) if hasattr(block, "get") else None
    if key.endswith(".preset") and block is not None and \
        block.get("checkpoint"):
      logging.warning("--config.%s=%s is ignored: the model comes from "
                      "checkpoint %r, which holds its own architecture", key,
                      value, block.checkpoint)


def _fail(line: str) -> None:
  """Ends the process: `error: <line>` on stderr, exit status 2."""
  logging.flush()
  sys.stdout.flush()
  print(f"error: {line}", file=sys.stderr, flush=True)
  # Not sys.exit: the checkpoint library's background threads would print
  # their own reports of the same fault after this line while exiting.
  os._exit(2)  # pylint: disable=protected-access


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  distributed.initialize()  # Before anything touches a device.
  config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
  try:
    job = jobs.get(config.get("job", ""))
  except OSError as e:  # ml_collections defers a failed config load.
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    _fail(f"cannot load --config: {lines[-1] if lines else e}")
  except KeyError as e:
    _fail(e.args[0])
  logging.get_absl_handler().addFilter(_quiet_orbax)
  if not flags.FLAGS.traceback:
    sys.unraisablehook = _quiet_unraisable
  logging.info("job %s, workdir %s, %d processes, %d devices", config.job,
               workdir, jax.process_count(), jax.device_count())
  try:
    errors.check_writable(workdir)  # Creates it.
    distributed.check_shared_workdir(workdir)  # Multi-process: seen by all.
    _warn_ignored_presets(
        config, config_flags.get_override_values(flags.FLAGS["config"]))
    job(config, workdir)
  except Exception as e:  # pylint: disable=broad-except
    line = errors.one_line(e)
    if line is None or flags.FLAGS.traceback:
      raise
    _fail(line)


def _parse_flags(argv):
  """absl flag parsing, with a bad config reported in one line."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, OSError, KeyError, AttributeError, ValueError) as e:
    text = str(e).replace("\\n", "\n")
    lines = [l.strip().strip("'\"") for l in text.splitlines() if l.strip()]
    if isinstance(e, (KeyError, AttributeError)):  # --config.bad.key=...
      _fail(f"unknown config key {' '.join(lines)}")
    _fail(lines[-1] if lines else type(e).__name__)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
