"""`ModelConfig.attention_impl`: every implementation that runs on a CPU
(jax.nn.dot_product_attention's XLA path; the TPU splash kernel in Pallas'
interpreter) against the block attention, values and gradients, with left
padding, grouped-query heads, a sliding window and Gemma 2's soft-cap; and
splash under shard_map on a fake 8-device mesh."""

import logging
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fresh_process

from swirl_jax.models import attention, decoder, presets
from swirl_jax.models.config import FULL, SLIDING, ModelConfig

T = 128  # Splash works in blocks of 128 tokens.


def gemma(**kw):
  base = dict(
      family="gemma2", vocab_size=256, hidden_size=64, intermediate_size=128,
      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
      query_pre_attn_scalar=16, sliding_window=24,
      layer_types=(SLIDING, FULL))
  return ModelConfig(**{**base, **kw})


def params_for(cfg, seed=0):
  """Weights of std 0.1, so attention is far from uniform but unsaturated."""
  rng = np.random.default_rng(seed)
  def leaf(path, s):
    if "scale" in jax.tree_util.keystr(path):
      return np.ones(s.shape, s.dtype) * (0.0 if cfg.is_gemma else 1.0)
    return rng.normal(0.0, 0.1, s.shape).astype(s.dtype)
  return jax.tree_util.tree_map_with_path(leaf, decoder.abstract_params(cfg))


def batch(b=2):
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, 256, (b, T))
  mask = np.ones((b, T), bool)
  mask[0, :37] = False  # Left padding.
  return tokens, mask


def hidden_and_grads(cfg, impl, params, tokens, mask):
  c = cfg.replace(attention_impl=impl)

  def loss(p):
    h, _ = decoder.hidden_states(p, c, tokens, None, mask)
    h = jnp.where(mask[..., None], h, 0.0)  # Padding rows mean nothing.
    return jnp.sum(h * jnp.sin(jnp.arange(h.shape[-1]))), h
  (_, h), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return np.asarray(h), jax.device_get(g)


def assert_same(cfg, impl):
  params = params_for(cfg)
  tokens, mask = batch()
  want_h, want_g = hidden_and_grads(cfg, "xla_blocks", params, tokens, mask)
  got_h, got_g = hidden_and_grads(cfg, impl, params, tokens, mask)
  np.testing.assert_allclose(got_h, want_h, atol=2e-5)
  for path, g in jax.tree_util.tree_leaves_with_path(got_g):
    w = want_g
    for k in path:
      w = w[k.key]
    scale = np.abs(w).max()
    assert scale > 0, jax.tree_util.keystr(path)
    np.testing.assert_allclose(g, w, atol=2e-5 * scale,
                               err_msg=jax.tree_util.keystr(path))
  return want_h


@pytest.mark.parametrize("impl", ["dot_product", "splash"])
def test_gqa_left_padding_matches_blocks(impl):
  cfg = presets.get_preset("tiny")
  assert cfg.num_heads // cfg.num_kv_heads == 2  # Grouped-query heads.
  assert attention.resolve(cfg.replace(attention_impl=impl), T) == impl
  assert_same(cfg, impl)


@pytest.mark.parametrize("impl", ["dot_product", "splash"])
def test_sliding_window_matches_blocks(impl):
  """Gemma 2 layout without soft-cap: layer 0 windowed, layer 1 full (the
  layer type is traced inside the scan)."""
  cfg = gemma()
  h = assert_same(cfg, impl)
  # The window matters here: without it the output differs.
  h_full, _ = hidden_and_grads(cfg.replace(sliding_window=None), "xla_blocks",
                               params_for(cfg), *batch())
  assert np.abs(h_full - h).max() > 1e-3


def test_splash_soft_cap_matches_blocks():
  assert_same(gemma(attn_logit_softcap=0.5), "splash")


def test_fallbacks_log_once(caplog):
  capped = gemma(attn_logit_softcap=0.5)
  with caplog.at_level(logging.WARNING):
    assert attention.resolve(capped.replace(attention_impl="dot_product"),
                             T) == "xla_blocks"
    assert attention.resolve(capped.replace(attention_impl="dot_product"),
                             T) == "xla_blocks"
    assert attention.resolve(
        presets.get_preset("tiny", attention_impl="splash"), 100
    ) == "xla_blocks"
  soft = [r for r in caplog.records if "soft-cap" in r.getMessage()]
  assert len(soft) <= 1  # Once per process (an earlier test may have).
  assert attention.resolve(presets.get_preset("tiny"), T) == "xla_blocks"
  with pytest.raises(ValueError, match="attention_impl 'flash'"):
    attention.resolve(presets.get_preset("tiny", attention_impl="flash"), T)


_MESH_SCRIPT = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_default_matmul_precision", "highest")
    sys.path.insert(0, "tests")
    from test_attention_impl import batch, gemma, params_for
    from swirl_jax import sharding as shd
    from swirl_jax.models import decoder
    from swirl_jax.training import state as state_lib

    cfg = gemma(attn_logit_softcap=0.5)  # 4 and 2 heads over tensor=2.
    tokens, mask = batch(b=4)
    out = {}
    for name, impl, spec, devs in [
        ("one", "xla_blocks", [("data", 1), ("fsdp", 1), ("tensor", 1)],
         jax.devices()[:1]),
        ("mesh", "splash", [("data", 2), ("fsdp", 2), ("tensor", 2)],
         jax.devices())]:
      c = cfg.replace(attention_impl=impl)
      mesh = shd.make_mesh(spec, devs)
      params = jax.device_put(params_for(cfg),
                              state_lib.param_shardings(c, mesh))
      def loss(p):
        h, _ = decoder.hidden_states(p, c, tokens, None, mask)
        h = jnp.where(mask[..., None], h, 0.0)
        return jnp.sum(h * jnp.sin(jnp.arange(h.shape[-1])))
      with shd.use_mesh(mesh):
        lowered = jax.jit(jax.value_and_grad(loss)).lower(params)
        value, grads = lowered.compile()(params)
      text = lowered.as_text()
      out[name] = dict(value=float(value), shard_map=any(
                           s in text for s in ("manual_computation",
                                               "SPMDFullToShardShape")),
                       grads=[np.asarray(g).ravel().tolist()
                              for g in jax.tree.leaves(grads)])
    print(json.dumps(out))
    """)


def test_splash_on_a_mesh_matches_one_device():
  out = fresh_process.last_json(_MESH_SCRIPT)
  one, mesh = out["one"], out["mesh"]
  assert mesh["shard_map"]
  np.testing.assert_allclose(mesh["value"], one["value"], rtol=1e-5)
  for a, b in zip(mesh["grads"], one["grads"]):
    np.testing.assert_allclose(a, b, atol=1e-5 * np.abs(b).max())
