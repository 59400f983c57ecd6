"""Attention without a KV cache (training, scoring): the implementations
`ModelConfig.attention_impl` chooses between.

  xla_blocks   `causal_blocks`: plain XLA ops over blocks of
               queries, exact for any mask (the CPU default).
  dot_product  `jax.nn.dot_product_attention`: cuDNN's flash attention on
               a GPU in bf16 / fp16, XLA's elsewhere. It takes the same
               dense mask (causal, padding, sliding window by position).
               It has no logit soft-cap: Gemma 2 falls back to xla_blocks.
  splash       the TPU Pallas splash kernel, run per device under
               `shard_map` (rows over the batch axes, heads over tensor):
               a causal or local (sliding window) mask by slot, padding by
               segment ids, soft-cap built in. Slot and position distances
               agree while a row's real tokens are contiguous (left or right
               padding with default positions, what this codebase builds).
               Off a TPU it runs in Pallas' interpreter (tests only: slow).
  auto         splash on a TPU, dot_product on a GPU, xla_blocks elsewhere.

Each returns `[B, T, N * H]` from q `[B, T, N, H]` and k, v `[B, T, K, H]`.
Attention through the KV cache (sampling) is models/paged.py's, behind
`ModelConfig.paged_attention_impl`.
Query rows without a visible key (padding) get outputs of no meaning, as in
the block attention; they are masked downstream.
"""

import functools
import logging

import jax
import jax.numpy as jnp

from swirl_jax import sharding as shd

IMPLS = ("auto", "xla_blocks", "dot_product", "splash")
# Finite, so a query row with no visible key gets a uniform softmax, not NaN.
MASK_VALUE = -1e30
_SPLASH_BLOCK = 128  # Splash's sequence blocks are multiples of this.
_logged: set = set()


def _fallback(impl: str, why: str) -> str:
  if (impl, why) not in _logged:  # Once per process, not once per trace.
    _logged.add((impl, why))
    logging.warning("attention_impl=%r: %s; using 'xla_blocks'", impl, why)
  return "xla_blocks"


def resolve(cfg, seq_len: int) -> str:
  """The implementation `cfg` runs with for `seq_len` queries."""
  impl = cfg.attention_impl
  if impl not in IMPLS:
    raise ValueError(f"attention_impl {impl!r}; valid: {IMPLS}")
  if impl == "auto":
    impl = {"tpu": "splash", "gpu": "dot_product"}.get(
        jax.default_backend(), "xla_blocks")
  if impl == "dot_product" and cfg.attn_logit_softcap:
    return _fallback(impl, "jax.nn.dot_product_attention has no logit "
                     "soft-cap")
  if impl == "splash" and seq_len % _SPLASH_BLOCK:
    if seq_len == 1:  # Param init traces one token: nothing to say.
      return "xla_blocks"
    return _fallback(impl, f"{seq_len} tokens are not a multiple of "
                     f"{_SPLASH_BLOCK}")
  return impl


def no_cache(cfg, q_BTNH, k_BTKH, v_BTKH, mask_BTS, sliding):
  """Dispatches on `resolve`."""
  impl = resolve(cfg, q_BTNH.shape[1])
  if impl == "dot_product":
    return dot_product(cfg, q_BTNH, k_BTKH, v_BTKH, mask_BTS)
  if impl == "splash":
    return splash(cfg, q_BTNH, k_BTKH, v_BTKH, mask_BTS, sliding)
  return causal_blocks(cfg, q_BTNH, k_BTKH.transpose(0, 2, 1, 3),
                   v_BTKH.transpose(0, 2, 1, 3), mask_BTS)


def attend(c, q_BTNH, k, v_BKSH, mask_BTS, *, keys_last):
  """Softmax attention of T queries over S slots -> `[B, T, N * H]`.

  Keys are `[B, K, S, H]`, or `[B, K, H, S]` with `keys_last`.
  """
  B, T, N, H = q_BTNH.shape
  K = v_BKSH.shape[1]
  G = N // K
  # Each (b, k) attends with its G query heads' rows stacked, m = (g, t):
  # plain [M, H] x [H, S] products with the batch dims (b, k) leading,
  # which XLA's CPU matmul takes as they are; a 5-D (g, t) einsum, or
  # other layouts, runs 2-3x slower, forward and backward.
  q_BKMH = q_BTNH.reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4).reshape(
      B, K, G * T, H)
  spec = "bkmh,bkhs->bkms" if keys_last else "bkmh,bksh->bkms"
  s = jnp.einsum(spec, q_BKMH, k, preferred_element_type=jnp.float32)
  s = s * c.attn_scale
  if c.attn_logit_softcap:
    s = jnp.tanh(s / c.attn_logit_softcap) * c.attn_logit_softcap
  mask_BMS = jnp.tile(mask_BTS, (1, G, 1))  # Row m = (g, t) sees t's keys.
  s = jnp.where(mask_BMS[:, None], s, MASK_VALUE)
  probs = jax.nn.softmax(s, axis=-1).astype(v_BKSH.dtype)
  o = jnp.einsum("bkms,bksh->bkmh", probs, v_BKSH)
  return o.reshape(B, K, G, T, H).transpose(0, 3, 1, 2, 4).reshape(
      B, T, N * H)


