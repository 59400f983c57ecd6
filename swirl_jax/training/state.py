"""The train state, created already sharded on the mesh.

`params` is what the optimizer trains: the full model, or the LoRA adapters
alone, in which case the frozen base model sits in `frozen`. Creation follows
one pattern: `jax.eval_shape(init)` gives the state's shapes, the params'
logical axes give its shardings, and `jax.jit(init, out_shardings=...)`
builds it in place, so no device ever holds more than its shard.
"""

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from swirl_jax import sharding as shd
from swirl_jax.models import decoder
from swirl_jax.models.config import ModelConfig
from swirl_jax.training import lora


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 []: optimizer steps taken (skipped ones included).
  params: Any  # trainable tree: the model, or the LoRA adapters.
  opt_state: Any
  rng: jax.Array  # uint32 [2]: raw key data (checkpoints as a plain array).
  data_pos: jax.Array  # int32 []: batches consumed from the data stream.
  skipped: jax.Array  # int32 []: steps whose non-finite update was dropped.
  frozen: Any = None  # the base model under LoRA, else None.

  def model_params(self, lora_cfg=None):
    """Params for sampling and export (LoRA merged: a new copy)."""
    if self.frozen is None:
      return self.params
    return lora.merge(self.frozen, self.params, lora_cfg)


def param_shardings(cfg: ModelConfig, mesh: Mesh, rules=shd.DEFAULT_RULES):
  """NamedShardings of the model params from their logical axes."""
  return shd.tree_shardings(decoder.param_logical_axes(cfg),
                            decoder.abstract_params(cfg), mesh, rules)


def _trainable_shardings(cfg, lora_cfg, mesh, rules, abstract_trainable):
  if not lora.enabled(lora_cfg):
    return param_shardings(cfg, mesh, rules)
  axes = lora.logical_axes(decoder.param_logical_axes(cfg), lora_cfg)
  return shd.tree_shardings(axes, abstract_trainable, mesh, rules)


def _init(params, rng, *, tx, lora_cfg):
  rng, lora_rng = jax.random.split(rng)
  frozen = None
  if lora.enabled(lora_cfg):
    frozen, params = params, lora.init_adapters(params, lora_cfg, lora_rng)
  zero = jnp.zeros((), jnp.int32)
  return TrainState(step=zero, params=params, opt_state=tx.init(params),
                    rng=rng, data_pos=zero, skipped=zero, frozen=frozen)


def state_shardings(cfg: ModelConfig, tx: optax.GradientTransformation,
                    mesh: Mesh, lora_cfg=None, rules=shd.DEFAULT_RULES):
  """`(abstract_state, shardings)`: shapes of the state and where it lives."""
  init = functools.partial(_init, tx=tx, lora_cfg=lora_cfg)
  abstract = jax.eval_shape(init, decoder.abstract_params(cfg),
                            jax.ShapeDtypeStruct((2,), jnp.uint32))
  rep = NamedSharding(mesh, P())
  trainable = _trainable_shardings(cfg, lora_cfg, mesh, rules,
                                   abstract.params)
  opt = optax.tree_map_params(tx, lambda _, s: s, abstract.opt_state,
                              trainable, transform_non_params=lambda _: rep)
  frozen = param_shardings(cfg, mesh, rules) if abstract.frozen is not None \
      else None
  shardings = TrainState(step=rep, params=trainable, opt_state=opt, rng=rep,
                         data_pos=rep, skipped=rep, frozen=frozen)
  return abstract, shardings


def initial_params(cfg: ModelConfig, mesh: Mesh, seed: int = 0,
                   rules=shd.DEFAULT_RULES):
  """Random model params for `seed`, created sharded (what `create` uses)."""
  init_key = jax.random.split(jax.random.key(seed))[0]
  return decoder.init_params(cfg, init_key, param_shardings(cfg, mesh, rules))


def create(cfg: ModelConfig, tx: optax.GradientTransformation, mesh: Mesh, *,
           seed: int = 0, params=None, lora_cfg=None,
           rules=shd.DEFAULT_RULES, donate: bool = True):
  """`(state, shardings)`: a fresh state, created sharded.

  Args:
    params: model params (e.g. from `hf_io.load_hf_dir(..., mesh=mesh)`),
      ideally placed on the mesh already; None initialises them from `seed`.
      With `donate` (default) their buffers move into the state: do not
      reuse them afterwards.
  """
  _, shardings = state_shardings(cfg, tx, mesh, lora_cfg, rules)
  p_shard = param_shardings(cfg, mesh, rules)
  if params is None:
    params = initial_params(cfg, mesh, seed, rules)
  else:  # A no-op when the params sit where the rules put them already.
    params = jax.device_put(params, p_shard)
  state_key = jax.random.split(jax.random.key(seed))[1]
  rng = jax.device_put(jax.random.key_data(state_key),
                       NamedSharding(mesh, P()))
  init = jax.jit(functools.partial(_init, tx=tx, lora_cfg=lora_cfg),
                 in_shardings=(p_shard, NamedSharding(mesh, P())),
                 out_shardings=shardings,
                 donate_argnums=(0,) if donate else ())
  return init(params, rng), shardings
