"""Losses against independent NumPy references; masks are exact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swirl_jax.ops import losses

MODES = losses.AGG_MODES
TOL = dict(rtol=1e-5, atol=1e-6)


def _batch(seed=0, B=4, T=6):
  """Log-probs, behaviour/ref log-probs spread so ratios hit every regime."""
  rng = np.random.RandomState(seed)
  logp = -rng.exponential(1.0, (B, T)).astype(np.float32)
  old = (logp + rng.normal(0, 1.2, (B, T))).astype(np.float32)
  ref = (logp + rng.normal(0, 0.5, (B, T))).astype(np.float32)
  mask = (rng.rand(B, T) < 0.7).astype(np.float32)
  mask[0, :2] = 1
  mask[-1] = 0  # an empty row (e.g. a void trajectory)
  adv_B = rng.normal(0, 1, B).astype(np.float32)
  return logp, old, ref, mask, adv_B


# ------------------------------------------------------- NumPy references


def np_aggregate(x, mask, mode):
  rows = [[x[b, t] for t in range(x.shape[1]) if mask[b, t]]
          for b in range(x.shape[0])]
  rows = [r for r in rows if r]
  if not rows:
    return 0.0
  if mode == "token_mean":
    return float(np.mean([v for r in rows for v in r]))
  reduce = np.sum if mode == "seq_mean_token_sum" else np.mean
  return float(np.mean([reduce(r) for r in rows]))


def np_ppo_token(logp, old, a, eps_low, eps_high, c):
  """(loss, d loss / d logp) of one token, written case by case."""
  r = np.exp(np.float64(logp) - old)
  if a > 0:  # Gain capped once r passes 1 + eps_high.
    return (-a * r, -a * r) if r < 1 + eps_high else (-a * (1 + eps_high), 0)
  if a < 0:  # Loss floored at 1 - eps_low, and capped at c|a| by dual-clip.
    if r <= 1 - eps_low:
      return -a * (1 - eps_low), 0.0
    if c is not None and r > c:
      return -a * c, 0.0
    return -a * r, -a * r
  return 0.0, 0.0


def np_k3(logp, ref):
  d = np.float64(ref) - logp
  return np.exp(d) - d - 1, 1 - np.exp(d)  # value, d / d logp


def _per_token(fn, *arrays):
  out = [[fn(*(a[b, t] for a in arrays)) for t in range(arrays[0].shape[1])]
         for b in range(arrays[0].shape[0])]
  return np.array([[v for v, _ in row] for row in out]), \
         np.array([[g for _, g in row] for row in out])


def _grad_logp(fn, logp, *args, **kwargs):
  return jax.grad(lambda lp: fn(lp, *args, **kwargs)[0])(jnp.asarray(logp))


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_matches_numpy(mode):
  x = np.random.RandomState(1).normal(size=(4, 6)).astype(np.float32)
  _, _, _, mask, _ = _batch()
  np.testing.assert_allclose(losses.aggregate(x, mask, mode),
                             np_aggregate(x, mask, mode), **TOL)


def test_aggregate_rejects_unknown_mode():
  with pytest.raises(ValueError):
    losses.aggregate(jnp.zeros((1, 2)), jnp.ones((1, 2)), "sum")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_clipped_surrogate_matches_numpy(mode, per_token_adv):
  logp, old, _, mask, adv_B = _batch()
  adv = adv_B[:, None] * np.linspace(0.5, 1.5, logp.shape[1]).astype(
      np.float32) if per_token_adv else adv_B
  adv_BT = np.broadcast_to(adv if per_token_adv else adv[:, None], logp.shape)
  tok, dtok = _per_token(lambda l, o, a: np_ppo_token(l, o, a, 0.2, 0.28, 3.0),
                         logp, old, adv_BT)
  loss, metrics = losses.clipped_surrogate_loss(logp, old, adv, mask, agg=mode)
  np.testing.assert_allclose(loss, np_aggregate(tok, mask, mode), **TOL)
  np.testing.assert_allclose(metrics["pg_loss"], loss, **TOL)
  if mode == "token_mean":
    grad = _grad_logp(losses.clipped_surrogate_loss, logp, old, adv, mask)
    np.testing.assert_allclose(grad, dtok * mask / mask.sum(), **TOL)


def test_clipped_surrogate_metrics():
  logp, old, _, mask, adv_B = _batch(seed=3)
  _, m = losses.clipped_surrogate_loss(logp, old, adv_B, mask,
                                       entropy_BT=-logp)
  on = mask > 0
  r = np.exp(np.float64(logp) - old)
  a = np.broadcast_to(adv_B[:, None], logp.shape)
  np.testing.assert_allclose(m["ratio_max"], r[on].max(), **TOL)
  np.testing.assert_allclose(m["ratio_mean"], r[on].mean(), **TOL)
  np.testing.assert_allclose(m["approx_kl"], (r - 1 - np.log(r))[on].mean(),
                             **TOL)
  np.testing.assert_allclose(m["clip_frac_low"],
                             ((a < 0) & (r < 0.8))[on].mean(), **TOL)
  np.testing.assert_allclose(m["clip_frac_high"],
                             ((a > 0) & (r > 1.28))[on].mean(), **TOL)
  np.testing.assert_allclose(m["dual_clip_frac"],
                             ((a < 0) & (r > 3))[on].mean(), **TOL)
  np.testing.assert_allclose(m["entropy"], -logp[on].mean(), **TOL)
  assert m["num_loss_tokens"] == on.sum()
  assert m["num_loss_rows"] == on.any(1).sum()


def test_dual_clip_with_negative_advantages():
  ratios = np.array([[0.5, 1.0, 2.0, 5.0, 2.0]])
  adv_BT = np.array([[-1.0, -1.0, -1.0, -1.0, 1.0]], np.float32)
  logp = np.zeros_like(ratios, np.float32)
  old = (-np.log(ratios)).astype(np.float32)
  mask = np.ones_like(logp)
  def per_token(c):
    return losses.clipped_surrogate_loss(logp, old, adv_BT, mask,
                                         dual_clip_c=c,
                                         agg="seq_mean_token_sum")

  loss, m = per_token(3.0)
  # 0.5 -> floored at 0.8; 1, 2 -> unclipped; 5 -> capped at c = 3;
  # A > 0 with r = 2 -> capped at 1.28.
  np.testing.assert_allclose(loss, 0.8 + 1 + 2 + 3 - 1.28, **TOL)
  np.testing.assert_allclose(m["dual_clip_frac"], 0.2, **TOL)
  np.testing.assert_allclose(m["clip_frac_low"], 0.2, **TOL)
  np.testing.assert_allclose(m["clip_frac_high"], 0.2, **TOL)
  loss_no_dual, m = per_token(None)
  np.testing.assert_allclose(loss_no_dual, 0.8 + 1 + 2 + 5 - 1.28, **TOL)
  assert m["dual_clip_frac"] == 0
  # Only the unclipped tokens (r = 1, 2 with A < 0) carry gradient.
  grad = _grad_logp(losses.clipped_surrogate_loss, logp, old, adv_BT, mask,
                    agg="seq_mean_token_sum")
  np.testing.assert_allclose(grad, [[0, 1, 2, 0, 0]], **TOL)


@pytest.mark.parametrize("mode", MODES)
def test_stepwise_pg_with_baseline_and_kl(mode):
  logp, _, ref, mask, rewards = _batch(seed=2)
  baseline = np.full_like(rewards, 0.25)
  k3, dk3 = _per_token(np_k3, logp, ref)
  a = (rewards - baseline)[:, None]
  want = (np_aggregate(-a * logp, mask, mode)
          + 0.1 * np_aggregate(k3, mask, mode))
  args = (mask, rewards)
  kwargs = dict(baseline_B=baseline, ref_logp_BT=ref, kl_coef=0.1, agg=mode)
  loss, m = losses.stepwise_pg_loss(logp, *args, **kwargs)
  np.testing.assert_allclose(loss, want, **TOL)
  np.testing.assert_allclose(m["kl"], k3[mask > 0].mean(), **TOL)
  np.testing.assert_allclose(m["advantage_mean"], a[mask.any(1)].mean(), **TOL)
  # Gradient: -A per token (through the aggregation) plus the k3 gradient.
  grad = _grad_logp(losses.stepwise_pg_loss, logp, *args, **kwargs)
  if mode == "seq_mean_token_sum":
    rows = mask.any(1).sum()
    np.testing.assert_allclose(grad, mask * (-a + 0.1 * dk3) / rows, **TOL)


def test_stepwise_pg_default_is_reward_weighted_action_logprob():
  logp, _, _, mask, rewards = _batch(seed=4)
  loss, m = losses.stepwise_pg_loss(logp, mask, rewards)
  rows = mask.any(1)
  action_logp = (logp * mask).sum(1)
  np.testing.assert_allclose(loss, -(rewards * action_logp)[rows].mean(), **TOL)
  np.testing.assert_allclose(m["action_logp"], action_logp[rows].mean(), **TOL)
  assert "kl" not in m


@pytest.mark.parametrize("mode", MODES)
def test_sft_loss(mode):
  logp, _, _, mask, _ = _batch(seed=5)
  loss, m = losses.sft_loss(logp, mask, agg=mode)
  np.testing.assert_allclose(loss, np_aggregate(-logp, mask, mode), **TOL)
  np.testing.assert_allclose(m["nll"], -logp[mask > 0].mean(), **TOL)


def _all_losses(logp, old, ref, adv_BT, mask, mode):
  """Every loss, as a function of logp only, with a KL term where it has one.

  The step-wise loss takes one reward per row: the mean of `adv_BT`'s row
  over its loss tokens.
  """
  del logp
  rewards_B = (np.where(mask > 0, adv_BT, 0).sum(1)
               / np.maximum(mask.sum(1), 1)).astype(np.float32)
  return {
      "pg": lambda lp: losses.stepwise_pg_loss(
          lp, mask, rewards_B, ref_logp_BT=ref, kl_coef=0.5, agg=mode),
      "ppo": lambda lp: losses.clipped_surrogate_loss(
          lp, old, adv_BT, mask, ref_logp_BT=ref, kl_coef=0.5, agg=mode),
      "sft": lambda lp: losses.sft_loss(lp, mask, agg=mode),
  }


@pytest.mark.parametrize("mode", MODES)
def test_masked_tokens_change_nothing(mode):
  logp, old, ref, mask, adv_B = _batch(seed=6)
  adv_BT = np.repeat(adv_B[:, None], logp.shape[1], 1)
  off = mask == 0
  wild = np.where(np.arange(logp.size).reshape(logp.shape) % 3, 1e4, np.nan)
  changed = [np.where(off, wild.astype(np.float32), x)
             for x in (logp, old, ref, adv_BT)]
  clean = _all_losses(logp, old, ref, adv_BT, mask, mode)
  dirty = _all_losses(changed[0], *changed[1:], mask, mode)
  for name in clean:
    (l0, m0), g0 = jax.value_and_grad(clean[name], has_aux=True)(logp)
    (l1, m1), g1 = jax.value_and_grad(dirty[name], has_aux=True)(changed[0])
    assert np.isfinite(l0) and np.all(np.isfinite(g0)), name
    np.testing.assert_array_equal(l1, l0, err_msg=name)
    np.testing.assert_array_equal(g1, g0, err_msg=name)
    assert np.all(np.asarray(g0)[off] == 0), name
    for k in m0:
      np.testing.assert_array_equal(m1[k], m0[k], err_msg=f"{name}/{k}")


@pytest.mark.parametrize("mode", MODES)
def test_empty_rows_are_left_out(mode):
  logp, old, ref, mask, adv_B = _batch(seed=7)
  assert not mask[-1].any()
  adv_BT = np.repeat(adv_B[:, None], logp.shape[1], 1)
  full = _all_losses(logp, old, ref, adv_BT, mask, mode)
  kept = _all_losses(logp[:-1], old[:-1], ref[:-1], adv_BT[:-1], mask[:-1],
                     mode)
  for name in full:
    np.testing.assert_allclose(full[name](logp)[0], kept[name](logp[:-1])[0],
                               err_msg=name, **TOL)
  # A batch with no loss tokens at all: loss 0 and zero gradient, no NaN.
  none = _all_losses(logp, old, ref, adv_BT, np.zeros_like(mask), mode)
  for name, fn in none.items():
    (loss, _), grad = jax.value_and_grad(fn, has_aux=True)(logp)
    assert loss == 0 and not np.any(grad), name


# ------------------------------------------- sampler-trainer mismatch, TIS


def test_mismatch_metrics_hand_computed():
  # Ratios pi_trainer / pi_sampler of 1, e^0.1, e^-1 and e^1 (masked out).
  trainer = np.array([[0.0, 0.1, -1.0, 1.0]], np.float32)
  sampler = np.zeros_like(trainer)
  mask = np.array([[1, 1, 1, 0]], np.float32)
  m = losses.mismatch_metrics(trainer, sampler, mask)
  d = np.array([0.0, 0.1, -1.0])
  np.testing.assert_allclose(m["mismatch_abs_mean"], np.abs(d).mean(), **TOL)
  np.testing.assert_allclose(m["mismatch_abs_max"], 1.0, **TOL)
  np.testing.assert_allclose(m["mismatch_kl"], (np.exp(d) - d - 1).mean(),
                             **TOL)
  # e^-1 = 0.37 < 0.5: one token of three leaves [0.5, 2].
  np.testing.assert_allclose(m["mismatch_out_frac"], 1 / 3, **TOL)


def test_mismatch_is_zero_for_equal_logprobs():
  logp, old, _, mask, _ = _batch(seed=8)
  m = losses.mismatch_metrics(logp, logp, mask)
  for k, v in m.items():
    assert float(v) == 0.0, k


def test_tis_weights_truncate_and_mask():
  trainer = np.log(np.array([[0.5, 1.0, 3.0, 9.0]], np.float32))
  sampler = np.zeros_like(trainer)
  mask = np.array([[1, 1, 1, 0]], np.float32)
  w = losses.tis_weights(trainer, sampler, mask, cap=2.0)
  np.testing.assert_allclose(w, [[0.5, 1.0, 2.0, 0.0]], **TOL)


@pytest.mark.parametrize("mode", MODES)
def test_clipped_surrogate_with_trainer_logprobs_and_tis(mode):
  """The ratio's denominator is the trainer's log-prob; each token's loss
  is weighted by min(pi_trainer / pi_sampler, C) (NumPy reference)."""
  logp, trainer_old, _, mask, adv_B = _batch(seed=9)
  sampler = (trainer_old + np.random.RandomState(9).normal(
      0, 0.7, logp.shape)).astype(np.float32)
  cap = 1.5
  adv_BT = np.broadcast_to(adv_B[:, None], logp.shape)
  tok, dtok = _per_token(lambda l, o, a: np_ppo_token(l, o, a, 0.2, 0.28, 3.0),
                         logp, trainer_old, adv_BT)
  w = np.minimum(np.exp(np.float64(trainer_old) - sampler), cap)
  kw = dict(agg=mode, old_logp_BT=trainer_old, tis_cap=cap)
  loss, m = losses.clipped_surrogate_loss(logp, sampler, adv_B, mask, **kw)
  np.testing.assert_allclose(loss, np_aggregate(tok * w, mask, mode), **TOL)
  on = mask > 0
  np.testing.assert_allclose(m["tis_weight_mean"], w[on].mean(), **TOL)
  np.testing.assert_allclose(m["tis_clip_frac"], (w >= cap)[on].mean(),
                             **TOL)
  np.testing.assert_allclose(
      m["mismatch_abs_mean"], np.abs(trainer_old - sampler)[on].mean(),
      **TOL)
  if mode == "token_mean":
    grad = _grad_logp(losses.clipped_surrogate_loss, logp, sampler, adv_B,
                      mask, **kw)
    np.testing.assert_allclose(grad, dtok * w * mask / mask.sum(), **TOL)
  # Without TIS the loss is the plain surrogate against the trainer's
  # log-probs; the mismatch is still reported.
  plain, m = losses.clipped_surrogate_loss(logp, sampler, adv_B, mask,
                                           agg=mode, old_logp_BT=trainer_old)
  np.testing.assert_allclose(plain, np_aggregate(tok, mask, mode), **TOL)
  assert "tis_weight_mean" not in m and "mismatch_kl" in m


def test_stepwise_pg_with_tis():
  logp, trainer_old, _, mask, rewards = _batch(seed=10)
  sampler = (trainer_old - 0.3).astype(np.float32)
  w = np.minimum(np.exp(np.float64(trainer_old) - sampler), 1.2)
  loss, m = losses.stepwise_pg_loss(logp, mask, rewards,
                                    sampler_logp_BT=sampler,
                                    old_logp_BT=trainer_old, tis_cap=1.2)
  want = np_aggregate(-rewards[:, None] * logp * w, mask,
                      "seq_mean_token_sum")
  np.testing.assert_allclose(loss, want, **TOL)
  np.testing.assert_allclose(m["mismatch_abs_max"], 0.3, **TOL)
  with pytest.raises(ValueError, match="tis_cap needs"):
    losses.stepwise_pg_loss(logp, mask, rewards, tis_cap=1.2)
