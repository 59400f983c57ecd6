"""The per-token sampling distribution: temperature, then top-k, then top-p.

Every parameter is per row, so one compiled program serves any mix of greedy
and sampled rows. Truncation keeps tokens by value (a threshold), so tokens
tied with the last one kept are kept too.

Greedy rows (temperature 0) take the argmax; a point mass would give a
behaviour log-prob of 0, which says nothing, so their log-probs are those of
the untruncated distribution at temperature 1 (the model's own).
"""

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


def _truncate(scaled_BV, top_k_B, top_p_B):
  """Sets logits outside the top-k, then outside the nucleus, to -inf."""
  V = scaled_BV.shape[-1]
  sorted_BV = -jnp.sort(-scaled_BV, axis=-1)  # Descending.
  k_B = jnp.where((top_k_B <= 0) | (top_k_B > V), V, top_k_B)
  rank_V = jnp.arange(V)
  in_k_BV = rank_V[None] < k_B[:, None]
  probs_BV = jax.nn.softmax(jnp.where(in_k_BV, sorted_BV, NEG_INF), axis=-1)
  # Keep the smallest prefix whose mass reaches top_p: a token stays when
  # the mass ranked above it is still short of top_p.
  before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
  n_B = jnp.sum(in_k_BV & (before_BV < top_p_B[:, None]), axis=-1)
  n_B = jnp.where(top_p_B >= 1.0, k_B, jnp.clip(n_B, 1, k_B))
  thresh_B = jnp.take_along_axis(sorted_BV, (n_B - 1)[:, None], axis=-1)
  return jnp.where(scaled_BV >= thresh_B, scaled_BV, NEG_INF)


def sampling_logits(logits_BV, temperature_B, top_k_B, top_p_B):
  """Unnormalised log-probs of the distribution tokens are drawn from.

  Args:
    logits_BV: float32 model logits.
    temperature_B: > 0 samples at that temperature; <= 0 is greedy.
    top_k_B: keep the k most likely tokens; <= 0 keeps all.
    top_p_B: keep the smallest set of most likely tokens whose probability
      (after temperature and top-k) reaches top_p; >= 1 keeps all.

  Returns:
    [B, V] float32, -inf on excluded tokens. Greedy rows get the plain
    logits (see the module docstring).
  """
  logits_BV = logits_BV.astype(jnp.float32)
  greedy_B = temperature_B <= 0
  t_B = jnp.where(greedy_B, 1.0, temperature_B).astype(jnp.float32)
  scaled_BV = logits_BV / t_B[:, None]
  V = logits_BV.shape[-1]
  truncating_B = ~greedy_B & (((top_k_B > 0) & (top_k_B < V))
                              | (top_p_B < 1.0))
  # A full-vocabulary sort costs milliseconds per step on a CPU: only pay
  # for it when some row truncates.
  out_BV = jax.lax.cond(jnp.any(truncating_B), _truncate,
                        lambda x, *_: x, scaled_BV, top_k_B, top_p_B)
  return jnp.where(greedy_B[:, None], logits_BV, out_BV)


def _inverse_cdf(weights_BV, u_B):
  """Index of the first token whose cumulative mass reaches u * total."""
  probs_BV = jax.nn.softmax(weights_BV, axis=-1)
  cdf_BV = jnp.cumsum(probs_BV, axis=-1)
  target_B = u_B * cdf_BV[:, -1]
  idx_B = jnp.sum(cdf_BV < target_B[:, None], axis=-1)
  idx_B = jnp.minimum(idx_B, weights_BV.shape[-1] - 1).astype(jnp.int32)
  # Rounding in the parallel cumsum can put u past the last kept token (a
  # chance of about 1e-7 per draw): never return an excluded token.
  w_B = jnp.take_along_axis(weights_BV, idx_B[:, None], axis=-1)[:, 0]
  return jnp.where(jnp.isfinite(w_B), idx_B,
                   jnp.argmax(weights_BV, axis=-1).astype(jnp.int32))


def sample_tokens(logits_BV, keys_B, temperature_B, top_k_B, top_p_B):
  """One token per row, and its log-prob under the distribution used.

  Args:
    logits_BV: float32 logits.
    keys_B: one typed PRNG key per row.
    temperature_B, top_k_B, top_p_B: see `sampling_logits`.

  Returns:
    (tokens_B int32, logprobs_B float32).
  """
  greedy_B = temperature_B <= 0
  w_BV = sampling_logits(logits_BV, temperature_B, top_k_B, top_p_B)
  argmax_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)

  def draw(_):
    # One uniform per row in (0, 1]: inverse-CDF sampling reads the whole
    # row once, where Gumbel-max would draw a random number per token.
    u_B = 1.0 - jax.vmap(jax.random.uniform)(keys_B)
    return jnp.where(greedy_B, argmax_B, _inverse_cdf(w_BV, u_B))

  tok_B = jax.lax.cond(jnp.all(greedy_B), lambda _: argmax_B, draw, None)
  lp_B = (jnp.take_along_axis(w_BV, tok_B[:, None], axis=-1)[:, 0]
          - jax.nn.logsumexp(w_BV, axis=-1))
  return tok_B, lp_B
