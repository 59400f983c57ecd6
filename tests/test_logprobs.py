"""Chunked token log-probs match the whole-logits reference, in less memory."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swirl_jax.ops import logprobs

jax.config.update("jax_default_matmul_precision", "highest")

B, T, D, V = 2, 13, 8, 37
TOL = dict(rtol=1e-5, atol=1e-5)


def _unembed(params, h):
  """Untied matrix + bias + Gemma-2-style soft-cap: an arbitrary function."""
  logits = jnp.einsum("...d,dv->...v", h, params["w"]) + params["b"]
  return jnp.tanh(logits / 5.0) * 5.0


def _inputs(seed=0, dtype=jnp.float32):
  k = jax.random.split(jax.random.PRNGKey(seed), 4)
  params = {"w": jax.random.normal(k[0], (D, V)),
            "b": 0.1 * jax.random.normal(k[1], (V,))}
  hidden = jax.random.normal(k[2], (B, T, D)).astype(dtype)
  targets = jax.random.randint(k[3], (B, T), 0, V)
  return params, hidden, targets


@functools.cache
def _objective(fn):
  """A scalar that weights logp and entropy differently per token."""
  w_logp = jnp.linspace(-1.0, 2.0, B * T).reshape(B, T)
  w_ent = jnp.cos(jnp.arange(B * T, dtype=jnp.float32)).reshape(B, T)

  def f(params, hidden, targets):
    logp, ent = fn(params, hidden, targets, _unembed, with_entropy=True)
    return jnp.sum(w_logp * logp) + jnp.sum(w_ent * ent)
  return jax.jit(jax.grad(f, argnums=(0, 1)))


@pytest.mark.parametrize("chunk_size", [4, 64])  # 13 = 3 * 4 + 1; 64 > T
def test_values_and_grads_match_naive(chunk_size):
  params, hidden, targets = _inputs()
  chunked = functools.partial(logprobs.token_logprobs, chunk_size=chunk_size)
  jitted = jax.jit(chunked, static_argnums=3, static_argnames="with_entropy")
  logp, ent = jitted(params, hidden, targets, _unembed, with_entropy=True)
  ref_logp, ref_ent = logprobs.token_logprobs_naive(
      params, hidden, targets, _unembed, with_entropy=True)
  assert logp.shape == ent.shape == (B, T)
  np.testing.assert_allclose(logp, ref_logp, **TOL)
  np.testing.assert_allclose(ent, ref_ent, **TOL)

  grads = _objective(chunked)(params, hidden, targets)
  ref_grads = _objective(logprobs.token_logprobs_naive)(params, hidden, targets)
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    assert np.abs(r).max() > 0
    np.testing.assert_allclose(g, r, **TOL)


def test_naive_is_log_softmax():
  params, hidden, targets = _inputs(seed=1)
  logits = np.asarray(_unembed(params, hidden), np.float64)
  logz = np.log(np.exp(logits).sum(-1))
  want = np.take_along_axis(logits, np.asarray(targets)[..., None], -1)[..., 0]
  logp, ent = logprobs.token_logprobs_naive(params, hidden, targets, _unembed)
  assert ent is None
  np.testing.assert_allclose(logp, want - logz, **TOL)


def test_bfloat16_hidden_gives_float32():
  params, hidden, targets = _inputs(dtype=jnp.bfloat16)
  logp, ent = jax.jit(logprobs.token_logprobs, static_argnums=3,
                      static_argnames="chunk_size")(
                          params, hidden, targets, _unembed, chunk_size=4)
  assert ent is None and logp.dtype == jnp.float32
  ref, _ = logprobs.token_logprobs_naive(params, hidden, targets, _unembed)
  np.testing.assert_allclose(logp, ref, **TOL)


def test_masked_helpers_ignore_inf_and_empty_rows():
  x = jnp.array([[1.0, jnp.inf, 3.0], [jnp.nan, 2.0, 5.0]])
  mask = jnp.array([[1, 0, 1], [0, 0, 0]])
  np.testing.assert_array_equal(logprobs.masked_sum(x, mask, axis=1), [4, 0])
  np.testing.assert_array_equal(logprobs.masked_mean(x, mask, axis=1), [2, 0])
  assert logprobs.masked_mean(x, mask) == 2.0
  g = jax.grad(lambda x: logprobs.masked_mean(x, mask))(x)
  np.testing.assert_array_equal(g, [[0.5, 0, 0.5], [0, 0, 0]])


def test_chunked_backward_needs_less_memory():
  """Compiled temp memory of value+grad: chunks vs the whole [B, T, V]."""
  b, t, d, v = 2, 256, 64, 8192

  def unembed(params, h):
    return h @ params["w"]

  def compiled_temp_bytes(fn):
    def loss(params, hidden, targets):
      return jnp.sum(fn(params, hidden, targets, unembed)[0])
    args = ({"w": jax.ShapeDtypeStruct((d, v), jnp.float32)},
            jax.ShapeDtypeStruct((b, t, d), jnp.float32),
            jax.ShapeDtypeStruct((b, t), jnp.int32))
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile()
    try:
      stats = compiled.memory_analysis()
    except (NotImplementedError, jax.errors.JaxRuntimeError):
      stats = None
    if stats is None or not stats.temp_size_in_bytes:
      pytest.skip("memory_analysis is not available on this backend")
    return stats.temp_size_in_bytes

  logits_bytes = b * t * v * 4
  naive = compiled_temp_bytes(logprobs.token_logprobs_naive)
  chunked = compiled_temp_bytes(
      functools.partial(logprobs.token_logprobs, chunk_size=32))
  assert naive >= logits_bytes
  assert chunked < logits_bytes / 2 < naive / 2
