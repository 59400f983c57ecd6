"""Entry point: `python -m swirl_jax.main --config=configs/x.py[:args]
--workdir=DIR [--config.a.b=v]`. Dispatches on `config.job`."""

import os
import sys

import jax
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from swirl_jax import distributed
from swirl_jax import jobs

config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with ':args'.", lock_config=True)
flags.DEFINE_string("workdir", None, "Where outputs and checkpoints go.")
flags.mark_flags_as_required(["config", "workdir"])

def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  distributed.initialize()  # Before anything touches a device.
  config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
  try:
    job = jobs.get(config.get("job", ""))
  except OSError as e:  # ml_collections defers a failed config load.
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    sys.exit(f"error: cannot load --config: {lines[-1] if lines else e}")
  except KeyError as e:
    sys.exit(f"error: {e.args[0]}")
  os.makedirs(workdir, exist_ok=True)
  distributed.check_shared_workdir(workdir)  # Multi-process: seen by all.
  logging.info("job %s, workdir %s, %d processes, %d devices", config.job,
               workdir, jax.process_count(), jax.device_count())
  job(config, workdir)


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
