"""Job registry: `config.job` names a function `run(config, workdir)`.

Entries are import paths, so `main` imports only the job it runs.
"""

import importlib
from typing import Callable

JOBS: dict[str, str] = {
    "chat": "swirl_jax.chat:run",
}


def register(name: str, target: str) -> None:
  """Adds a job; `target` is 'package.module:function'."""
  JOBS[name] = target


def get(name: str) -> Callable:
  if name not in JOBS:
    raise KeyError(f"unknown job {name!r}; valid: {', '.join(sorted(JOBS))}")
  module, _, fn = JOBS[name].partition(":")
  return getattr(importlib.import_module(module), fn)
