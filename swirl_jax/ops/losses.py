"""Policy-gradient, clipped-surrogate and SFT losses over `[B, T]` tokens.

Every loss is pure and returns `(loss, metrics)`. Inputs are per-token
log-probs (`ops.logprobs.token_logprobs`) and `loss_mask_BT`: nonzero on the
tokens the policy wrote and is trained on; 0 on prompt, tool output and
padding. Masked tokens contribute nothing to the loss or its gradient, even
if their inputs are inf or NaN, and a row whose mask is all zero (a void
trajectory, a padding row) is left out of every average.

Metrics are float32 scalars; averages over tokens are over loss tokens.
"""

import math

import jax
import jax.numpy as jnp

from swirl_jax.ops.logprobs import masked_mean
from swirl_jax.ops.logprobs import masked_sum

AGG_MODES = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean")

# Log-ratios are clamped before `exp` so one wild token cannot overflow to
# inf (and then NaN through `0 * inf` in the backward pass). Beyond +-20 the
# clipped objectives have (near) zero gradient anyway.
_MAX_LOG_RATIO = 20.0


def aggregate(per_token_BT, mask_BT, mode: str):
  """Reduces per-token losses to a scalar.

  token_mean: sum over all loss tokens / number of loss tokens.
  seq_mean_token_sum: per row, the sum over its loss tokens; mean over rows.
  seq_mean_token_mean: per row, the mean over its loss tokens; mean over rows.

  Rows without loss tokens are left out of the mean over rows, just as
  `token_mean` has none of their tokens, so all three modes ignore them
  alike (and give 0, not NaN, when no row has a loss token). The means are
  over this batch: with gradient accumulation, `token_mean` over
  micro-batches is not the token mean of the whole batch.
  """
  if mode == "token_mean":
    return masked_mean(per_token_BT, mask_BT)
  if mode == "seq_mean_token_sum":
    per_row_B = masked_sum(per_token_BT, mask_BT, axis=-1)
  elif mode == "seq_mean_token_mean":
    per_row_B = masked_mean(per_token_BT, mask_BT, axis=-1)
  else:
    raise ValueError(f"agg must be one of {AGG_MODES}, got {mode!r}")
  return masked_mean(per_row_B, _row_has_tokens(mask_BT))


def _row_has_tokens(mask_BT):
  return jnp.any(jnp.asarray(mask_BT) != 0, axis=-1)


def _log_ratio(logp_BT, other_BT, mask_BT):
  """`logp - other`, 0 on masked tokens (so `exp` of it is safe there)."""
  diff_BT = jnp.where(jnp.asarray(mask_BT) != 0, logp_BT - other_BT, 0.0)
  return jnp.clip(diff_BT, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def k3_kl(logp_BT, ref_logp_BT, mask_BT):
  """Per-token k3 estimate of KL(pi || pi_ref): `exp(d) - d - 1`.

  d = ref_logp - logp (clamped to +-20). On tokens sampled from pi it is
  unbiased and never negative. As a loss, its gradient is in expectation
  that of KL(pi_ref || pi) (as in GRPO); both vanish at pi = pi_ref. The
  reference is frozen: no gradient flows to `ref_logp_BT`. 0 on masked
  tokens.
  """
  d_BT = -_log_ratio(logp_BT, jax.lax.stop_gradient(ref_logp_BT), mask_BT)
  return jnp.where(jnp.asarray(mask_BT) != 0, jnp.expm1(d_BT) - d_BT, 0.0)


def _common_metrics(mask_BT, entropy_BT):
  metrics = {
      "num_loss_tokens": jnp.sum(jnp.asarray(mask_BT) != 0),
      "num_loss_rows": jnp.sum(_row_has_tokens(mask_BT)),
  }
  if entropy_BT is not None:
    metrics["entropy"] = masked_mean(entropy_BT, mask_BT)
  return metrics


def _add_kl(loss, metrics, logp_BT, ref_logp_BT, mask_BT, kl_coef, agg):
  """Adds `kl_coef * KL` aggregated like the policy loss, if a ref is given."""
  if ref_logp_BT is None:
    return loss, metrics
  kl_BT = k3_kl(logp_BT, ref_logp_BT, mask_BT)
  kl = aggregate(kl_BT, mask_BT, agg)
  metrics = dict(metrics, kl=masked_mean(kl_BT, mask_BT), kl_loss=kl)
  return loss + kl_coef * kl, metrics


def mismatch_metrics(trainer_logp_BT, sampler_logp_BT, mask_BT,
                     band=(0.5, 2.0)):
  """How far the sampler's log-probs are from the trainer's, per loss token.

  Both score the same tokens (drawn from the sampler) under the same
  params; they differ by numerics alone (bf16 sampling vs fp32 training,
  other kernels). With r = pi_trainer / pi_sampler:
    mismatch_abs_mean / _max   mean and max |log pi_sampler - log pi_trainer|
    mismatch_kl                k3 estimate of KL(sampler || trainer),
                               r - 1 - log r (the tokens are the sampler's)
    mismatch_out_frac          share of tokens with r outside `band`
  No gradient flows through them.
  """
  mask_BT = jnp.asarray(mask_BT)
  on_BT = mask_BT != 0
  d_BT = _log_ratio(jax.lax.stop_gradient(trainer_logp_BT),
                    jax.lax.stop_gradient(sampler_logp_BT), mask_BT)
  abs_BT = jnp.abs(d_BT)
  lo, hi = math.log(band[0]), math.log(band[1])
  out_BT = (d_BT < lo) | (d_BT > hi)
  return dict(
      mismatch_abs_mean=masked_mean(abs_BT, mask_BT),
      mismatch_abs_max=jnp.max(jnp.where(on_BT, abs_BT, 0.0)),
      mismatch_kl=masked_mean(jnp.expm1(d_BT) - d_BT, mask_BT),
      mismatch_out_frac=masked_mean(out_BT.astype(jnp.float32), mask_BT))


def tis_weights(trainer_logp_BT, sampler_logp_BT, mask_BT, cap: float):
  """Truncated importance weights `min(pi_trainer / pi_sampler, cap)`.

  Token-level "rollout correction": the tokens were drawn from the sampler,
  whose distribution differs from the trainer's by numerics; weighting each
  token's loss by this ratio, truncated at `cap` so one token cannot take
  over, makes the update the trainer's own policy gradient in expectation.
  A constant (no gradient); 0 on masked tokens.
  """
  d_BT = _log_ratio(jax.lax.stop_gradient(trainer_logp_BT),
                    jax.lax.stop_gradient(sampler_logp_BT), mask_BT)
  w_BT = jnp.minimum(jnp.exp(d_BT), cap)
  return jnp.where(jnp.asarray(mask_BT) != 0, w_BT, 0.0)


def _finish(loss, metrics):
  metrics = dict(metrics, loss=loss)
  return loss, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}


