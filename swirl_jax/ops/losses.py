"""Policy-gradient, clipped-surrogate and SFT losses over `[B, T]` tokens.

Every loss is pure and returns `(loss, metrics)`. Inputs are per-token
log-probs (`ops.logprobs.token_logprobs`) and `loss_mask_BT`: nonzero on the
tokens the policy wrote and is trained on; 0 on prompt, tool output and
padding. Masked tokens contribute nothing to the loss or its gradient, even
if their inputs are inf or NaN, and a row whose mask is all zero (a void
trajectory, a padding row) is left out of every average.

Metrics are float32 scalars; averages over tokens are over loss tokens.
"""

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


def _finish(loss, metrics):
  metrics = dict(metrics, loss=loss)
  return loss, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}


def stepwise_pg_loss(logp_BT, loss_mask_BT, rewards_B, *, baseline_B=None,
                     ref_logp_BT=None, kl_coef: float = 0.0,
                     agg: str = "seq_mean_token_sum", entropy_BT=None):
  """SWiRL stage 2: REINFORCE on whole actions, one reward per step.

  Each row is one (state, action) unit; its loss is
  `-(reward - baseline) * sum_t logp` over the action's tokens (the default
  `agg` sums tokens and averages rows), plus `kl_coef` times the k3 KL to a
  frozen reference, aggregated the same way (so with the default it is the
  KL of the whole action). The baseline only reduces variance: no gradient
  flows through rewards or baseline.
  """
  rewards_B = jax.lax.stop_gradient(jnp.asarray(rewards_B, jnp.float32))
  adv_B = rewards_B
  if baseline_B is not None:
    adv_B = adv_B - jax.lax.stop_gradient(baseline_B)
  pg_loss = aggregate(-adv_B[:, None] * logp_BT, loss_mask_BT, agg)
  rows_B = _row_has_tokens(loss_mask_BT)
  metrics = dict(
      _common_metrics(loss_mask_BT, entropy_BT),
      pg_loss=pg_loss,
      reward_mean=masked_mean(rewards_B, rows_B),
      advantage_mean=masked_mean(adv_B, rows_B),
      action_logp=masked_mean(masked_sum(logp_BT, loss_mask_BT, axis=-1),
                              rows_B),
  )
  loss, metrics = _add_kl(pg_loss, metrics, logp_BT, ref_logp_BT,
                          loss_mask_BT, kl_coef, agg)
  return _finish(loss, metrics)


def clipped_surrogate_loss(logp_BT, behaviour_logp_BT, advantages,
                           loss_mask_BT, *, eps_low: float = 0.2,
                           eps_high: float = 0.28,
                           dual_clip_c: float | None = 3.0,
                           agg: str = "token_mean", ref_logp_BT=None,
                           kl_coef: float = 0.0, entropy_BT=None):
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
  log_ratio_BT = _log_ratio(logp_BT, behaviour_BT, mask_BT)
  ratio_BT = jnp.exp(log_ratio_BT)

  unclipped_BT = -adv_BT * ratio_BT
  clipped_BT = -adv_BT * jnp.clip(ratio_BT, 1 - eps_low, 1 + eps_high)
  per_token_BT = jnp.maximum(unclipped_BT, clipped_BT)
  dual_BT = jnp.zeros_like(mask_BT, bool)
  if dual_clip_c is not None:
    cap_BT = -dual_clip_c * adv_BT
    dual_BT = (adv_BT < 0) & (cap_BT < per_token_BT)
    per_token_BT = jnp.where(dual_BT, cap_BT, per_token_BT)
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
  )
  loss, metrics = _add_kl(pg_loss, metrics, logp_BT, ref_logp_BT, mask_BT,
                          kl_coef, agg)
  return _finish(loss, metrics)


def sft_loss(logp_BT, loss_mask_BT, *, agg: str = "token_mean",
             entropy_BT=None):
  """Cross-entropy (negative log-likelihood) on the loss tokens."""
  loss = aggregate(-logp_BT, loss_mask_BT, agg)
  metrics = dict(_common_metrics(loss_mask_BT, entropy_BT),
                 nll=masked_mean(-logp_BT, loss_mask_BT))
  return _finish(loss, metrics)
