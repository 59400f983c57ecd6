"""AdamW with a learning-rate schedule, built from an ml_collections config.

Gradient-norm clipping is not part of the optax chain: the step clips the
gradients itself, so it can report the norm before clipping (the figure
that shows instability) and skip non-finite updates before any optimizer
state moves.

Config fields (`config.optim`; missing ones take the defaults below):
  lr, b1, b2, eps, weight_decay      AdamW hyper-parameters.
  schedule                           'constant' | 'cosine' | 'linear'.
  warmup_steps                       linear warm-up from 0 to lr.
  decay_steps                        length of warm-up + decay (0: num_steps).
  end_lr_ratio                       final lr / lr for cosine and linear.
  grad_clip                          global-norm clip (<= 0: off); read by
                                     the step, not the optax chain.
"""

from typing import Any

import jax
import ml_collections
import optax

from swirl_jax import config_blocks

SCHEDULES = ("constant", "cosine", "linear")
# Parameters that weight decay leaves alone: norm scales and biases.
_NO_DECAY_NAMES = ("scale", "bias", "norm")


# The block lives with the other defaults, light for config files.
default_config = config_blocks.optim_config


def with_defaults(cfg: Any | None) -> ml_collections.ConfigDict:
  """`cfg` (a ConfigDict, dict or None) on top of `default_config()`."""
  out = default_config()
  if cfg is not None:
    unknown = set(cfg.keys()) - set(out.keys())
    if unknown:
      raise ValueError(f"optim config: unknown fields {sorted(unknown)}; "
                       f"valid: {sorted(out.keys())}")
    out.update(dict(cfg.items()))
  return out


def make_schedule(cfg, num_steps: int = 0) -> optax.Schedule:
  """Warm-up then constant / cosine / linear decay to `end_lr_ratio * lr`."""
  cfg = with_defaults(cfg)
  if cfg.schedule not in SCHEDULES:
    raise ValueError(f"optim.schedule {cfg.schedule!r}; valid: {SCHEDULES}")
  lr, warm = float(cfg.lr), int(cfg.warmup_steps)
  total = int(cfg.decay_steps) or int(num_steps)
  if cfg.schedule == "constant" or total <= warm:
    if cfg.schedule != "constant" and total <= warm:
      raise ValueError(f"optim.schedule={cfg.schedule!r} needs decay_steps "
                       f"(or num_steps) > warmup_steps={warm}; got {total}")
    main = optax.constant_schedule(lr)
  elif cfg.schedule == "cosine":
    main = optax.cosine_decay_schedule(lr, total - warm,
                                       alpha=float(cfg.end_lr_ratio))
  else:
    main = optax.linear_schedule(lr, lr * float(cfg.end_lr_ratio),
                                 total - warm)
  if warm <= 0:
    return main
  return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warm), main], [warm])


def decay_mask(params) -> Any:
  """False on norm scales and biases (by name), True on everything else."""
  def keep(path, _):
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    return not any(n in _NO_DECAY_NAMES or n.endswith("_bias") or "norm" in n
                   for n in names)
  return jax.tree_util.tree_map_with_path(keep, params)


def make_optimizer(cfg, num_steps: int = 0
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """`(tx, schedule)`: AdamW over whatever tree the step trains.

  With LoRA that tree is the adapters alone, so the frozen base carries no
  optimizer state at all.
  """
  cfg = with_defaults(cfg)
  schedule = make_schedule(cfg, num_steps)
  tx = optax.adamw(schedule, b1=float(cfg.b1), b2=float(cfg.b2),
                   eps=float(cfg.eps), weight_decay=float(cfg.weight_decay),
                   mask=decay_mask)
  return tx, schedule


def clip_by_global_norm(grads, max_norm: float):
  """`(clipped, norm_before)`; `max_norm <= 0` leaves the gradients alone."""
  norm = optax.tree.norm(grads)
  if max_norm <= 0:
    return grads, norm
  # Where the norm is inf/NaN the step skips the update; the scale value
  # there does not matter, only that it never divides by zero.
  scale = jax.numpy.minimum(1.0, max_norm / jax.numpy.maximum(norm, 1e-12))
  return jax.tree.map(lambda g: (g * scale).astype(g.dtype), grads), norm
