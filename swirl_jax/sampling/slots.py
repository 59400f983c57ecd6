"""A slot-per-row KV cache and its jitted programs (the rollout engine's).

The cache is a `decoder.Cache` of M rows with a per-row write index [M]:
each row holds one trajectory, and its slot s holds its token at position
s (no padding inside a row). A program works on a few of the rows: it
gathers them, cut to a static prefix `read_len` (a cache bucket just past
their longest context), runs the decoder's cached path over that and
scatters them back. So attention reads what the rows hold, not what the
cache could hold: appending an observation after 2,048 tokens of context
reads about 2,048 slots, after 256 about 256.

Padding rows of a batch bucket carry the row index M (out of range): the
gather clamps it and the scatter drops it, so they touch nothing.

Two programs, each compiled once per (rows bucket, read_len[, tokens]):
`append` (prefill a freed row, or add an observation) and `decode_chunk`
(a few decode steps of the rows that are ready).
"""

import collections

import jax
import jax.numpy as jnp

from swirl_jax.models import decoder
from swirl_jax.models.config import ModelConfig
from swirl_jax.sampling import decoding


def init(cfg: ModelConfig, rows: int, length: int, dtype: str | None):
  """(cache, logits [M, V], stop states [M]) of `rows` empty rows."""
  cache = decoder.init_cache(cfg, rows, length, dtype)
  cache["index"] = jnp.zeros((rows,), jnp.int32)
  return (cache, jnp.zeros((rows, cfg.vocab_size), jnp.float32),
          jnp.zeros((rows,), jnp.int32))


def _gather(cache, rows_A, read_len: int):
  real_A = rows_A < cache["index"].shape[0]
  return dict(k=tuple(x[rows_A, :, :, :read_len] for x in cache["k"]),
              v=tuple(x[rows_A, :, :read_len] for x in cache["v"]),
              pos=cache["pos"][rows_A, :read_len],
              valid=cache["valid"][rows_A, :read_len] & real_A[:, None],
              # Padding rows write at slot 0 of their (dropped) copy.
              index=jnp.where(real_A, cache["index"][rows_A], 0))


def _scatter(cache, sub, rows_A, read_len: int):
  put = lambda x, y, *cut: x.at[(rows_A,) + cut].set(y, mode="drop")
  cut = slice(0, read_len)
  return dict(
      k=tuple(put(x, y, slice(None), slice(None), cut)
              for x, y in zip(cache["k"], sub["k"])),
      v=tuple(put(x, y, slice(None), cut) for x, y in zip(cache["v"],
                                                          sub["v"])),
      pos=put(cache["pos"], sub["pos"], cut),
      valid=put(cache["valid"], sub["valid"], cut),
      index=cache["index"].at[rows_A].set(sub["index"], mode="drop"))


def append(params, cfg: ModelConfig, cache, logits_MV, stop_M, rows_A,
           fresh_A, tokens_AT, mask_AT, read_len: int):
  """Appends right-padded tokens to rows; `fresh_A` rows start empty
  (a prefill into a freed row). Returns (cache, logits, stop states)."""
  M = cache["index"].shape[0]
  reset = jnp.where(fresh_A, rows_A, M)
  cache = dict(cache, valid=cache["valid"].at[reset].set(False, mode="drop"),
               index=cache["index"].at[reset].set(0, mode="drop"))
  sub = _gather(cache, rows_A, read_len)
  sub, new_AV = decoding.extend(params, cfg, sub, tokens_AT, mask_AT,
                                logits_MV[rows_A])
  return (_scatter(cache, sub, rows_A, read_len),
          logits_MV.at[rows_A].set(new_AV, mode="drop"),
          stop_M.at[rows_A].set(0, mode="drop"))


def decode_chunk(params, cfg: ModelConfig, cache, logits_MV, stop_M, rows_R,
                 seeds_R, sampling_R, max_new_R, eos_E, table_QV,
                 read_len: int, steps: int):
  """Up to `steps` decode steps of rows `rows_R` (all of them active).

  Each row's key is fold_in(key(seed), 0), as the `Sampler` makes it for
  per-row seeds, and a token's key folds in its position: a row draws the
  same tokens in any slot, beside any rows.

  Returns (cache, logits, stop states, tokens_RN, logprobs_RN, num_R,
  reason_R).
  """
  sub = _gather(cache, rows_R, read_len)
  keys_R = jax.vmap(lambda s: jax.random.fold_in(jax.random.key(s), 0))(
      seeds_R)
  temperature_R, top_k_R, top_p_R = sampling_R
  sp = decoding.SamplingParams(keys_R, temperature_R, top_k_R, top_p_R)
  real_R = rows_R < cache["index"].shape[0]
  out = decoding.decode(params, cfg, sub, logits_MV[rows_R], real_R,
                        stop_M[rows_R], sp,
                        decoding.StopSpec(max_new_R, eos_E, table_QV), steps)
  return (_scatter(cache, out.cache, rows_R, read_len),
          logits_MV.at[rows_R].set(out.logits_BV, mode="drop"),
          stop_M.at[rows_R].set(out.stop_state_B, mode="drop"),
          out.tokens_BN, out.logprobs_BN, out.num_B, out.reason_B)


class Programs:
  """`append` and `decode_chunk` jitted for one model config; the cache,
  logits and stop states are donated (updated in place)."""

  def __init__(self, cfg: ModelConfig):
    self.trace_counts = collections.Counter()

    def counted(name, fn):
      def traced(*args):
        self.trace_counts[name] += 1  # Runs once per trace (compilation).
        return fn(*args)
      return traced

    def append_(params, cache, logits, stop, rows, fresh, tokens, mask,
                read_len):
      return append(params, cfg, cache, logits, stop, rows, fresh, tokens,
                    mask, read_len)

    def decode_(params, cache, logits, stop, rows, seeds, sampling, max_new,
                eos, table, read_len, steps):
      return decode_chunk(params, cfg, cache, logits, stop, rows, seeds,
                          sampling, max_new, eos, table, read_len, steps)

    self.append = jax.jit(counted("append", append_), static_argnums=8,
                          donate_argnums=(1, 2, 3))
    self.decode = jax.jit(counted("decode", decode_),
                          static_argnums=(10, 11), donate_argnums=(1, 2, 3))


_PROGRAMS: dict[str, Programs] = {}


def programs(cfg: ModelConfig) -> Programs:
  key = repr(cfg)  # ModelConfig is unhashable; its repr names every field.
  if key not in _PROGRAMS:
    _PROGRAMS[key] = Programs(cfg)
  return _PROGRAMS[key]
