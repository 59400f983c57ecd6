"""Measurements on an update's batch beside the train step (no update).

  probe = Probe.for_trainer(trainer)
  extra = probe.mismatch(trainer.policy_params(), batch)   # one forward
  norm = probe.grad_norm(trainer.policy_params(), rows)    # one backward

`mismatch` scores the sampled tokens with the trainer's forward under the
params that sampled them and compares with the sampler's log-probs
(`ops.losses.mismatch_metrics`): they differ by numerics alone, so this is
the sampler-trainer mismatch before any update moves the params (inside
the step, later mini-batches mix it with the policy's own change; given
newer params than those that sampled, it holds the policy's change too).
With truncated importance sampling on (`loss.tis_cap` > 0) it also sets
`batch['old_logprobs']`, which the step's ratio and TIS weights read: with
`old_logprobs='trainer'` those log-probs, so the one forward serves both;
with 'sampler' the sampler's own (`behaviour_logprobs`), so the ratio is
against the policy that sampled, as that setting says, and TIS weighs
nothing more (its ratio is 1).

Log-probs stay on the devices, laid out as the batch is (global arrays on
several hosts); only the mismatch's scalars come to the host.
`grad_norm` is the global norm of the loss gradient on a batch, before
clipping, as the step would take it; with LoRA it is over the merged
params.
"""

import functools

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from swirl_jax import sharding as shd
from swirl_jax.ops import losses
from swirl_jax.training import step as step_lib

OLD_LOGPROBS = ("trainer", "sampler")


class Probe:
  """Jitted forward / backward over one model config and mesh."""

  def __init__(self, cfg, mesh, param_shardings, loss_cfg,
               rules=shd.DEFAULT_RULES, old_logprobs: str = "trainer"):
    if old_logprobs not in OLD_LOGPROBS:
      raise ValueError(f"old_logprobs {old_logprobs!r}; valid: "
                       f"{', '.join(OLD_LOGPROBS)}")
    self.cfg, self.mesh, self.rules = cfg, mesh, rules
    # Whose log-probs the ratio's old ones are (`old_logprobs` of the
    # SimpleTIR config; SWiRL's are the trainer's).
    self.old_logprobs = old_logprobs
    self.param_shardings = param_shardings
    self.loss_cfg = step_lib.default_loss_config().lock()
    self.loss_cfg.update(dict(loss_cfg.items()) if loss_cfg else {})
    self._logp = step_lib.make_logprob_fn(
        cfg, mesh, param_shardings, chunk_size=int(self.loss_cfg.chunk_size),
        rules=rules)
    self._grad = {}
    self.tis = float(self.loss_cfg.tis_cap) > 0

  @classmethod
  def for_trainer(cls, trainer, old_logprobs: str = "trainer") -> "Probe":
    """Over `trainer.policy_params()` (LoRA merged: the base's shardings)."""
    s = trainer.shardings
    params = s.params if trainer.state.frozen is None else s.frozen
    return cls(trainer.model_cfg, trainer.mesh, params,
               trainer.config.get("loss", None), old_logprobs=old_logprobs)

  def _sampler_side(self, batch):
    """The sampler's log-probs, when they are the old ones and the batch
    has them; else None."""
    if self.old_logprobs != "sampler":
      return None
    return batch.get("behaviour_logprobs")

  def logprobs(self, params, batch, rows: int = 0):
    """The trainer's log-probs [B, T] of `batch['tokens']` under `params`,
    aligned with the tokens (column 0 is 0): `rows` rows a forward (0:
    all at once), so no forward holds more than that many rows'
    activations, joined on the devices and laid out as
    `batch['tokens']` is (a device array; a host batch's: as the
    trainer's step takes it). Nothing goes to the host."""
    keys = ("tokens", "attention_mask", "positions")
    b = len(batch["tokens"])
    rows = rows or b
    parts = [self._logp(params, {k: batch[k][lo:lo + rows] for k in keys
                                 if batch.get(k) is not None})
             for lo in range(0, b, rows)]
    ref = batch["tokens"]
    sharding = (ref.sharding if isinstance(ref, jax.Array) else
                step_lib.batch_sharding(self.mesh, b, self.rules))
    joined = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
    return jax.device_put(joined, sharding)  # Device to device.

  def mismatch(self, params, batch, logp_BT=None) -> dict[str, float]:
    """`mismatch_*` metrics of `batch['behaviour_logprobs']` vs `params`
    (and `batch['old_logprobs']` set, with TIS on: the trainer's, or the
    sampler's with `old_logprobs='sampler'`); `logp_BT`: the trainer's
    log-probs when the caller has them already (`logprobs`). Reduced on
    the devices: only the scalars reach the host."""
    if logp_BT is None:
      logp_BT = self.logprobs(params, batch)
    if self.tis:
      sampler = self._sampler_side(batch)
      batch["old_logprobs"] = logp_BT if sampler is None else sampler
    m = _mismatch(NamedSharding(logp_BT.sharding.mesh, P()), logp_BT,
                  batch["behaviour_logprobs"], batch["loss_mask"])
    return {k: float(v) for k, v in jax.device_get(m).items()}

  def grad_norm(self, params, batch) -> float:
    """Global norm of the loss gradient on `batch` (one backward). With
    TIS, where the batch has no old log-probs, they are the update's:
    the sampler's with `old_logprobs='sampler'` (where the batch has
    them), else the trainer's under `params`."""
    if self.tis and batch.get("old_logprobs") is None:
      old = self._sampler_side(batch)
      batch = dict(batch, old_logprobs=self.logprobs(params, batch)
                   if old is None else old)
    b = len(batch["tokens"])
    spec = shd.logical_to_spec(("batch",), (b,), self.mesh, self.rules)
    sharding = NamedSharding(self.mesh, spec)
    if b not in self._grad:
      def norm(p, bt):
        f = lambda q: step_lib.policy_loss(q, self.cfg, self.loss_cfg, bt)[0]
        return optax.tree.norm(jax.grad(f)(p))
      self._grad[b] = jax.jit(norm, in_shardings=(self.param_shardings,
                                                  sharding))
    with shd.use_mesh(self.mesh, self.rules):
      return float(self._grad[b](params,
                                 step_lib.place_batch(batch, sharding)))


@functools.partial(jax.jit, static_argnums=0)
def _mismatch(sharding, logp_BT, behaviour_BT, mask_BT):
  """`losses.mismatch_metrics` over the shifted tokens, each scalar laid
  out by `sharding` (whole on every device)."""
  m = losses.mismatch_metrics(logp_BT[:, 1:], behaviour_BT[:, 1:],
                              mask_BT[:, 1:])
  return jax.lax.with_sharding_constraint(m, sharding)
