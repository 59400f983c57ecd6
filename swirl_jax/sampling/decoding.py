"""Extend and decode: pure functions of (params, page pool, rows, ...).

The cache holds every token of every row's context, the sampled ones too:
each decode step samples a token from the logits it carries and writes that
token at once, carrying the logits for the next one. So when a row stops,
the cache ends exactly at its last returned token, and the logits of what
would follow are at hand for `extend` or a further `decode`.

The cache is a pool of pages (models/paged.py); the host says where each
row's tokens are and how many it holds (`paged.Rows`), so continuing a row
is only (its pages, its logits). A row's slot s holds its position s: rows
never see another row's tokens, nor padding.

`pages.py` jits them over the rows of its page pool.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from swirl_jax import sharding as shd
from swirl_jax.models import attention, decoder, paged
from swirl_jax.models.config import ModelConfig
from swirl_jax.sampling import distribution
from swirl_jax.sharding import constrain

# Why a row stopped; codes in `DecodeOut.reason_B`.
REASONS = ("none", "eos", "stop", "length", "cache_full")
NONE, EOS, STOP, LENGTH, CACHE_FULL = range(len(REASONS))


class SamplingParams(NamedTuple):
  """Per-row sampling settings (arrays of shape [B])."""
  keys_B: jax.Array  # Typed PRNG keys; a token's key folds in its position.
  temperature_B: jax.Array  # <= 0: greedy.
  top_k_B: jax.Array  # <= 0: off.
  top_p_B: jax.Array  # >= 1: off.


class StopSpec(NamedTuple):
  """When rows stop, besides the cache filling up."""
  max_new_B: jax.Array  # int32: new tokens allowed per row.
  eos_E: jax.Array  # int32 EOS ids, padded with -1.
  table_QV: jax.Array  # `stops.stop_table`: next state, -1 on a stop.


class DecodeOut(NamedTuple):
  cache: paged.Cache  # The pool, with the chunk's tokens in their pages.
  logits_BV: jax.Array  # For the token after each row's last one.
  stop_state_B: jax.Array  # Matcher states, to resume a row mid-string.
  tokens_BN: jax.Array  # Row b's k-th new token at [b, k].
  logprobs_BN: jax.Array  # Their log-probs under the distribution used.
  num_B: jax.Array  # New tokens per row.
  reason_B: jax.Array  # REASONS codes; NONE for rows not sampled.


def _logits_at(params, cfg: ModelConfig, h_BD):
  return decoder.unembed_with(decoder.unembed_params(params, cfg), cfg, h_BD)


def extend(params, cfg: ModelConfig, cache: paged.Cache, rows: paged.Rows,
           tokens_BT, mask_BT, logits_BV=None):
  """Appends tokens (a tool observation, a prompt) to the rows' contexts.

  Earlier context is read from the pages, never recomputed. Rows may add
  different numbers of tokens, right-padded (mask_BT False); positions
  continue from each row's last one.

  Args:
    params, cfg: the model.
    cache: the page pool; the new tokens are written at slots
      start .. start + T of each row.
    rows: each row's pages and tokens held (its table with room for T
      new tokens: `paged.Rows`).
    tokens_BT: int token ids.
    mask_BT: True on real tokens.
    logits_BV: the rows' current next-token logits; rows that add no token
      keep them. None: such rows get logits of no meaning.

  Returns:
    (cache, logits_BV after each row's last real token).
  """
  mask_BT = mask_BT.astype(bool)
  T = tokens_BT.shape[1]
  h_BTD, cache = decoder.hidden_states(params, cfg, tokens_BT, None, mask_BT,
                                       cache, rows)
  # Only the last real token of each row needs logits: [B, V], not [B, T, V].
  last_B = T - 1 - jnp.argmax(mask_BT[:, ::-1], axis=1)
  h_BD = jnp.take_along_axis(h_BTD, last_B[:, None, None], axis=1)[:, 0]
  logits = _logits_at(params, cfg, h_BD)
  if logits_BV is not None:
    logits = jnp.where(jnp.any(mask_BT, 1)[:, None], logits, logits_BV)
  return cache, logits


def decode_step(params, cfg: ModelConfig, sp: SamplingParams,
                stop: StopSpec, model, carry):
  """One step of `decode`'s loop: samples one token per active row, then
  writes it into the cache: `model(tok_B, pos_B, active_B, step, kv) ->
  (h_BD, kv)` (`chunk_model`, `pages_model`). `carry` = (step, kv,
  logits_BV, pos_B, active_B, stop states, tokens_BN, logprobs_BN, num_B,
  reason_B)."""
  (step, kv, logits_BV, pos_B, active_B, state_B, tokens_BN, lps_BN,
   num_B, reason_B) = carry
  keys_B = jax.vmap(jax.random.fold_in)(sp.keys_B, pos_B)
  tok_B, lp_B = distribution.sample_tokens(
      logits_BV, keys_B, sp.temperature_B, sp.top_k_B, sp.top_p_B)
  tok_B = jnp.where(active_B, tok_B, 0)
  nxt_B = stop.table_QV[state_B, tok_B].astype(jnp.int32)
  hit_B = nxt_B < 0
  state_B = jnp.where(active_B, jnp.where(hit_B, 0, nxt_B), state_B)
  num_B = num_B + active_B
  eos_B = jnp.any(tok_B[:, None] == stop.eos_E[None, :], axis=1)
  why_B = jnp.where(eos_B, EOS, jnp.where(
      hit_B, STOP, jnp.where(num_B >= stop.max_new_B, LENGTH, NONE)))
  done_B = active_B & (why_B != NONE)
  zeros = jnp.zeros((), jnp.int32)
  tokens_BN = jax.lax.dynamic_update_slice(
      tokens_BN, jnp.where(active_B, tok_B, 0)[:, None], (zeros, step))
  lps_BN = jax.lax.dynamic_update_slice(
      lps_BN, jnp.where(active_B, lp_B, 0.0)[:, None], (zeros, step))
  h_BD, kv = model(tok_B, pos_B, active_B, step, kv)
  new_BV = _logits_at(params, cfg, h_BD)
  logits_BV = jnp.where(active_B[:, None], new_BV, logits_BV)
  return (step + 1, kv, logits_BV, pos_B + active_B, active_B & ~done_B,
          state_B, tokens_BN, lps_BN, num_B, jnp.where(done_B, why_B,
                                                       reason_B))


def chunk_views(cfg: ModelConfig, cache: paged.Cache, rows: paged.Rows,
                steps: int) -> tuple:
  """The xla path's views, a layer each, gathered once for a chunk of
  `steps` steps: keys [B, K, H, S + steps] and values [B, K, S + steps,
  H], the rows' S prefix slots and then room for the chunk's tokens."""
  page = paged.page_size(cache)
  n = paged.prefix_pages(rows, steps, page)
  dt = jnp.dtype(cfg.dtype)
  B, K, H = rows.start_B.shape[0], cfg.num_kv_heads, cfg.head_dim
  room = jnp.zeros((B, steps, K, H), dt)
  return tuple(paged.with_new(
      paged.gather(k, v, rows.table_BN[:, :n], dt) if n else None, room,
      room) for k, v in zip(cache["k"], cache["v"]))


def chunk_model(params, cfg: ModelConfig, start_B, steps: int, pool_dtype):
  """The xla path's decode step over the views it carries
  (`chunk_views`): step i writes its keys and values at view slot
  S + i, one slot for every row (`store_chunk` writes them to their pages
  after the chunk), so a step reads the view once and writes no page.
  New keys and values are rounded as the pool (`pool_dtype`) stores
  them."""
  stored = lambda x: x.astype(pool_dtype).astype(x.dtype)

  def model(tok_B, pos_B, active_B, step, views):
    del active_B  # A stopped row's later slots are never stored.
    S_all = views[0][1].shape[2]
    S = S_all - steps
    masks = paged.view_masks(cfg, start_B, S, step[None], S_all)

    def attend(i, q, k, v, sliding):
      kv = jax.lax.dynamic_update_slice(
          views[i][0], stored(k).transpose(0, 2, 3, 1), (0, 0, 0, S + step))
      vv = jax.lax.dynamic_update_slice(
          views[i][1], stored(v).transpose(0, 2, 1, 3), (0, 0, S + step, 0))
      o = attention.attend(cfg, q, kv, vv, masks[int(sliding)],
                           keys_last=True)
      return o, (kv, vv)

    h, views = decoder.cached_hidden_states(params, cfg, tok_B[:, None],
                                            pos_B[:, None], attend)
    return h[:, 0], tuple(views)
  return model


def store_chunk(cache: paged.Cache, rows: paged.Rows, views, num_B,
                steps: int):
  """The pool with each row's first `num_B` chunk tokens (the last
  `steps` slots of `chunk_model`'s views) written to their pages."""
  mask_BC = jnp.arange(steps, dtype=jnp.int32)[None] < num_B[:, None]
  new_k = lambda kv: kv[:, :, :, -steps:].transpose(0, 3, 1, 2)
  new_v = lambda vv: vv[:, :, -steps:].transpose(0, 2, 1, 3)
  pools = [paged.write(kp, vp, rows, new_k(kv), new_v(vv), mask_BC)
           for kp, vp, (kv, vv) in zip(cache["k"], cache["v"], views)]
  return paged.constrain_pool(dict(k=tuple(k for k, _ in pools),
                                   v=tuple(v for _, v in pools)))


def pages_model(params, cfg: ModelConfig, rows: paged.Rows, impl: str):
  """The decode step of the paths that read the pages each step
  ('xla_pages', 'pallas'): it writes its token into its page, then reads
  the rows' pages through their tables."""
  dt = jnp.dtype(cfg.dtype)
  S = rows.table_BN.shape[1]

  def model(tok_B, pos_B, active_B, step, cache):
    del step
    at = paged.Rows(rows.table_BN, pos_B)  # A row's next slot: its position.
    if impl != "pallas":
      # The view is the whole table, the new token already in it at slot
      # pos: a prefix of pos + 1 tokens, the query one slot before its end.
      S_all = S * paged.page_size(cache)
      masks = paged.view_masks(cfg, pos_B + 1, S_all,
                               jnp.full(1, -1, jnp.int32), S_all)

    def attend(i, q, k, v, sliding):
      kp, vp = paged.write(cache["k"][i], cache["v"][i], at, k, v,
                           active_B[:, None])
      if impl == "pallas":
        return paged.attend_pages(cfg, q, kp, vp, rows.table_BN,
                                  pos_B + 1), (kp, vp)
      kv, vv = paged.gather(kp, vp, rows.table_BN, dt)
      return attention.attend(cfg, q, kv, vv, masks[int(sliding)],
                              keys_last=True), (kp, vp)

    h, pools = decoder.cached_hidden_states(params, cfg, tok_B[:, None],
                                            pos_B[:, None], attend)
    return h[:, 0], paged.constrain_pool(dict(k=tuple(k for k, _ in pools),
                                              v=tuple(v for _, v in pools)))
  return model


def decode(params, cfg: ModelConfig, cache: paged.Cache, rows: paged.Rows,
           logits_BV, active_B, stop_state_B, sp: SamplingParams,
           stop: StopSpec, max_steps: int) -> DecodeOut:
  """Samples until every active row stops; one `lax.while_loop` on device.

  A row stops on an EOS id, on completing a stop string or after
  `stop.max_new_B` tokens (at most `max_steps`, the static buffer size);
  the caller gives it room for them (pages, and a table with room for
  `max_steps` new tokens). Inactive rows are left untouched: no token, no
  page written, same logits.

  Args:
    params, cfg: the model.
    cache, rows, logits_BV: the pool, where each row's tokens are, and the
      rows' logits from `extend` / an earlier `decode`.
    active_B: bool, rows to sample.
    stop_state_B: int32 stop-string matcher states (0: fresh).
    sp: sampling settings.
    stop: stop conditions.
    max_steps: static; the size of the returned token buffers.
  """
  B = logits_BV.shape[0]
  max_new_B = jnp.minimum(stop.max_new_B, max_steps)
  stop = stop._replace(max_new_B=max_new_B)
  reason_B = jnp.where(active_B & (max_new_B <= 0), LENGTH, NONE)
  active_B = active_B & (max_new_B > 0)
  impl = paged.resolve(cfg)
  chunked = impl == "xla"
  if chunked:
    kv = chunk_views(cfg, cache, rows, max_steps)
    model = chunk_model(params, cfg, rows.start_B, max_steps,
                        cache["k"][0].dtype)
  else:
    kv, model = cache, pages_model(params, cfg, rows, impl)
  carry = (jnp.zeros((), jnp.int32), kv, logits_BV, rows.start_B, active_B,
           stop_state_B.astype(jnp.int32),
           jnp.zeros((B, max_steps), jnp.int32),
           jnp.zeros((B, max_steps), jnp.float32),
           jnp.zeros((B,), jnp.int32), reason_B.astype(jnp.int32))

  def cond(c):
    step, active_B = c[0], c[4]
    return (step < max_steps) & jnp.any(active_B)

  body = lambda c: decode_step(params, cfg, sp, stop, model, c)
  (_, kv, logits_BV, _, _, state_B, tokens_BN, lps_BN, num_B,
   reason_B) = jax.lax.while_loop(cond, body, carry)
  cache = store_chunk(cache, rows, kv, num_B, max_steps) if chunked else kv
  return DecodeOut(cache, logits_BV, state_B, tokens_BN, lps_BN, num_B,
                   reason_B)


def decode_rules(rules):
  """`rules` with rows and the embedding dim whole: tensor-parallel
  decode (heads, KV heads, MLP and vocab over 'tensor')."""
  return tuple((name, None if name in ("batch", "embed") else axes)
               for name, axes in rules)


def param_shardings(cfg, mesh, rules, split: bool):
  """NamedShardings of the params under `rules`; `split`: with the layers
  as a tuple of per-layer trees (the cached path's layout)."""
  axes = decoder.param_logical_axes(cfg)
  if split:
    one = jax.tree.map(lambda a: P(*a[1:]), axes["layers"],
                       is_leaf=lambda a: isinstance(a, P))
    axes = dict(axes, layers=(one,) * cfg.num_layers)
  return shd.tree_shardings(axes, abstract_params(cfg, split), mesh, rules)


def abstract_params(cfg, split: bool):
  """ShapeDtypeStructs of the params; `split`: with the layers as a tuple
  of per-layer trees (the cached path's layout)."""
  shapes = decoder.abstract_params(cfg)
  if not split:
    return shapes
  one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype),
                     shapes["layers"])
  return dict(shapes, layers=(one,) * cfg.num_layers)
