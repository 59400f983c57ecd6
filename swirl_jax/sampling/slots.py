"""A slot-per-row KV cache and its jitted programs (the rollout engine's).

The cache is a `decoder.Cache` of M rows with a per-row write index [M]:
each row holds one trajectory, and its slot s holds its token at position
s (no padding inside a row). A program works on a few of the rows: it
gathers them, cut to a static prefix `read_len` (a cache bucket just past
their longest context), runs the decoder's cached path over that and
scatters them back. So attention reads what the rows hold, not what the
cache could hold: appending an observation after 2,048 tokens of context
reads about 2,048 slots, after 256 about 256.

Padding rows of a batch bucket use a scratch row M past the M real ones:
what they compute is written there and never read.

Two programs, each compiled once per (rows bucket, read_len[, tokens]):
`append` (prefill a freed row, or add an observation) and `decode_chunk`
(a few decode steps of the rows that are ready).
"""

import collections
import functools

import jax
import jax.numpy as jnp

from swirl_jax.models import decoder
from swirl_jax.models.config import ModelConfig
from swirl_jax.sampling import decoding


def init(cfg: ModelConfig, rows: int, length: int, dtype: str | None):
  """(cache, logits, stop states) of `rows` empty rows, plus one scratch
  row (index `rows`) that batch padding reads and writes. Jitted under
  `sharding.use_mesh` (`Programs.init`), each device allocates only its
  shard (KV heads over 'tensor')."""
  cache = decoder.init_cache(cfg, rows + 1, length, dtype)
  cache["index"] = jnp.zeros((rows + 1,), jnp.int32)
  return (decoding.constrain_cache(cache),
          jnp.zeros((rows + 1, cfg.vocab_size), jnp.float32),
          jnp.zeros((rows + 1,), jnp.int32))


# Rows move with one dynamic slice / update each, not a gather / scatter:
# XLA's CPU scatter runs element by element, a copy row by row is a memcpy.
def _take(x, rows):
  size = (1,) + x.shape[1:]
  return jnp.concatenate([jax.lax.dynamic_slice(
      x, (r,) + (0,) * (x.ndim - 1), size) for r in rows], axis=0)


def _cut(x, axis: int, length: int):
  return jax.lax.slice_in_dim(x, 0, length, axis=axis)


def _put(x, y, rows_A):
  for i, r in enumerate(rows_A):
    x = jax.lax.dynamic_update_slice(x, y[i:i + 1],
                                     (r,) + (0,) * (x.ndim - 1))
  return x


def _gather(cache, rows_A, read_len: int, fresh_A=None):
  """Rows `rows_A`, slots [0, read_len); a row's valid slots are those
  below its index (stale ones of an earlier row are dropped here)."""
  M = cache["index"].shape[0] - 1
  rows = [rows_A[i] for i in range(rows_A.shape[0])]
  real_A = rows_A < M
  index_A = jnp.where(real_A, cache["index"][rows_A], 0)
  if fresh_A is not None:
    index_A = jnp.where(fresh_A, 0, index_A)
  take = lambda x, axis: _take(_cut(x, axis, read_len), rows)
  valid = take(cache["valid"], 1) & (
      jnp.arange(read_len)[None, :] < index_A[:, None])
  return dict(k=tuple(take(x, 3) for x in cache["k"]),
              v=tuple(take(x, 2) for x in cache["v"]),
              pos=take(cache["pos"], 1), valid=valid, index=index_A)


def _scatter(cache, sub, rows_A):
  rows = [rows_A[i] for i in range(rows_A.shape[0])]
  return dict(k=tuple(_put(x, y, rows) for x, y in zip(cache["k"],
                                                          sub["k"])),
              v=tuple(_put(x, y, rows) for x, y in zip(cache["v"],
                                                          sub["v"])),
              pos=_put(cache["pos"], sub["pos"], rows),
              valid=_put(cache["valid"], sub["valid"], rows),
              index=cache["index"].at[rows_A].set(sub["index"]))


def append(params, cfg: ModelConfig, cache, logits_MV, stop_M, rows_A,
           fresh_A, tokens_AT, mask_AT, read_len: int):
  """Appends right-padded tokens to rows; `fresh_A` rows start empty
  (a prefill into a freed row). Returns (cache, logits, stop states)."""
  rows = [rows_A[i] for i in range(rows_A.shape[0])]
  sub = _gather(cache, rows_A, read_len, fresh_A)
  sub, new_AV = decoding.extend(params, cfg, sub, tokens_AT, mask_AT,
                                _take(logits_MV, rows))
  return (_scatter(cache, sub, rows_A), _put(logits_MV, new_AV, rows),
          stop_M.at[rows_A].set(0))


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
  rows = [rows_R[i] for i in range(rows_R.shape[0])]
  sub = _gather(cache, rows_R, read_len)
  keys_R = jax.vmap(lambda s: jax.random.fold_in(jax.random.key(s), 0))(
      seeds_R)
  temperature_R, top_k_R, top_p_R = sampling_R
  sp = decoding.SamplingParams(keys_R, temperature_R, top_k_R, top_p_R)
  real_R = rows_R < cache["index"].shape[0] - 1
  out = decoding.decode(params, cfg, sub, _take(logits_MV, rows), real_R,
                        stop_M[rows_R], sp,
                        decoding.StopSpec(max_new_R, eos_E, table_QV), steps)
  return (_scatter(cache, out.cache, rows_R),
          _put(logits_MV, out.logits_BV, rows),
          stop_M.at[rows_R].set(out.stop_state_B),
          out.tokens_BN, out.logprobs_BN, out.num_B, out.reason_B)


class Programs:
  """`init`, `append` and `decode_chunk` jitted for one model config and
  mesh (a trace holds its mesh's shardings); the cache, logits and stop
  states are donated (updated in place)."""

  def __init__(self, cfg: ModelConfig):
    self.trace_counts = collections.Counter()
    self.init = jax.jit(functools.partial(init, cfg),
                        static_argnums=(0, 1, 2))
    counted = functools.partial(decoding.count_traces, self.trace_counts)

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


_PROGRAMS: dict[tuple, Programs] = {}


def programs(cfg: ModelConfig, mesh=None, rules=()) -> Programs:
  # The mesh and rules are part of the key because model code reads them
  # when it is traced (under `sharding.use_mesh`).
  key = (cfg, mesh, tuple(rules))
  if key not in _PROGRAMS:
    _PROGRAMS[key] = Programs(cfg)
  return _PROGRAMS[key]
