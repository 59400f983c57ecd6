"""The KV cache: a pool of fixed-size pages, and attention over them.

The pool (`init`) holds, for each layer, keys and values [K, P, page, H]
(the layout JAX's Pallas paged-attention kernels read). A row's context
lives in the pages its page table lists: its slot s, which holds its token
at position s (rows hold no padding), is slot s % page of page
table[s // page]. Which pages a row holds is the host's business
(sampling/pages.py); a program is given each row's table and the number of
tokens it holds (`Rows`), so one compiled program serves any rows.

A call on the pool writes its new tokens' keys and values into their
pages, in place, and each new token attends over its row's earlier tokens
(the prefix, read from the pages) and the new tokens up to itself: over a
contiguous view of the rows, their prefix pages gathered and then their
new tokens (`with_new`, `view_masks`), with the decoder's own dense
attention (`attention.attend`). Appends (several tokens a row) gather the
prefix pages once per layer. How a decode step reads them is
`ModelConfig.paged_attention_impl`:

  xla        the reference, exact for any mask (sliding windows,
             soft-caps), and the fastest on a CPU: a decode chunk gathers
             its rows' prefix pages once into views with room for the
             chunk's tokens, which each step writes at its own slot (one
             slot for every row: a plain update, no scatter); the chunk's
             tokens go to their pages when it ends. A step reads the view
             once with plain matmuls and touches no page; the view is a
             copy of its rows' prefixes held while the chunk runs.
  xla_pages  each step writes its token into its page, then gathers each
             layer's pages in turn and attends over them: nothing held
             across layers or steps (the memory of a kernel), reading the
             pages twice over. Exact for any mask.
  pallas     each step writes its token into its page and JAX's Pallas
             paged-attention kernel (GPU: `pallas.ops.gpu.paged_attention`,
             TPU: `pallas.ops.tpu.paged_attention`) reads each row's live
             pages through its table. It takes one query a row and no
             sliding window: a model with sliding layers takes xla_pages.
             Off a GPU or TPU it runs in Pallas' interpreter (tests only:
             slow).
  auto       pallas on a GPU or TPU (xla_pages for sliding windows), xla
             elsewhere.
"""

import functools
import logging
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from swirl_jax import sharding as shd
from swirl_jax.models.config import ModelConfig
from swirl_jax.sharding import constrain

IMPLS = ("auto", "xla", "xla_pages", "pallas")
# Finite, so a query row with no visible key gets a uniform softmax, not NaN
# (as `attention.MASK_VALUE`).
MASK_VALUE = -1e30
_logged: set = set()

Cache = dict  # k, v: L-tuples of [K, P, page, H].


class Rows(NamedTuple):
  """The rows of one call on the pool.

  A call's table lists each row's prefix pages (the pages of the tokens it
  holds, padded with any page: slots past `start` are never read) and then
  room for the call's new tokens: ceil(T / page) more entries. Entries a
  row does not own must not be written: its new tokens land in pages the
  host gave it, and padding tokens are never written.
  """
  table_BN: jax.Array  # int32 page ids.
  start_B: jax.Array  # int32: tokens each row holds before the call.


def init(cfg: ModelConfig, pages: int, page_size: int,
         dtype: str | None = None) -> Cache:
  """A pool of `pages` zeroed pages of `page_size` slots for every layer."""
  dt = jnp.dtype(dtype or cfg.dtype)
  shape = (cfg.num_kv_heads, pages, page_size, cfg.head_dim)
  zeros = lambda: tuple(jnp.zeros(shape, dt) for _ in range(cfg.num_layers))
  return dict(k=zeros(), v=zeros())


def page_size(cache: Cache) -> int:
  return cache["k"][0].shape[2]


