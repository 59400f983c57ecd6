"""Job registry: `config.job` names a function `run(config, workdir)`.

Entries are import paths, so `main` imports only the job it runs.

Training jobs (`TRAINING_JOBS`) first check that their train step and
sampler fit the devices they run on (`fit_programs.check_devices`: compiled
from abstract inputs, before any weights load) and exit with the fit job's
figures and knobs in one line when they do not. The backend must report a
per-device memory limit (TPUs and GPUs do, a CPU does not: skipped).
SWIRL_JAX_SKIP_FIT_CHECK=1 skips the check.
"""

import functools
import importlib
import os
import sys
from typing import Callable

JOBS: dict[str, str] = {
    "chat": "swirl_jax.chat:run",
    "data": "swirl_jax.tasks.prepare:run",
    "swirl_pipeline": "swirl_jax.swirl.jobs:run_pipeline",
    "swirl_warmstart": "swirl_jax.swirl.jobs:run_warmstart_job",
    "swirl_stage1": "swirl_jax.swirl.jobs:run_stage1_job",
    "swirl_filter": "swirl_jax.swirl.jobs:run_filter_job",
    "swirl_rl": "swirl_jax.swirl.jobs:run_rl_job",
    "swirl_sft": "swirl_jax.swirl.jobs:run_sft_job",
    "swirl_eval": "swirl_jax.swirl.jobs:run_eval_job",
    "judge_calibration": "swirl_jax.swirl.calibration:run",
    "swirl_seeds": "swirl_jax.swirl.seeds:run",
    "simpletir_train": "swirl_jax.simpletir.train:run",
    "simpletir_eval": "swirl_jax.simpletir.evaluate:run",
    "simpletir_seeds": "swirl_jax.simpletir.seeds:run",
    "fit": "swirl_jax.fit:run",
}


# Job -> the training blocks of its config that it trains with.
TRAINING_JOBS: dict[str, tuple[str, ...]] = {
    "swirl_pipeline": ("rl_train", "sft_train"),
    "swirl_rl": ("rl_train",),
    "swirl_sft": ("sft_train",),
    "simpletir_train": ("train",),
    "simpletir_seeds": ("train",),
}
# Imported as the jobs are, only by a job that needs it.
FIT_CHECK = "swirl_jax.fit_programs"
_SKIP_ENV = "SWIRL_JAX_SKIP_FIT_CHECK"


def register(name: str, target: str) -> None:
  """Adds a job; `target` is 'package.module:function'."""
  JOBS[name] = target


def get(name: str) -> Callable:
  if name not in JOBS:
    raise KeyError(f"unknown job {name!r}; valid: {', '.join(sorted(JOBS))}")
  job = _load(JOBS[name])
  if name not in TRAINING_JOBS:
    return job
  return functools.partial(_checked, job, TRAINING_JOBS[name])


def _load(target: str) -> Callable:
  module, _, fn = target.partition(":")
  return getattr(importlib.import_module(module), fn)


def _checked(job: Callable, blocks: tuple[str, ...], config, workdir):
  """`job(config, workdir)` after the fit check passes."""
  if not os.environ.get(_SKIP_ENV):
    fit_programs = importlib.import_module(FIT_CHECK)
    try:
      fit_programs.check_devices(config, blocks)
    except fit_programs.DoesNotFit as e:
      sys.exit(f"error: {e} (or {_SKIP_ENV}=1 to run anyway)")
  return job(config, workdir)
