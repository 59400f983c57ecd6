"""Attention without a KV cache (training, scoring): the implementations
`ModelConfig.attention_impl` chooses between.

  xla_blocks   `decoder._causal_blocks`: plain XLA ops over blocks of
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
Query rows without a visible key (padding) get outputs of no meaning, as in
the block attention; they are masked downstream.
"""

import functools
import logging

import jax
import jax.numpy as jnp

from swirl_jax import sharding as shd

IMPLS = ("auto", "xla_blocks", "dot_product", "splash")
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


def no_cache(cfg, q_BTNH, k_BTKH, v_BTKH, mask_BTS, sliding, blocks_fn):
  """Dispatches on `resolve`; `blocks_fn` is the block attention (keys and
  values `[B, K, T, H]`)."""
  impl = resolve(cfg, q_BTNH.shape[1])
  if impl == "dot_product":
    return dot_product(cfg, q_BTNH, k_BTKH, v_BTKH, mask_BTS)
  if impl == "splash":
    return splash(cfg, q_BTNH, k_BTKH, v_BTKH, mask_BTS, sliding)
  return blocks_fn(cfg, q_BTNH, k_BTKH.transpose(0, 2, 1, 3),
                   v_BTKH.transpose(0, 2, 1, 3), mask_BTS)


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
