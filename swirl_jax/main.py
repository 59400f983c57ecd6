"""Entry point: `python -m swirl_jax.main --config=configs/x.py[:args]
--workdir=DIR [--config.a.b=v]`. Dispatches on `config.job`; the data job's
workdir defaults to the data directory runs read (`paths.data_job_dir()`)."""

import ast
import logging as py_logging
import os
import re
import sys
from typing import Any, Callable

import jax
import tqdm
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from swirl_jax import distributed, errors, jobs, paths

# transformers (the tokenizers' library) says at import that PyTorch is
# missing; nothing here needs it. Nothing above imports it: config files
# and jobs, which may, load after this line.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with ':args'.", lock_config=True)
flags.DEFINE_string("workdir", None, "Where outputs and checkpoints go "
                    "(the data job: where the data goes; default "
                    "$SWIRL_JAX_DATA, else ~/.cache/swirl_jax/data).")
flags.DEFINE_boolean("traceback", False,
                     "Show the traceback of a known user error.")
flags.DEFINE_boolean("checkpoint_info", False,
                     "Log the checkpoint library's INFO lines.")
# --workdir is checked in main: the data job has a default.
flags.mark_flags_as_required(["config"])

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


def _between_bars(handler) -> None:
  """Makes `handler` clear the progress bars, write its line and redraw
  them, so a log line never shares a bar's line."""
  if getattr(handler.emit, "between_bars", False):
    return
  emit = handler.emit

  def emit_between_bars(record):
    with tqdm.tqdm.external_write_mode(file=sys.stderr):
      emit(record)
  emit_between_bars.between_bars = True
  handler.emit = emit_between_bars


def _end_bars() -> None:
  """Closes the progress bars still drawn (each ends its line)."""
  for bar in list(getattr(tqdm.tqdm, "_instances", ())):
    bar.close()


def _fail(line: str) -> None:
  """Ends the process: `error: <line>` on stderr, exit status 2."""
  _end_bars()  # The error starts a line of its own.
  logging.flush()
  sys.stdout.flush()
  print(f"error: {line}", file=sys.stderr, flush=True)
  # Not sys.exit: the checkpoint library's background threads would print
  # their own reports of the same fault after this line while exiting.
  os._exit(2)  # pylint: disable=protected-access


def _default_workdir(config) -> str:
  """The data job writes where runs look; every other job needs --workdir."""
  if config.get("job") == "data":
    return paths.data_job_dir()
  _fail("--workdir is required (where outputs and checkpoints go)")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  distributed.initialize()  # Before anything touches a device.
  config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
  try:
    jobs.check(config.get("job", ""))
  except OSError as e:  # ml_collections defers a failed config load.
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    _fail(f"cannot load --config: {lines[-1] if lines else e}")
  except KeyError as e:
    _fail(e.args[0])
  workdir = workdir or _default_workdir(config)
  logging.get_absl_handler().addFilter(_quiet_orbax)
  _between_bars(logging.get_absl_handler().python_handler)
  if not flags.FLAGS.traceback:
    sys.unraisablehook = _quiet_unraisable
  logging.info("job %s, workdir %s, %d processes, %d devices", config.job,
               workdir, jax.process_count(), jax.device_count())

  def run():
    _warn_ignored_presets(
        config, config_flags.get_override_values(flags.FLAGS["config"]))
    jobs.validate(config)  # Before anything is written.
    # After validate: a job's module imports seconds of libraries, which a
    # config that names something absent need not wait for.
    job = jobs.get(config.job)
    errors.check_writable(workdir)  # Creates it.
    distributed.check_shared_workdir(workdir)  # Multi-process: seen by all.
    job(config, workdir)
  reporting_errors(run, traceback=flags.FLAGS.traceback)


def reporting_errors(run: Callable[[], Any], traceback: bool = False) -> Any:
  """`run()`. A user error ends the process with its one line (`_fail`);
  any other error its traceback, then exit status 1. With several
  processes the exit is immediate: the others have ended or are ending
  on the same error (`distributed.fail_together`), and JAX's exit-time
  shutdown would wait for them at a barrier they never reach."""
  try:
    return run()
  except Exception as e:  # pylint: disable=broad-except
    line = errors.one_line(e)
    if line is not None and not traceback:
      _fail(line)
    if jax.process_count() == 1:
      raise
    _end_bars()
    logging.exception("the job failed")
    logging.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # pylint: disable=protected-access


# A class named by its module path ("swirl_jax.config_lib.ConfigError: "),
# as a config file's traceback ends: the user reads the message alone.
_DOTTED_CLASS = re.compile(r"^(?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*: ")


def _unquoted(text: str) -> str:
  """The text of a message that arrives as a string's repr (perhaps
  twice over: ml_collections raises the repr of a KeyError's key)."""
  for _ in range(3):
    if len(text) < 2 or text[0] != text[-1] or text[0] not in "'\"":
      break
    try:
      text = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      break
  return str(text)


def _unknown_key_line(e: BaseException, argv) -> str:
  """'unknown config key 'lrr' in --config.optim.lrr=1; did you mean
  'lr'?' from ml_collections' KeyError / AttributeError."""
  lines = _unquoted(str(e.args[0]) if e.args else "").splitlines()
  key = _unquoted(lines[0].strip()) if lines else "?"
  flag = next((a for a in argv if a.startswith("--config.") and
               key in a.partition("=")[0].split(".")), "")
  line = f"unknown config key {key!r}" + (f" in {flag}" if flag else "")
  hint = re.search(r'Did you mean "([^"]+)"', " ".join(lines[1:]))
  return line + (f"; did you mean {hint.group(1)!r}?" if hint else "")


def _parse_flags(argv):
  """absl flag parsing, with a bad config reported in one line."""
  try:
    return flags.FLAGS(argv)
  except (KeyError, AttributeError) as e:  # --config.bad.key=...
    _fail(_unknown_key_line(e, argv))
  except (flags.Error, OSError, ValueError) as e:
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    # A config file that raised: its traceback's last line.
    _fail(_DOTTED_CLASS.sub("", lines[-1]) if lines else type(e).__name__)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
