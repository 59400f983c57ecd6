"""Token log-probs of given targets, without the full `[B, T, V]` logits.

With a modern vocabulary (V ~ 150k) the float32 logits of a training batch,
and the softmax the backward pass keeps for them, dwarf everything else in a
policy-gradient step. `token_logprobs` scans over chunks of the sequence and
wraps each chunk in `jax.checkpoint`, so the backward pass recomputes that
chunk's logits instead of storing them: at most one `[B, chunk, V]` block is
live at a time, in the forward and in the backward pass.

The unembedding is passed as `unembed_fn(unembed_params, hidden_...D)` with
its parameters passed explicitly (not closed over), so gradients reach them
through the scan. It may be any function (tied or untied matrix, Gemma 2's
final-logit soft-cap, ...) returning logits of shape `[..., V]`; they are
cast to float32 before the log-softmax whatever their dtype.

Chunks run along T with the whole batch in each chunk, so a batch-sharded
`hidden_BTD` stays batch-sharded inside the scan (no resharding per chunk).
"""

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

UnembedFn = Callable[[Any, jax.Array], jax.Array]


def masked_sum(x, mask, axis=None):
  """Sum of `x * mask`, where masked-out entries cannot leak inf or NaN.

  `jnp.where` (not a bare product) keeps `inf * 0 = NaN` out of both the
  value and the gradient. `mask` may be bool or 0/1 (or real) weights.
  """
  mask = jnp.asarray(mask)
  keep = mask != 0
  x = jnp.where(keep, x * mask.astype(jnp.result_type(x)), 0)
  return jnp.sum(x, axis=axis)


def masked_mean(x, mask, axis=None):
  """`masked_sum / sum(mask)`; 0 (never NaN) where the mask is empty."""
  mask = jnp.asarray(mask)
  num = masked_sum(x, mask, axis=axis)
  den = jnp.sum(mask.astype(jnp.result_type(num)), axis=axis)
  # Double `where` so that neither value nor gradient sees 0 / 0.
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1), 0)


def _chunk_stats(unembed_params, h_BcD, targets_Bc, *, unembed_fn,
                 with_entropy):
  """Log-prob of each target (and the entropy) for one chunk, in float32."""
  logits_BcV = unembed_fn(unembed_params, h_BcD).astype(jnp.float32)
  log_z_Bc = jax.nn.logsumexp(logits_BcV, axis=-1)
  # A compare-and-reduce instead of a gather: it stays cheap and correct
  # when V is sharded across devices. Out-of-range targets (e.g. -1 padding)
  # pick no logit and give a finite `-log_z`; callers mask them.
  vocab_V = jnp.arange(logits_BcV.shape[-1])
  hit_BcV = vocab_V == targets_Bc[..., None]
  target_logit_Bc = jnp.sum(jnp.where(hit_BcV, logits_BcV, 0.0), axis=-1)
  logp_Bc = target_logit_Bc - log_z_Bc
  if not with_entropy:
    return logp_Bc, None
  probs_BcV = jnp.exp(logits_BcV - log_z_Bc[..., None])
  entropy_Bc = log_z_Bc - jnp.sum(probs_BcV * logits_BcV, axis=-1)
  return logp_Bc, entropy_Bc


def token_logprobs(unembed_params, hidden_BTD, targets_BT,
                   unembed_fn: UnembedFn, *, chunk_size: int = 128,
                   with_entropy: bool = False):
  """Log-probs of `targets_BT` under the logits `unembed_fn` gives.

  Args:
    unembed_params: pytree the unembedding reads (gradients flow to it).
    hidden_BTD: final hidden states; position t predicts `targets_BT[:, t]`
      (shift tokens before calling: `targets = tokens[:, 1:]` with
      `hidden[:, :-1]`).
    targets_BT: int token ids.
    unembed_fn: `unembed_fn(unembed_params, h_BcD) -> logits_BcV`.
    chunk_size: sequence positions per chunk; the last chunk may be shorter
      (T need not be a multiple of it).
    with_entropy: also return the entropy of each position's distribution.

  Returns:
    `(logp_BT, entropy_BT)` in float32; `entropy_BT` is None unless asked.
  """
  B, T, D = hidden_BTD.shape
  c = max(1, min(chunk_size, T))
  n, rem = divmod(T, c)
  chunk_fn = jax.checkpoint(functools.partial(
      _chunk_stats, unembed_fn=unembed_fn, with_entropy=with_entropy))

  # Scan over the n full chunks: [B, n*c, D] -> [n, B, c, D].
  h_nBcD = hidden_BTD[:, :n * c].reshape(B, n, c, D).swapaxes(0, 1)
  t_nBc = targets_BT[:, :n * c].reshape(B, n, c).swapaxes(0, 1)

  def body(carry, xs):
    return carry, chunk_fn(unembed_params, *xs)

  _, outs = jax.lax.scan(body, None, (h_nBcD, t_nBc))
  outs = jax.tree.map(lambda y_nBc: y_nBc.swapaxes(0, 1).reshape(B, n * c),
                      outs)
  if rem:  # One shorter chunk outside the scan, rather than padding T.
    tail = chunk_fn(unembed_params, hidden_BTD[:, n * c:],
                    targets_BT[:, n * c:])
    outs = jax.tree.map(lambda a, b: jnp.concatenate([a, b], axis=1),
                        outs, tail)
  return outs


def token_logprobs_naive(unembed_params, hidden_BTD, targets_BT,
                         unembed_fn: UnembedFn, *, with_entropy: bool = False):
  """Reference: whole `[B, T, V]` float32 logits at once (tests, tiny runs)."""
  logits_BTV = unembed_fn(unembed_params, hidden_BTD).astype(jnp.float32)
  logprobs_BTV = jax.nn.log_softmax(logits_BTV, axis=-1)
  logp_BT = jnp.take_along_axis(
      logprobs_BTV, targets_BT[..., None], axis=-1)[..., 0]
  if not with_entropy:
    return logp_BT, None
  entropy_BT = -jnp.sum(jnp.exp(logprobs_BTV) * logprobs_BTV, axis=-1)
  return logp_BT, entropy_BT