def causal_blocks(c, q_BTNH, k_BKSH, v_BKSH, mask_BTS):
  """`attend` over blocks of queries, each over the keys up to its end.

  Exact for causal masks (the no-cache path's): a query never sees a later
  key, so the keys left out are masked anyway. Skipping that upper half,
  with blocks small enough to stay in cache, took SmolLM2's attention core
  (fwd + bwd, 2 x 512 tokens) from 56 ms to 35-38 ms in blocks of 128
  queries; inside a rematerialised layer 128 beat 64. (A query row with no
  visible key at all, i.e. padding, spreads its weight over its block's
  keys rather than all keys; such rows are masked downstream either way.)
  """
  T = q_BTNH.shape[1]
  n = 1 if c.attn_query_block <= 0 else min(-(-T // c.attn_query_block), 16)
  size = -(-T // n)
  outs = []
  for lo in range(0, T, size):
    hi = min(lo + size, T)
    outs.append(attend(c, q_BTNH[:, lo:hi], k_BKSH[:, :, :hi],
                       v_BKSH[:, :, :hi], mask_BTS[:, lo:hi, :hi],
                       keys_last=False))
  return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def dot_product(cfg, q_BTNH, k_BTKH, v_BTKH, mask_BTS):
  B, T, N, H = q_BTNH.shape
  kw = dict(mask=mask_BTS[:, None], scale=cfg.attn_scale)
  o = None
  if jax.default_backend() == "gpu" and q_BTNH.dtype in (jnp.bfloat16,
                                                         jnp.float16):
    try:  # cuDNN checks shapes and dtypes when traced.
      # is_causal lets the kernel skip the upper half; the mask says so too.
      o = jax.nn.dot_product_attention(q_BTNH, k_BTKH, v_BTKH, is_causal=True,
                                       implementation="cudnn", **kw)
    except (NotImplementedError, ValueError, RuntimeError) as e:
      _fallback_xla(str(e))
  if o is None:
    o = jax.nn.dot_product_attention(q_BTNH, k_BTKH, v_BTKH,
                                     implementation="xla", **kw)
  return o.reshape(B, T, N * H)


def _fallback_xla(why: str):
  if ("cudnn", why) not in _logged:
    _logged.add(("cudnn", why))
    logging.warning("cuDNN attention unavailable (%s); using XLA's", why)


def _splash_kernel(cfg, heads: int, T: int, local: bool):
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # pylint: disable=g-import-not-at-top
      splash_attention_kernel as sk, splash_attention_mask as sm)
  if local:
    mask = sm.LocalMask((T, T), (cfg.sliding_window - 1, 0), offset=0)
  else:
    mask = sm.CausalMask((T, T))
  b = min(512, T)
  while T % b:
    b //= 2
  sizes = sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b,
                        block_q_dkv=b, block_kv_dkv=b, block_kv_dkv_compute=b,
                        block_q_dq=b, block_kv_dq=b)
  return sk.make_splash_mha(
      sm.MultiHeadMask([mask] * heads), block_sizes=sizes, head_shards=1,
      q_seq_shards=1, attn_logits_soft_cap=cfg.attn_logit_softcap,
      interpret=jax.default_backend() != "tpu"), sk.SegmentIds


def _splash_local(cfg, sliding, q_BNTH, k_BKTH, v_BKTH, seg_BT, flag):
  """Splash on one device's shard. `sliding` is static (a bool), or None:
  then the traced `flag` picks the kernel (layers alternate in a scan)."""
  _, N, T, _ = q_BNTH.shape

  def run(local):
    kernel, seg_ids = _splash_kernel(cfg, N, T, local)
    one = lambda q, k, v, s: kernel(q, k, v, segment_ids=seg_ids(s, s))
    return jax.vmap(one)(q_BNTH, k_BKTH, v_BKTH, seg_BT)

  if sliding is not None:
    return run(sliding)
  return jax.lax.cond(flag, lambda: run(True), lambda: run(False))


def splash(cfg, q_BTNH, k_BTKH, v_BTKH, mask_BTS, sliding):
  """`sliding`: this layer uses the window (a bool, or traced in a scan)."""
  B, T, N, H = q_BTNH.shape
  # A real slot sees its own key: the diagonal is the key validity.
  seg_BT = jnp.diagonal(mask_BTS, axis1=1, axis2=2).astype(jnp.int32)
  q = (q_BTNH * jnp.asarray(cfg.attn_scale, q_BTNH.dtype)).transpose(
      0, 2, 1, 3)
  k, v = k_BTKH.transpose(0, 2, 1, 3), v_BTKH.transpose(0, 2, 1, 3)
  static = isinstance(sliding, bool)
  fn = functools.partial(_splash_local, cfg, sliding if static else None)
  mesh = shd.active_mesh()
  if mesh is not None and mesh.size > 1:
    fn = _sharded(fn, mesh, q.shape, k.shape)
  o = fn(q, k, v, seg_BT, jnp.asarray(sliding, bool))
  return o.transpose(0, 2, 1, 3).reshape(B, T, N * H)


def _sharded(fn, mesh, q_shape, k_shape):
  """`fn` under shard_map: rows over the batch axes, heads over tensor when
  both query and key heads divide (else whole heads on every device)."""
  P = jax.sharding.PartitionSpec
  spec = lambda axes, shape: shd.logical_to_spec(axes, shape, mesh,
                                                 shd.active_rules())
  q_spec = spec(("batch", "act_heads", None, None), q_shape)
  k_spec = spec(("batch", "act_kv_heads", None, None), k_shape)
  if q_spec[1] != k_spec[1]:
    q_spec, k_spec = P(q_spec[0], None, None, None), P(k_spec[0], None,
                                                       None, None)
  specs = (q_spec, k_spec, k_spec, P(q_spec[0], None), P())
  return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=q_spec,
                       check_vma=False)
