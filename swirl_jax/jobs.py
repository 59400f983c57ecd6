"""Job registry: `config.job` names a function `run(config, workdir)`.

Entries are import paths, so `main` imports only the job it runs.

`validate(config)` runs before any job writes anything: the model blocks
(a preset's name, a checkpoint or tokenizer path), then the data sets the
job's stages read. So a misspelt preset is named before a missing data file
could mask it, and neither leaves a file behind. Each job checks its own
stages, filters and judge blocks before its first stage.

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

import ml_collections

from swirl_jax import config_lib, paths
from swirl_jax.models import presets
from swirl_jax.tasks import datasets

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
    "simpletir_heldout": "swirl_jax.simpletir.seeds:run_heldout",
    "fit": "swirl_jax.fit:run",
    "view": "swirl_jax.viewer.job:run",
}


# Job -> the training blocks of its config that it trains with.
TRAINING_JOBS: dict[str, tuple[str, ...]] = {
    "swirl_pipeline": ("rl_train", "sft_train"),
    "swirl_rl": ("rl_train",),
    "swirl_sft": ("sft_train",),
    "simpletir_train": ("train",),
    "simpletir_seeds": ("train",),
    "simpletir_heldout": ("train",),
}
# Imported as the jobs are, only by a job that needs it.
FIT_CHECK = "swirl_jax.fit_programs"
_SKIP_ENV = "SWIRL_JAX_SKIP_FIT_CHECK"


# Job -> the data blocks it reads (field of config.data: its split field).
_SWIRL_DATA = (("train", "train_split"), ("eval", "eval_split"))
_SWIRL_STAGES_WITH_DATA = {"warmstart", "stage1", "filter", "rl", "eval"}


def _model_blocks(block):
  """Every model block a job may load (`preset` and `checkpoint` fields);
  a judge's only when it loads a model of its own."""
  for value in block.values():
    if not isinstance(value, ml_collections.ConfigDict):
      continue
    if "preset" in value and "checkpoint" in value:
      yield value
    elif value.get("kind") in ("http", "programmatic"):
      continue  # A judge that loads no model.
    elif value.get("kind") == "model" and "model" in value and \
        not value.model.get("checkpoint"):
      continue  # It borrows the policy, checked as the policy.
    else:
      yield from _model_blocks(value)


def _check_model(m, *, reads_weights: bool) -> None:
  """The preset the job builds (when no checkpoint names one) and the
  checkpoint and tokenizer paths it loads (a job that loads no weights,
  the fit job, reads the preset only)."""
  ckpt = m.get("checkpoint") or ""
  if (not ckpt or not reads_weights) and m.preset not in presets.PRESETS:
    presets.get_preset(m.preset)  # The one-line error naming the presets.
  for what in ("checkpoint", "tokenizer") if reads_weights else ():
    spec = m.get(what) or ""
    if spec == "bundled":
      paths.smollm2_gguf_path()  # Says how to install it.
    elif spec and not os.path.exists(spec):  # The loaders' own messages.
      raise FileNotFoundError(
          f"{spec}: checkpoint is missing (a .gguf file or a Hugging Face "
          "directory)" if what == "checkpoint" else f"tokenizer {spec!r}: "
          "not a .gguf file or a Hugging Face directory")


def _data_blocks(config) -> list[tuple[str, str | None]]:
  """(dataset, split) of every set the job's stages read."""
  job, d = config.get("job", ""), config.get("data") or {}
  sets = []
  if job.startswith("swirl_"):
    stages = {job[len("swirl_"):]} if job not in (
        "swirl_pipeline", "swirl_seeds") else set(
        s.strip() for part in ((config.stages,) if isinstance(
            config.stages, str) else config.stages)
        for s in part.split(","))
    if stages & _SWIRL_STAGES_WITH_DATA:
      sets += [(d.get(k), d.get(split) or None) for k, split in _SWIRL_DATA]
  if job in ("simpletir_train", "simpletir_heldout"):
    sets.append((d.get("train"), d.get("train_split") or None))
  if job in ("simpletir_eval", "simpletir_heldout"):
    sets += [(spec.partition(":")[0], spec.partition(":")[2] or None)
             for spec in config.eval.datasets]
  w = config.get("warmstart")
  if sets and w is not None and w.get("enabled"):
    sets.append((d.get("train"), w.split))
  return [(name, split) for name, split in sets if name]


def validate(config) -> None:
  """Checks the model blocks, then the job's data sets; one-line errors.
  Reads only (nothing is written)."""
  for block in _model_blocks(config):
    _check_model(block, reads_weights=config.get("job") != "fit")
  data = _data_blocks(config)
  if data:
    data_dir = config.data.get("data_dir") or None
    for name, split in dict.fromkeys(data):
      _check_dataset(name, split)
      datasets.load_tasks(name, split, data_dir, 1)


def _check_dataset(name: str, split: str | None) -> None:
  if name.startswith("tfds:"):
    return
  spec = datasets.DATASETS.get(name)
  if spec is None:
    raise config_lib.ConfigError(
        f"unknown dataset {name!r}; valid: "
        f"{', '.join(sorted(datasets.DATASETS))} or 'tfds:<name>'")
  if split is not None and str(split) not in spec.splits:
    raise config_lib.ConfigError(f"dataset {name!r} has no split {split!r};"
                                 f" splits: {', '.join(spec.splits)}")


def register(name: str, target: str) -> None:
  """Adds a job; `target` is 'package.module:function'."""
  JOBS[name] = target


def check(name: str) -> None:
  """KeyError naming the valid jobs when `name` is none of them."""
  if name not in JOBS:
    raise KeyError(f"unknown job {name!r}; valid: {', '.join(sorted(JOBS))}")


def get(name: str) -> Callable:
  check(name)
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