def stepwise_pg_loss(logp_BT, loss_mask_BT, rewards_B, *, baseline_B=None,
                     ref_logp_BT=None, kl_coef: float = 0.0,
                     agg: str = "seq_mean_token_sum", entropy_BT=None,
                     sampler_logp_BT=None, old_logp_BT=None,
                     tis_cap: float = 0.0):
  """SWiRL stage 2: REINFORCE on whole actions, one reward per step.

  Each row is one (state, action) unit; its loss is
  `-(reward - baseline) * sum_t logp` over the action's tokens (the default
  `agg` sums tokens and averages rows), plus `kl_coef` times the k3 KL to a
  frozen reference, aggregated the same way (so with the default it is the
  KL of the whole action). The baseline only reduces variance: no gradient
  flows through rewards or baseline. With the sampler's and the trainer's
  log-probs of the actions (`sampler_logp_BT`, `old_logp_BT`) it reports
  their mismatch, and `tis_cap` > 0 weights each token by the truncated
  ratio, as in `clipped_surrogate_loss`.
  """
  rewards_B = jax.lax.stop_gradient(jnp.asarray(rewards_B, jnp.float32))
  adv_B = rewards_B
  if baseline_B is not None:
    adv_B = adv_B - jax.lax.stop_gradient(baseline_B)
  per_token_BT = -adv_B[:, None] * logp_BT
  extra = {}
  if sampler_logp_BT is not None or tis_cap > 0:
    extra = _sampler_correction(old_logp_BT, sampler_logp_BT, loss_mask_BT,
                                tis_cap)
  if tis_cap > 0:
    per_token_BT = per_token_BT * extra.pop("tis_weight_BT")
  pg_loss = aggregate(per_token_BT, loss_mask_BT, agg)
  rows_B = _row_has_tokens(loss_mask_BT)
  metrics = dict(
      _common_metrics(loss_mask_BT, entropy_BT),
      pg_loss=pg_loss,
      reward_mean=masked_mean(rewards_B, rows_B),
      advantage_mean=masked_mean(adv_B, rows_B),
      action_logp=masked_mean(masked_sum(logp_BT, loss_mask_BT, axis=-1),
                              rows_B),
      **extra,
  )
  loss, metrics = _add_kl(pg_loss, metrics, logp_BT, ref_logp_BT,
                          loss_mask_BT, kl_coef, agg)
  return _finish(loss, metrics)