def pages_for(tokens: int, page: int) -> int:
  """Pages that hold `tokens` tokens."""
  return -(-tokens // page)


def prefix_pages(rows: Rows, new_tokens: int, page: int) -> int:
  """How many of a call's table entries are its rows' prefix (static)."""
  n = rows.table_BN.shape[1] - pages_for(new_tokens, page)
  if n < 0:
    raise ValueError(f"a table of {rows.table_BN.shape[1]} pages has no "
                     f"room for {new_tokens} new tokens of {page}-slot pages")
  return n


def constrain_pool(cache: Cache) -> Cache:
  """KV heads over 'tensor' (a no-op outside `sharding.use_mesh`); every
  device of a data group holds every page of its heads."""
  each = lambda xs: tuple(constrain(x, ("act_kv_heads", None, None, None))
                          for x in xs)
  return dict(cache, k=each(cache["k"]), v=each(cache["v"]))


def constrain_view(x):
  """Rows' contiguous keys or values [B, K, ...]: KV heads over 'tensor'."""
  return constrain(x, ("batch", "act_kv_heads", None, None))


def gather(k_pages, v_pages, table_BN, dtype=None):
  """The pages `table_BN` lists, as contiguous views: keys [B, K, H, S]
  (slots last: the scores are then a plain (m, h) x (h, s) product, several
  times faster on a CPU than contracting the last dim of both) and values
  [B, K, S, H], S = N * page, in `dtype` (default the pages'). Whole pages
  move, one contiguous block of page x H values each."""
  K, _, page, H = k_pages.shape
  B, N = table_BN.shape
  take = lambda x: jnp.take(x, table_BN, axis=1, mode="clip").astype(
      dtype or x.dtype)  # [K, B, N, page, H]
  k = take(k_pages).transpose(1, 0, 4, 2, 3).reshape(B, K, H, N * page)
  v = take(v_pages).transpose(1, 0, 2, 3, 4).reshape(B, K, N * page, H)
  return constrain_view(k), constrain_view(v)


def write(k_pages, v_pages, rows: Rows, k_BTKH, v_BTKH, mask_BT):
  """The pools with the new tokens' keys and values written in place: token
  t of row b (right-padded, real where `mask_BT`) at slot start + t.
  Padding tokens go to no page (an out-of-range index, dropped)."""
  P, page = k_pages.shape[1], k_pages.shape[2]
  T = k_BTKH.shape[1]
  slot_BT = rows.start_B[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
  page_BT = jnp.take_along_axis(rows.table_BN, slot_BT // page, axis=1,
                                mode="clip")
  page_BT = jnp.where(mask_BT, page_BT, P)
  off_BT = slot_BT % page
  put = lambda pool, x: pool.at[:, page_BT, off_BT, :].set(
      x.transpose(2, 0, 1, 3).astype(pool.dtype), mode="drop")
  return put(k_pages, k_BTKH), put(v_pages, v_BTKH)


def view_masks(c: ModelConfig, start_B, prefix_slots: int, qi_T,
               S: int):
  """[B, T, S] visibility of a view's slots to T new tokens, (all layers',
  sliding layers'): the view holds each row's prefix in slots
  [0, prefix_slots) (its own below `start_B`) and then its new tokens, new
  token t in slot prefix_slots + qi_T[t]. A token sees its row's prefix
  and the new tokens up to itself; on a sliding layer, within the window
  (by position)."""
  s = jnp.arange(S, dtype=jnp.int32)
  new_S = s >= prefix_slots
  seen_BTS = ((s[None, :] < start_B[:, None])[:, None, :]
              | (new_S[None, :] & (s[None, :] - prefix_slots
                                   <= qi_T[:, None]))[None])
  if not (c.sliding_window and any(c.sliding_layers)):
    return seen_BTS, seen_BTS
  k_pos_BS = jnp.where(new_S[None], start_B[:, None] + s - prefix_slots,
                       s[None])
  q_pos_BT = start_B[:, None] + qi_T[None, :]
  near = (q_pos_BT[:, :, None] - k_pos_BS[:, None, :]) < c.sliding_window
  return seen_BTS, seen_BTS & near


def with_new(prefix, k_BTKH, v_BTKH):
  """A view of the rows' prefix (None: none) and then their new keys and
  values: keys [B, K, H, S + T], values [B, K, S + T, H]."""
  k, v = k_BTKH.transpose(0, 2, 3, 1), v_BTKH.transpose(0, 2, 1, 3)
  if prefix is None:
    return constrain_view(k), constrain_view(v)
  return (constrain_view(jnp.concatenate([prefix[0], k], axis=3)),
          constrain_view(jnp.concatenate([prefix[1], v], axis=2)))


# ----------------------------------------------------------- the kernels


def resolve(cfg: ModelConfig) -> str:
  """The implementation `cfg` decodes with: 'xla', 'xla_pages' or
  'pallas'."""
  impl = cfg.paged_attention_impl
  if impl not in IMPLS:
    raise ValueError(f"paged_attention_impl {impl!r}; valid: {IMPLS}")
  if impl == "auto":
    impl = "pallas" if jax.default_backend() in ("gpu", "tpu") else "xla"
    if impl == "pallas" and any(cfg.sliding_layers):
      return "xla_pages"
  if impl == "pallas" and any(cfg.sliding_layers):
    why = "the Pallas paged-attention kernels have no sliding window"
    if why not in _logged:  # Once per process, not once per trace.
      _logged.add(why)
      logging.warning("paged_attention_impl='pallas': %s; using "
                      "'xla_pages'", why)
    return "xla_pages"
  return impl


def _largest_divisor(n: int, at_most: int) -> int:
  return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def _kernel_local(c: ModelConfig, backend: str, q_BNH, k_pages, v_pages,
                  table_BN, lengths_B):
  """One device's kernel call (q pre-scaled)."""
  cap = c.attn_logit_softcap
  N = table_BN.shape[1]
  if backend == "tpu":
    from jax.experimental.pallas.ops.tpu.paged_attention import (  # pylint: disable=g-import-not-at-top
        paged_attention_kernel as tpu)
    return tpu.paged_attention(
        q_BNH, k_pages, v_pages, lengths_B, table_BN,
        mask_value=MASK_VALUE, attn_logits_soft_cap=cap,
        pages_per_compute_block=_largest_divisor(N, 8))
  from jax.experimental.pallas.ops.gpu import paged_attention as gpu  # pylint: disable=g-import-not-at-top
  splits = _largest_divisor(N, 16)
  return gpu.paged_attention(
      q_BNH, k_pages, v_pages, table_BN, lengths_B, k_splits=splits,
      pages_per_compute_block=_largest_divisor(N // splits, 8),
      mask_value=MASK_VALUE, attn_logits_soft_cap=cap,
      interpret=jax.default_backend() != "gpu")


def attend_pages(c: ModelConfig, q_B1NH, k_pages, v_pages, table_BN,
                 lengths_B, backend: str | None = None):
  """One query a row over its first `lengths_B` slots, read through its
  table by the Pallas kernel of `backend` (default: this one's; 'gpu' off
  a GPU or TPU: the GPU kernel in Pallas' interpreter). -> [B, 1, N * H]."""
  B, _, N, H = q_B1NH.shape
  backend = backend or ("tpu" if jax.default_backend() == "tpu" else "gpu")
  # The kernel computes in the pages' dtype: q comes to it (never the
  # pool to q's, a copy of the whole pool).
  q = (q_B1NH[:, 0] * jnp.asarray(c.attn_scale, q_B1NH.dtype)).astype(
      k_pages.dtype)
  fn = functools.partial(_kernel_local, c, backend)
  mesh = shd.active_mesh()
  if mesh is not None and mesh.size > 1:
    fn = _sharded(fn, mesh, q.shape, k_pages.shape)
  o = fn(q, k_pages, v_pages, table_BN, lengths_B.astype(jnp.int32))
  return o.reshape(B, 1, N * H).astype(q_B1NH.dtype)


def _sharded(fn, mesh, q_shape, pages_shape):
  """`fn` under shard_map: heads over tensor where both query and key heads
  divide (else whole heads on every device); rows whole (decode rules)."""
  P = jax.sharding.PartitionSpec
  spec = lambda axes, shape: shd.logical_to_spec(axes, shape, mesh,
                                                 shd.active_rules())
  q_spec = spec((None, "act_heads", None), q_shape)
  k_spec = spec(("act_kv_heads", None, None, None), pages_shape)
  if q_spec[1] != k_spec[0]:
    q_spec, k_spec = P(None, None, None), P(None, None, None, None)
  return jax.shard_map(fn, mesh=mesh,
                       in_specs=(q_spec, k_spec, k_spec, P(), P()),
                       out_specs=q_spec, check_vma=False)


def kv_bytes_per_token(cfg: ModelConfig, dtype: str | None = None) -> int:
  """Bytes of one token's keys and values, all layers."""
  item = jnp.dtype(dtype or cfg.dtype).itemsize
  return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * item


def pages_of_lengths(lengths, page: int) -> int:
  """Pages rows of these context lengths hold."""
  return sum(math.ceil(n / page) for n in lengths)
