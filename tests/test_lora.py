"""LoRA as a side path: the same forward, loss and gradients as merged
weights, and a backward pass without weight-sized gradients."""

import functools
import math

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from swirl_jax.models import decoder, paged
from swirl_jax.models.config import ModelConfig
from swirl_jax.training import lora
from swirl_jax.training import step as step_lib

import testutil

# Every weight dim distinct from the others and from the activations'
# (B * T = 16 rows), so a weight-shaped array in a jaxpr is recognisable.
CFG = ModelConfig(family="qwen2", vocab_size=100, hidden_size=40,
                  intermediate_size=72, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=12, qkv_bias=True)
B, T = 2, 8


def _lora_cfg(rank=3, targets=tuple(lora.TARGETS)):
  c = lora.default_config()
  c.rank, c.alpha, c.targets = rank, 6.0, targets
  return c


def _setup(seed=0, lora_cfg=None):
  lora_cfg = lora_cfg or _lora_cfg()
  rng = np.random.default_rng(seed)
  leaf = lambda s: jnp.asarray(rng.normal(0, 0.05, s.shape), s.dtype)
  base = jax.tree.map(leaf, decoder.abstract_params(CFG))
  adapters = lora.init_adapters(base, lora_cfg, jax.random.key(seed))
  # `b` starts at zero: make it nonzero, or both paths are the base model.
  adapters = jax.tree.map(lambda x: jnp.asarray(
      rng.normal(0, 0.05, x.shape), x.dtype), adapters)
  return base, adapters, lora_cfg


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  mask = np.ones((B, T), bool)
  mask[1, :3] = False  # Left padding.
  return dict(tokens=jnp.asarray(rng.integers(0, 100, (B, T)), jnp.int32),
              attention_mask=jnp.asarray(mask),
              loss_mask=jnp.asarray(mask, jnp.float32),
              advantages=jnp.asarray(rng.normal(size=(B,)), jnp.float32),
              behaviour_logprobs=jnp.full((B, T), -4.5, jnp.float32))


LOSS_CFG = step_lib.default_loss_config()


def _loss(adapters, base, batch, lora_cfg, side: bool):
  params = (lora.side_params(base, adapters, lora_cfg) if side
            else lora.merge(base, adapters, lora_cfg))
  return step_lib.policy_loss(params, CFG, LOSS_CFG, batch)[0]


def test_side_path_forward_equals_merged_weights():
  base, adapters, lora_cfg = _setup()
  batch = _batch()
  side = lora.side_params(base, adapters, lora_cfg)
  merged = lora.merge(base, adapters, lora_cfg)
  args = (batch["tokens"], None, batch["attention_mask"])
  want, _ = testutil.forward(merged, CFG, *args)
  got, _ = testutil.forward(side, CFG, *args)
  plain, _ = testutil.forward(base, CFG, *args)
  assert float(jnp.abs(want - plain).max()) > 1e-3  # The adapters matter.
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # The cached (sampling) path reads the side path too: a prefill of each
  # row into a page of its own.
  rows = paged.Rows(jnp.arange(B, dtype=jnp.int32)[:, None],
                    jnp.zeros(B, jnp.int32))
  cached = lambda p: testutil.forward(p, CFG, batch["tokens"], rows=rows,
                                      cache=paged.init(CFG, B, T))[0]
  np.testing.assert_allclose(cached(side), cached(merged), rtol=1e-5,
                             atol=1e-5)


def test_side_path_loss_and_grads_equal_merged_weights():
  base, adapters, lora_cfg = _setup(1)
  batch = _batch(1)
  grad = lambda side: jax.jit(jax.value_and_grad(functools.partial(
      _loss, lora_cfg=lora_cfg, side=side)))(adapters, base, batch)
  (l_side, g_side), (l_merged, g_merged) = grad(True), grad(False)
  np.testing.assert_allclose(l_side, l_merged, rtol=1e-6)
  norm = math.sqrt(sum(float(jnp.sum(g * g))
                       for g in jax.tree.leaves(g_merged)))
  assert norm > 1e-3
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                       atol=1e-6),
               g_side, g_merged)


_ARITH = {"dot_general", "add", "add_any", "mul", "sub"}


def _eqns(jaxpr):
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from _eqns(sub)


def _weight_shapes(base) -> set:
  """Shapes a weight-sized array takes: stacked, per layer, and flattened
  to the 2-D matmul operand `dense` makes of it (either way round)."""
  out = set()
  for w in jax.tree.leaves(base["layers"]):
    if w.ndim < 3:  # Biases and norm scales are not weights of interest.
      continue
    for shape in (w.shape, w.shape[1:]):
      out.add(shape)
      for cut in range(1, len(shape)):
        a, b = math.prod(shape[:cut]), math.prod(shape[cut:])
        out |= {(a, b), (b, a)}
  return out


def _weight_sized(side: bool) -> list[str]:
  """Arithmetic results of a weight's shape in the grad's jaxpr."""
  base, adapters, lora_cfg = _setup()
  fn = jax.grad(functools.partial(_loss, lora_cfg=lora_cfg, side=side))
  jaxpr = jax.make_jaxpr(fn)(adapters, base, _batch())
  shapes = _weight_shapes(base)
  return [f"{e.primitive.name} {v.aval.shape}" for e in _eqns(jaxpr.jaxpr)
          if e.primitive.name in _ARITH for v in e.outvars
          if tuple(v.aval.shape) in shapes]


def test_side_path_backward_has_no_weight_sized_gradient():
  merged = _weight_sized(side=False)
  # The control: merging makes W + s A @ B, and its gradient W-sized.
  assert any(m.startswith("dot_general") for m in merged), merged
  assert any(m.startswith("add") for m in merged), merged
  assert _weight_sized(side=True) == []


def test_grads_match_through_the_jitted_train_step():
  """The step trains the side path and reports the merged model's loss."""
  base, adapters, lora_cfg = _setup(2)
  batch = _batch(2)
  fn = functools.partial(step_lib.loss_and_grads, cfg=CFG, loss_cfg=LOSS_CFG,
                         lora_cfg=lora_cfg, micro_batches=1)
  loss, grads, _ = jax.jit(fn)(adapters, base, batch)
  want_loss, want = jax.jit(jax.value_and_grad(functools.partial(
      _loss, lora_cfg=lora_cfg, side=False)))(adapters, base, batch)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                       atol=1e-6),
               grads, want)


def test_merge_is_one_program_and_matches_numpy():
  base, adapters, lora_cfg = _setup(3, _lora_cfg(targets=("o", "down")))
  lora.merge(base, adapters, lora_cfg)
  size = lora._merge._cache_size()  # pylint: disable=protected-access
  merged = [lora.merge(base, adapters, lora_cfg) for _ in range(3)]
  assert lora._merge._cache_size() == size  # pylint: disable=protected-access
  s = lora_cfg.alpha / lora_cfg.rank
  a, b = np.asarray(adapters["o"]["a"]), np.asarray(adapters["o"]["b"])
  want = np.asarray(base["layers"]["attn"]["o"]) + s * np.einsum(
      "lnhr,lrd->lnhd", a, b)
  np.testing.assert_allclose(merged[-1]["layers"]["attn"]["o"], want,
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(merged[-1]["layers"]["attn"]["q"],
                                base["layers"]["attn"]["q"])


def test_unknown_target_is_an_error():
  with pytest.raises(ValueError, match="lora.targets"):
    lora.init_adapters(_setup()[0], _lora_cfg(targets=("qq",)),
                       jax.random.key(0))
