"""Defaults that fit: 'auto' config fields resolved from the model's size,
the device count and the backend, once, at job start.

  train.mesh            'auto': FSDP over all devices for models of at least
                        1B params, else data parallel over all of them. A
                        list of (axis, size), or its literal as a string
                        (what a command line can pass), is kept.
  train.micro_batches   0: as many as the per-device token budget
                        `train.tokens_per_device` asks for, chosen per batch
                        shape by the step (`micro_batches_for`), so a
                        mini-batch of any size runs.
  model.remat           'auto': 'full' from 1B params, else 'none'.
  model.dtype           'auto': bfloat16 on accelerators, float32 on a CPU.
  model.param_dtype     'auto': float32 (master weights; the optimizer
                        state follows the params' dtype).
Fields set to anything else are left as they are.
"""

import ast

import jax

from swirl_jax import config_lib
from swirl_jax.models import presets
# The size rules live beside the loader, which resolves the same 'auto'
# fields on the model it loads.
from swirl_jax.models.loading import BIG_MODEL_PARAMS, num_params
from swirl_jax.models.loading import resolve_model_block

def resolve_mesh(mesh, num_params: int) -> list[tuple[str, int]]:
  """The mesh spec for `train.mesh` (see the module doc)."""
  if isinstance(mesh, str):
    if mesh != "auto":
      try:
        return [tuple(x) for x in ast.literal_eval(mesh)]
      except (ValueError, SyntaxError, TypeError):
        raise config_lib.ConfigError(f"train.mesh {mesh!r}: 'auto' or a "
                                     "list of (axis, size) pairs") from None
    if num_params >= BIG_MODEL_PARAMS:
      return [("data", 1), ("fsdp", -1), ("tensor", 1)]
    return [("data", -1), ("fsdp", 1), ("tensor", 1)]
  return [tuple(x) for x in mesh]


def micro_batches_for(config, rows: int, length: int, data_shards: int
                      ) -> int:
  """Micro-batches for a `[rows, length]` batch over `data_shards` row
  shards: `config.micro_batches` when set (> 0); else the fewest that keep
  each device's micro-batch within `config.tokens_per_device` tokens, among
  those that split the rows evenly over the shards."""
  fixed = int(config.get("micro_batches", 0) or 0)
  if fixed > 0:
    return fixed
  budget = int(config.get("tokens_per_device", 0) or 0)
  per_shard = max(rows // max(data_shards, 1), 1)
  if budget <= 0 or rows % max(data_shards, 1):
    return 1
  for m in range(1, per_shard + 1):
    if per_shard % m == 0 and (per_shard // m) * length <= budget:
      return m
  return per_shard  # One row per device per micro-batch: the least.


def preset_params(model) -> int:
  """Parameter count of `config.model`'s preset (no weights read)."""
  return num_params(presets.get_preset(model.preset))


def resolve_config(config, backend: str | None = None):
  """Resolves `config.model`'s 'auto' fields in place (call at job start,
  before the model is built); returns the config. Each trainer resolves
  its own mesh (`resolve_mesh`) and micro-batches (`micro_batches_for`)."""
  model = config.get("model")
  if model is not None:
    resolve_model_block(model, preset_params(model), backend)
  return config
