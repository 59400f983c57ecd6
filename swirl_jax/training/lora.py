"""Low-rank adapters on the decoder's projection matrices.

With LoRA on, the step trains a small tree of adapters and keeps the base
params frozen. Training runs the adapters as a side path inside each
projection, `x @ W + (alpha/r) (x @ A) @ B` (`side_params`; the decoder's
`project`): the backward pass then computes gradients for A and B only,
never one the size of W, and no merged copy of W exists. Sampling and
export take merged weights `W + (alpha/r) A @ B` from `merge`, one jitted
program (compiled once per shapes and shardings).

Every targeted weight is stacked over layers and split into input dims and
output dims, e.g. q is `[L, D | N, H]` and o is `[L, N, H | D]`. Its adapter
is `a: [L, *in, r]` and `b: [L, r, *out]`, so it shards along the same
logical axes as the weight it adapts. `b` starts at zero: at step 0 the
merged model is exactly the base model.

Config fields (`config.lora`): rank (0: off), alpha, targets (names among
q, k, v, o, gate, up, down).
"""

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from swirl_jax import config_blocks

# target name -> (module in params['layers'], number of input dims).
TARGETS = {"q": ("attn", 1), "k": ("attn", 1), "v": ("attn", 1),
           "o": ("attn", 2), "gate": ("mlp", 1), "up": ("mlp", 1),
           "down": ("mlp", 1)}


# The block lives with the other defaults, light for config files.
default_config = config_blocks.lora_config


def enabled(cfg) -> bool:
  return cfg is not None and int(cfg.get("rank", 0)) > 0


def _targets(cfg) -> tuple[str, ...]:
  names = tuple(cfg.get("targets", TARGETS))
  bad = set(names) - set(TARGETS)
  if bad or not names:
    raise ValueError(f"lora.targets {names}: valid names are {list(TARGETS)}")
  return names


def _split(shape, n_in):
  """(L, in dims, out dims) of a stacked weight."""
  return shape[0], tuple(shape[1:1 + n_in]), tuple(shape[1 + n_in:])


def init_adapters(base_params, cfg, rng) -> dict:
  """`{name: {'a': [L, *in, r], 'b': [L, r, *out]}}`; `b` is zero."""
  r = int(cfg.rank)
  out = {}
  for i, name in enumerate(_targets(cfg)):
    mod, n_in = TARGETS[name]
    w = base_params["layers"][mod][name]
    L, ins, outs = _split(w.shape, n_in)
    a = jax.random.normal(jax.random.fold_in(rng, i), (L, *ins, r),
                          jnp.float32) / math.sqrt(math.prod(ins))
    out[name] = {"a": a.astype(w.dtype),
                 "b": jnp.zeros((L, r, *outs), w.dtype)}
  return out


def logical_axes(base_axes, cfg) -> dict:
  """Logical PartitionSpecs of the adapters, from those of the base."""
  out = {}
  for name in _targets(cfg):
    mod, n_in = TARGETS[name]
    axes = tuple(base_axes["layers"][mod][name])
    out[name] = {"a": P(axes[0], *axes[1:1 + n_in], None),
                 "b": P(axes[0], None, *axes[1 + n_in:])}
  return out


def scale(cfg) -> float:
  return float(cfg.alpha) / int(cfg.rank)


def side_params(base_params, adapters, cfg) -> dict:
  """Base params with the adapters under 'lora', laid out as the params
  (`{'layers': {module: {name: {'a', 'b'}}}}`) and the scale folded into
  `b`: what the decoder's side path reads."""
  s, side = scale(cfg), {}
  for name, ab in adapters.items():
    mod = TARGETS[name][0]
    side.setdefault(mod, {})[name] = {
        "a": ab["a"], "b": ab["b"] * jnp.asarray(s, ab["b"].dtype)}
  return dict(base_params, lora={"layers": side})


def _delta(a, b, n_in: int):
  """`A @ B` per layer, contracting the rank; keeps the structured dims."""
  n_out = b.ndim - 2
  ins, outs = "ijk"[:n_in], "xyz"[:n_out]
  return jnp.einsum(f"l{ins}r,lr{outs}->l{ins}{outs}", a, b,
                    preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnums=2)
def _merge(base_params, adapters, s: float):
  layers = dict(base_params["layers"])
  for name, ab in adapters.items():
    mod, n_in = TARGETS[name]
    w = layers[mod][name]
    layers[mod] = dict(layers[mod])
    layers[mod][name] = (w.astype(jnp.float32)
                         + s * _delta(ab["a"], ab["b"], n_in)).astype(w.dtype)
  return dict(base_params, layers=layers)


def merge(base_params, adapters, cfg) -> Any:
  """Base params with `(alpha / rank) * A @ B` added to each target: a new
  copy, for sampling and export (the one merge; training never merges)."""
  return _merge(base_params, adapters, scale(cfg))
