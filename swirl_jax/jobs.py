"""Job registry: `config.job` names a function `run(config, workdir)`.

Entries are import paths, so `main` imports only the job it runs.
"""

import importlib
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
    "fit": "swirl_jax.fit:run",
}


def register(name: str, target: str) -> None:
  """Adds a job; `target` is 'package.module:function'."""
  JOBS[name] = target


def get(name: str) -> Callable:
  if name not in JOBS:
    raise KeyError(f"unknown job {name!r}; valid: {', '.join(sorted(JOBS))}")
  module, _, fn = JOBS[name].partition(":")
  return getattr(importlib.import_module(module), fn)
