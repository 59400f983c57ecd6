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


# Rows whose kept set lies within their top this-many tokens are truncated
# from `lax.top_k` alone: about 10 ms a draw for 16 rows of SmolLM2's 49,152
# logits on a CPU, against 150 ms for the full sort the rest need
# (benchmarks/decode_step.py).
CANDIDATES = 256


def _truncate_sorted(scaled_BV, top_k_B, top_p_B):
  """Sets logits outside the top-k, then outside the nucleus, to -inf."""
  V = scaled_BV.shape[-1]
  sorted_BV = -jnp.sort(-scaled_BV, axis=-1)  # Descending.
  return _threshold(scaled_BV, sorted_BV, _nucleus(
      sorted_BV, None, _k(top_k_B, V), top_p_B)[0])


def _k(top_k_B, V: int):
  return jnp.where((top_k_B <= 0) | (top_k_B > V), V, top_k_B)


def _nucleus(top_BC, lse_B, k_B, top_p_B):
  """(n_B, the count of leading tokens of `top_BC` (descending) the
  top-k then top-p rule keeps; n_B < C: the rule stopped within them).
  `lse_B`: the log-normaliser over the top-k (None: over `top_BC`'s first
  k, which must hold them all)."""
  C = top_BC.shape[-1]
  in_k_BC = jnp.arange(C)[None] < k_B[:, None]
  masked_BC = jnp.where(in_k_BC, top_BC, NEG_INF)
  if lse_B is None:
    probs_BC = jax.nn.softmax(masked_BC, axis=-1)
  else:
    probs_BC = jnp.exp(masked_BC - lse_B[:, None])
  # Keep the smallest prefix whose mass reaches top_p: a token stays when
  # the mass ranked above it is still short of top_p.
  before_BC = jnp.cumsum(probs_BC, axis=-1) - probs_BC
  n_B = jnp.sum(in_k_BC & (before_BC < top_p_B[:, None]), axis=-1)
  return jnp.where(top_p_B >= 1.0, k_B, jnp.clip(n_B, 1, k_B)), n_B < C


def _threshold(scaled_BV, top_BC, n_B):
  thresh_B = jnp.take_along_axis(top_BC, (n_B - 1)[:, None], axis=-1)
  return jnp.where(scaled_BV >= thresh_B, scaled_BV, NEG_INF)


def _truncate_top(scaled_BV, top_k_B, top_p_B, candidates: int):
  """(`_truncate_sorted`'s result from the top `candidates` tokens alone,
  whether that is exact for every row): it is where the row's kept set lies
  within them, i.e. top_k <= candidates, or no top-k and the nucleus
  closes within them."""
  V = scaled_BV.shape[-1]
  C = min(candidates, V)
  top_BC = jax.lax.top_k(scaled_BV, C)[0]
  k_B = _k(top_k_B, V)
  small_k_B = k_B <= C
  # Without top-k the normaliser is over the whole vocabulary.
  lse_B = jnp.where(small_k_B, jax.nn.logsumexp(
      jnp.where(jnp.arange(C)[None] < k_B[:, None], top_BC, NEG_INF), -1),
                    jax.nn.logsumexp(scaled_BV, -1))
  n_B, closed_B = _nucleus(top_BC, lse_B, k_B, top_p_B)
  everything_B = (k_B == V) & (top_p_B >= 1.0)  # Nothing truncated.
  exact = jnp.all(small_k_B | everything_B | ((k_B == V) & closed_B))
  out_BV = _threshold(scaled_BV, top_BC, jnp.where(everything_B, 1, n_B))
  return jnp.where(everything_B[:, None], scaled_BV, out_BV), exact


def _truncate(scaled_BV, top_k_B, top_p_B, candidates: int = CANDIDATES):
  """`_truncate_sorted`, from the top `candidates` tokens where that is
  exact for every row, else from the full sort."""
  if candidates >= scaled_BV.shape[-1]:
    return _truncate_sorted(scaled_BV, top_k_B, top_p_B)
  out_BV, exact = _truncate_top(scaled_BV, top_k_B, top_p_B, candidates)
  return jax.lax.cond(exact, lambda *_: out_BV, _truncate_sorted, scaled_BV,
                      top_k_B, top_p_B)


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
  # Only pay for truncation when some row truncates.
  # Rows that do not truncate (greedy ones included) ask for nothing, so
  # their settings never send the batch to the full sort.
  out_BV = jax.lax.cond(jnp.any(truncating_B), _truncate,
                        lambda x, *_: x, scaled_BV,
                        jnp.where(truncating_B, top_k_B, 0),
                        jnp.where(truncating_B, top_p_B, 1.0))
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