def clipped_surrogate_loss(logp_BT, behaviour_logp_BT, advantages,
                           loss_mask_BT, *, eps_low: float = 0.2,
                           eps_high: float = 0.28,
                           dual_clip_c: float | None = 3.0,
                           agg: str = "token_mean", ref_logp_BT=None,
                           kl_coef: float = 0.0, entropy_BT=None,
                           old_logp_BT=None, tis_cap: float = 0.0):
  """PPO clipped surrogate with asymmetric clip and dual-clip (SimpleTIR).

  Per token, with r = exp(logp - behaviour_logp) and advantage A:
    clipped = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
    loss = min(clipped, -c A) if A < 0 and dual_clip_c else clipped
  Dual-clip bounds the loss of a negative-advantage token whose ratio has
  run far above 1 (c = 3 in SimpleTIR), where plain PPO is unbounded.

  Args:
    advantages: `[B]` (one per row) or `[B, T]` (one per token).
    Other args: see the module docstring; `ref_logp_BT`/`kl_coef` add the k3
      KL to a reference (off in SimpleTIR).
    old_logp_BT: the trainer's own log-probs of the tokens under the params
      that sampled them; when given, r = exp(logp - old_logp) (the sampler's
      `behaviour_logp_BT` then only enters the mismatch metrics and TIS).
    tis_cap: > 0 weights each token's loss by `tis_weights(old_logp,
      behaviour_logp, cap)` (needs `old_logp_BT`); 0 is off.

  Metrics: `clip_frac_low` (A < 0 and r < 1 - eps_low), `clip_frac_high`
  (A > 0 and r > 1 + eps_high), `dual_clip_frac` (A < 0 and -c A won),
  `ratio_mean`, `ratio_max`, and `approx_kl`, the k3 estimate
  `r - 1 - log r` of KL(behaviour || current), all over loss tokens.
  """
  mask_BT = jnp.asarray(loss_mask_BT)
  adv = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
  adv_BT = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv,
                            logp_BT.shape)
  adv_BT = jnp.where(mask_BT != 0, adv_BT, 0.0)
  behaviour_BT = jax.lax.stop_gradient(behaviour_logp_BT)
  denom_BT = behaviour_BT if old_logp_BT is None else \
      jax.lax.stop_gradient(old_logp_BT)
  log_ratio_BT = _log_ratio(logp_BT, denom_BT, mask_BT)
  ratio_BT = jnp.exp(log_ratio_BT)

  unclipped_BT = -adv_BT * ratio_BT
  clipped_BT = -adv_BT * jnp.clip(ratio_BT, 1 - eps_low, 1 + eps_high)
  per_token_BT = jnp.maximum(unclipped_BT, clipped_BT)
  dual_BT = jnp.zeros_like(mask_BT, bool)
  if dual_clip_c is not None:
    cap_BT = -dual_clip_c * adv_BT
    dual_BT = (adv_BT < 0) & (cap_BT < per_token_BT)
    per_token_BT = jnp.where(dual_BT, cap_BT, per_token_BT)
  extra = _sampler_correction(old_logp_BT, behaviour_BT, mask_BT, tis_cap)
  if tis_cap > 0:
    per_token_BT = per_token_BT * extra.pop("tis_weight_BT")
  pg_loss = aggregate(per_token_BT, mask_BT, agg)

  def frac(x_BT):
    return masked_mean(x_BT.astype(jnp.float32), mask_BT)

  metrics = dict(
      _common_metrics(mask_BT, entropy_BT),
      pg_loss=pg_loss,
      clip_frac_low=frac((adv_BT < 0) & (ratio_BT < 1 - eps_low)),
      clip_frac_high=frac((adv_BT > 0) & (ratio_BT > 1 + eps_high)),
      dual_clip_frac=frac(dual_BT),
      ratio_mean=masked_mean(ratio_BT, mask_BT),
      ratio_max=jnp.max(jnp.where(mask_BT != 0, ratio_BT, 0.0)),
      approx_kl=masked_mean(jnp.expm1(log_ratio_BT) - log_ratio_BT, mask_BT),
      advantage_mean=masked_mean(adv_BT, mask_BT),
      **extra,
  )
  loss, metrics = _add_kl(pg_loss, metrics, logp_BT, ref_logp_BT, mask_BT,
                          kl_coef, agg)
  return _finish(loss, metrics)


def _sampler_correction(trainer_logp_BT, sampler_logp_BT, mask_BT,
                        tis_cap: float) -> dict:
  """Mismatch metrics, and with `tis_cap` > 0 the TIS weights (under the
  key 'tis_weight_BT', with their mean as a metric)."""
  if trainer_logp_BT is None or sampler_logp_BT is None:
    if tis_cap > 0:
      raise ValueError("tis_cap needs the sampler's and the trainer's "
                       "log-probs of the tokens")
    return {}
  out = mismatch_metrics(trainer_logp_BT, sampler_logp_BT, mask_BT)
  if tis_cap > 0:
    w_BT = tis_weights(trainer_logp_BT, sampler_logp_BT, mask_BT, tis_cap)
    out.update(tis_weight_BT=w_BT, tis_weight_mean=masked_mean(w_BT, mask_BT),
               tis_clip_frac=masked_mean(
                   (w_BT >= tis_cap).astype(jnp.float32), mask_BT))
  return out


def sft_loss(logp_BT, loss_mask_BT, *, agg: str = "token_mean",
             entropy_BT=None):
  """Cross-entropy (negative log-likelihood) on the loss tokens."""
  loss = aggregate(-logp_BT, loss_mask_BT, agg)
  metrics = dict(_common_metrics(loss_mask_BT, entropy_BT),
                 nll=masked_mean(-logp_BT, loss_mask_BT))
  return _finish(loss, metrics)
