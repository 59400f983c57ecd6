"""Extend and decode: pure functions of (params, cache, ...).

The cache holds every token of every row's context, the sampled ones too:
each decode step samples a token from the logits it carries and writes that
token at once, carrying the logits for the next one. So when a row stops,
the cache ends exactly at its last returned token, and the logits of what
would follow are at hand for `extend` or a further `decode`.

Positions are read from the cache itself (a row's next position is one past
its last valid slot), so continuing is only (cache, logits); rows never see
another row's padding because padded slots stay invalid.

`slots.py` jits them over rows of its slot cache.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from swirl_jax import sharding as shd
from swirl_jax.models import decoder
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
  cache: decoder.Cache
  logits_BV: jax.Array  # For the token after each row's last one.
  stop_state_B: jax.Array  # Matcher states, to resume a row mid-string.
  tokens_BN: jax.Array  # Row b's k-th new token at [b, k].
  logprobs_BN: jax.Array  # Their log-probs under the distribution used.
  num_B: jax.Array  # New tokens per row.
  reason_B: jax.Array  # REASONS codes; NONE for rows not sampled.


def next_positions(cache: decoder.Cache) -> jax.Array:
  """[B] position of each row's next token: one past its last valid slot."""
  last = jnp.max(jnp.where(cache["valid"], cache["pos"], -1), axis=1)
  return (last + 1).astype(jnp.int32)


def constrain_cache(cache: decoder.Cache) -> decoder.Cache:
  """Rows over the batch mesh axes (a no-op outside `sharding.use_mesh`)."""
  each = lambda xs, axes: tuple(constrain(x, axes) for x in xs)
  return dict(cache,
              k=each(cache["k"], ("batch", "act_kv_heads", None,
                                  "cache_length")),
              v=each(cache["v"], ("batch", "act_kv_heads", "cache_length",
                                  None)),
              pos=constrain(cache["pos"], ("batch", "cache_length")),
              valid=constrain(cache["valid"], ("batch", "cache_length")))


def _logits_at(params, cfg: ModelConfig, h_BD):
  return decoder.unembed_with(decoder.unembed_params(params, cfg), cfg, h_BD)


def extend(params, cfg: ModelConfig, cache: decoder.Cache, tokens_BT,
           mask_BT, logits_BV=None):
  """Appends tokens (a tool observation, a prompt) to the rows' contexts.

  Earlier context is read from the cache, never recomputed. Rows may add
  different numbers of tokens, padded on either side (mask_BT False);
  positions continue from each row's last real one.

  Args:
    params, cfg: the model.
    cache: written at slots index .. index + T for every row.
    tokens_BT: int token ids.
    mask_BT: True on real tokens.
    logits_BV: the rows' current next-token logits; rows that add no token
      keep them. None: such rows get logits of no meaning.

  Returns:
    (cache, logits_BV after each row's last real token).
  """
  mask_BT = mask_BT.astype(bool)
  T = tokens_BT.shape[1]
  start_B = next_positions(cache)
  pos_BT = start_B[:, None] + jnp.cumsum(mask_BT.astype(jnp.int32), 1) - 1
  pos_BT = jnp.maximum(pos_BT, 0)
  h_BTD, cache = decoder.hidden_states(params, cfg, tokens_BT, pos_BT,
                                       mask_BT, cache)
  # Only the last real token of each row needs logits: [B, V], not [B, T, V].
  last_B = T - 1 - jnp.argmax(mask_BT[:, ::-1], axis=1)
  h_BD = jnp.take_along_axis(h_BTD, last_B[:, None, None], axis=1)[:, 0]
  logits = _logits_at(params, cfg, h_BD)
  if logits_BV is not None:
    logits = jnp.where(jnp.any(mask_BT, 1)[:, None], logits, logits_BV)
  return constrain_cache(cache), logits


def _step(params, cfg: ModelConfig, sp: SamplingParams, stop: StopSpec,
          carry):
  """Sample one token per active row, then write it into the cache."""
  (step, cache, logits_BV, pos_B, active_B, state_B, tokens_BN, lps_BN,
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
  h_B1D, cache = decoder.hidden_states(params, cfg, tok_B[:, None],
                                       pos_B[:, None], active_B[:, None],
                                       cache)
  new_BV = _logits_at(params, cfg, h_B1D[:, 0])
  logits_BV = jnp.where(active_B[:, None], new_BV, logits_BV)
  return (step + 1, cache, logits_BV, pos_B + active_B, active_B & ~done_B,
          state_B, tokens_BN, lps_BN, num_B, jnp.where(done_B, why_B,
                                                       reason_B))


def decode(params, cfg: ModelConfig, cache: decoder.Cache, logits_BV,
           active_B, stop_state_B, sp: SamplingParams, stop: StopSpec,
           max_steps: int) -> DecodeOut:
  """Samples until every active row stops; one `lax.while_loop` on device.

  A row stops on an EOS id, on completing a stop string, after
  `stop.max_new_B` tokens (at most `max_steps`, the static buffer size), or
  when the cache has no free slot left ('cache_full'). Inactive rows are
  left untouched: no token, no valid slot, same logits.

  Args:
    params, cfg: the model.
    cache, logits_BV: from `prefill` / `extend` / an earlier `decode`.
    active_B: bool, rows to sample.
    stop_state_B: int32 stop-string matcher states (0: fresh).
    sp: sampling settings.
    stop: stop conditions.
    max_steps: static; the size of the returned token buffers.
  """
  B, S = cache["valid"].shape
  max_new_B = jnp.minimum(stop.max_new_B, max_steps)
  stop = stop._replace(max_new_B=max_new_B)
  reason_B = jnp.where(active_B & (max_new_B <= 0), LENGTH, NONE)
  active_B = active_B & (max_new_B > 0)
  carry = (jnp.zeros((), jnp.int32), cache, logits_BV, next_positions(cache),
           active_B, stop_state_B.astype(jnp.int32),
           jnp.zeros((B, max_steps), jnp.int32),
           jnp.zeros((B, max_steps), jnp.float32),
           jnp.zeros((B,), jnp.int32), reason_B.astype(jnp.int32))

  def cond(c):
    step, cache, active_B = c[0], c[1], c[4]
    # A per-row index ([B]) must leave every row room for the next token.
    return (step < max_steps) & jnp.any(active_B) & (
        jnp.max(cache["index"]) < S)

  body = lambda c: _step(params, cfg, sp, stop, c)
  (_, cache, logits_BV, _, active_B, state_B, tokens_BN, lps_BN, num_B,
   reason_B) = jax.lax.while_loop(cond, body, carry)
  reason_B = jnp.where(active_B, CACHE_FULL, reason_B)
  return DecodeOut(constrain_cache(cache), logits_BV, state_B, tokens_BN,
                   lps_BN, num_B, reason_B)


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
