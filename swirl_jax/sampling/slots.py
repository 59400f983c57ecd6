"""The one KV-cache design: a slot-per-row cache and its programs.

The cache is a `decoder.Cache` of M rows with a per-row write index [M]:
each row holds one context, its slot s the token at position s (no
padding inside a row). A program works on a few rows: it gathers them,
cut to a static prefix `read_len` (a cache bucket just past their longest
context), runs the decoder's cached path over that and scatters them
back. So attention reads what the rows hold, not what the cache could
hold. Padding rows of a batch bucket use a scratch row M past the M real
ones: what they compute is written there and never read.

Three programs, jitted at module level with a static, hashable `Layout`
(model config, mesh, rules, cache dtype) among their arguments, so jax's
own cache holds one compiled program per (layout, shapes) and every
`Sampler` of a model shares them: `init` (an empty cache), `append`
(prefill a row, or add an observation) and `decode` (a chunk of decode
steps of the rows that are ready).

`SlotDevice` (a `device.Device`) turns rows into calls of these programs;
`DataGroups` runs one per data group of a decode mesh. `Sampler.generate`
and the rollout engine both decode with them.
"""

import collections
import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from swirl_jax import sharding as shd
from swirl_jax.models import decoder
from swirl_jax.models.config import ModelConfig
from swirl_jax.sampling import decoding
from swirl_jax.sampling.device import Draw, Lowerable
from swirl_jax.shapes import bucket, buckets_upto


@dataclasses.dataclass(frozen=True)
class Layout:
  """What a program's trace reads besides its arguments: the model, the
  mesh and rules its constraints use, the cache dtype."""
  cfg: ModelConfig
  mesh: Mesh | None = None
  rules: tuple = ()
  cache_dtype: str | None = None

  def active(self):
    """The mesh context to call (or lower) a program in: jit cannot enter
    it while tracing."""
    return (contextlib.nullcontext() if self.mesh is None
            else shd.use_mesh(self.mesh, self.rules))


@functools.partial(jax.jit, static_argnames=("layout", "rows", "length"))
def init(*, layout: Layout, rows: int, length: int):
  """(cache, logits, stop states) of `rows` empty rows of `length` slots,
  plus the scratch row (index `rows`). Under `layout.active()` each device
  allocates only its shard (KV heads over 'tensor')."""
  cfg = layout.cfg
  cache = decoder.init_cache(cfg, rows + 1, length, layout.cache_dtype)
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


def _put(x, y, rows):
  for i, r in enumerate(rows):
    x = jax.lax.dynamic_update_slice(x, y[i:i + 1],
                                     (r,) + (0,) * (x.ndim - 1))
  return x


def _gather(cache, rows_A, read_len: int, fresh_A=None):
  """Rows `rows_A`, slots [0, read_len); a row's valid slots are those
  below its index (stale ones of an earlier row are dropped here)."""
  M = cache["index"].shape[0] - 1
  rows = list(rows_A)
  index_A = jnp.where(rows_A < M, cache["index"][rows_A], 0)
  if fresh_A is not None:
    index_A = jnp.where(fresh_A, 0, index_A)
  take = lambda x, axis: _take(jax.lax.slice_in_dim(x, 0, read_len,
                                                    axis=axis), rows)
  valid = take(cache["valid"], 1) & (
      jnp.arange(read_len)[None, :] < index_A[:, None])
  return dict(k=tuple(take(x, 3) for x in cache["k"]),
              v=tuple(take(x, 2) for x in cache["v"]),
              pos=take(cache["pos"], 1), valid=valid, index=index_A)


def _scatter(cache, sub, rows_A):
  rows = list(rows_A)
  each = lambda xs, ys: tuple(_put(x, y, rows) for x, y in zip(xs, ys))
  return dict(k=each(cache["k"], sub["k"]), v=each(cache["v"], sub["v"]),
              pos=_put(cache["pos"], sub["pos"], rows),
              valid=_put(cache["valid"], sub["valid"], rows),
              index=cache["index"].at[rows_A].set(sub["index"]))


@functools.partial(jax.jit, static_argnames=("layout", "read_len"),
                   donate_argnums=(1,))
def append(params, dev, rows_A, fresh_A, tokens_AT, mask_AT, *,
           layout: Layout, read_len: int):
  """Appends right-padded tokens to rows; `fresh_A` rows start empty (a
  prefill into a freed row). `dev` = (cache, logits, stop states), donated
  (updated in place); returns (the new one,)."""
  cache, logits_MV, stop_M = dev
  rows = list(rows_A)
  sub = _gather(cache, rows_A, read_len, fresh_A)
  sub, new_AV = decoding.extend(params, layout.cfg, sub, tokens_AT, mask_AT,
                                _take(logits_MV, rows))
  return ((_scatter(cache, sub, rows_A), _put(logits_MV, new_AV, rows),
           stop_M.at[rows_A].set(0)),)


@functools.partial(jax.jit, static_argnames=("layout", "read_len", "steps"),
                   donate_argnums=(1,))
def decode(params, dev, rows_R, draws_R, max_new_R, eos_E, table_QV, *,
           layout: Layout, read_len: int, steps: int):
  """Up to `steps` decode steps of rows `rows_R` (all of them active).

  `draws_R` = (seeds, salts, temperature, top_k, top_p): a row's key is
  fold_in(key(seed), salt) and a token's folds in its position, so a row
  draws the same tokens in any slot, beside any rows.

  Returns (dev, tokens_RN, logprobs_RN, num_R, reason_R).
  """
  cache, logits_MV, stop_M = dev
  rows = list(rows_R)
  seeds_R, salts_R, temperature_R, top_k_R, top_p_R = draws_R
  keys_R = jax.vmap(lambda s, t: jax.random.fold_in(jax.random.key(s), t))(
      seeds_R, salts_R)
  sp = decoding.SamplingParams(keys_R, temperature_R, top_k_R, top_p_R)
  real_R = rows_R < cache["index"].shape[0] - 1
  out = decoding.decode(params, layout.cfg, _gather(cache, rows_R, read_len),
                        _take(logits_MV, rows), real_R, stop_M[rows_R], sp,
                        decoding.StopSpec(max_new_R, eos_E, table_QV), steps)
  dev = (_scatter(cache, out.cache, rows_R),
         _put(logits_MV, out.logits_BV, rows),
         stop_M.at[rows_R].set(out.stop_state_B))
  return dev, out.tokens_BN, out.logprobs_BN, out.num_B, out.reason_B


def _draw_arrays(draws, n: int):
  """Per-row draw arrays, padded to `n` rows (padding: greedy, seed 0)."""
  pad = list(draws) + [Draw(0)] * (n - len(draws))
  col = lambda i, dt: np.asarray([d[i] for d in pad], dt)
  key = lambda i: col(i, np.int64).astype(np.uint32)  # Any int wraps.
  return (key(0), key(4), col(1, np.float32), col(2, np.int32),
          col(3, np.float32))


class SlotDevice:
  """A `Sampler`'s model (params, sizes, EOS, stop tables, detokeniser) on
  cache rows: a `device.Device`.

  Appends go in pieces of at most `append_tokens` tokens (a long prompt
  or observation takes several calls), so the append programs are one per
  (piece bucket, read_len), not one per prompt length. A row holds
  `limit` tokens of context; the cache has one slot more, so a row that
  ends exactly at the limit does not end its neighbours' chunk.
  """

  def __init__(self, sampler, decode_batch: int, chunk_steps: int,
               append_tokens: int = 64, limit: int = 0, mesh=None,
               slot_of=None):
    self.sampler, self.config = sampler, sampler.config
    self.decode_batch, self.steps = decode_batch, chunk_steps
    self.append_tokens = append_tokens
    mesh = sampler.mesh if mesh is None else mesh
    # Tensor parallel: rows whole on every device, weights over 'tensor'.
    self.layout = Layout(sampler.cfg, mesh,
                         decoding.decode_rules(sampler.rules),
                         self.config.cache_dtype)
    self._slot = slot_of or (lambda r: r.slot)  # A row's cache row here.
    self._shardings = None if mesh is None else decoding.param_shardings(
        sampler.cfg, mesh, self.layout.rules, split=True)
    self.limit = limit or self.config.max_cache_len
    self.S = self.limit + 1
    self.shapes = collections.Counter()  # (program, rows, ..., read_len).
    self._dev, self._params, self._M = None, None, 0
    self._precompiled = set()  # (cache rows, stop strings) compiled for.

  def open(self, num_rows: int, max_slots: int) -> int:
    """Allocates the cache and takes the sampler's current params on this
    device's mesh (no copy where they are laid out so already)."""
    self._M = min(max_slots, bucket(num_rows, self.config.batch_buckets))
    self.set_params(self.sampler.params)
    with self.layout.active():
      self._dev = init(layout=self.layout, rows=self._M, length=self.S)
    self.shapes = collections.Counter()
    return self._M

  def close(self) -> None:
    self._dev = self._params = None

  def set_params(self, params) -> None:
    """The params the next program calls decode with, on this device's
    mesh (a data group's copy is the given buffers on its devices)."""
    self._params = params if self._shardings is None else jax.tree.map(
        shd.reuse_shards, params, self._shardings)

  def block(self) -> None:
    """Waits for the programs dispatched so far (for timing them)."""
    jax.block_until_ready(self._dev)

  # -- appends --

  def append(self, rows, fresh: bool) -> None:
    C = self.append_tokens
    for lo in range(0, len(rows), self.decode_batch):
      group = rows[lo:lo + self.decode_batch]
      for k in range(0, max(len(r.obs) for r in group), C):
        part = [r for r in group if len(r.obs) > k]
        self._append([self._slot(r) for r in part],
                     [r.obs[k:k + C] for r in part],
                     [(0 if fresh else r.length) + k for r in part],
                     fresh and k == 0)

  def _piece_len(self, n: int) -> int:
    return bucket(n, [b for b in self.config.length_buckets
                      if b < self.append_tokens] + [self.append_tokens])

  def _append(self, slots, pieces, start, fresh: bool) -> None:
    T = self._piece_len(max(len(p) for p in pieces))
    if max(start) + T > self.S:  # Rare: near the end of the cache.
      if len(slots) > 1:
        for args in zip(slots, pieces, start):
          self._append(*([a] for a in args), fresh)
        return
      T = self.S - start[0]
    read_len = min(bucket(max(start) + T, self.config.cache_buckets),
                   self.S)
    A = self.decode_batch  # Rows: one shape, padded with the scratch row.
    self.shapes["append", A, T, read_len] += 1
    tokens, mask = np.zeros((A, T), np.int32), np.zeros((A, T), bool)
    for i, p in enumerate(pieces):
      tokens[i, :len(p)], mask[i, :len(p)] = p, True
    self._call(append, (self._padded(slots, A),
                        (np.arange(A) < len(slots)) & fresh, tokens, mask),
               read_len=read_len)

  def _padded(self, slots, n: int) -> np.ndarray:
    return np.asarray(list(slots) + [self._M] * (n - len(slots)), np.int32)

  def _call(self, program, args, **static):
    """Runs `program` on this device's cache; returns its other outputs."""
    with self.layout.active():
      self._dev, *out = program(self._params, self._dev, *args,
                                layout=self.layout, **static)
    return out

  # -- decoding --

  def select(self, ready: list) -> list:
    return ready[:self.decode_batch]

  def decode(self, rows, draws, stop_strings):
    return self.decode_finish(self.decode_start(rows, draws, stop_strings))

  def decode_start(self, rows, draws, stop_strings):
    """Dispatches the chunk (`decode`); `decode_finish` reads it back."""
    R = bucket(len(rows), self.config.batch_buckets)
    max_new = [min(r.budget, self.limit - r.length) for r in rows]
    read_len = min(bucket(max(r.length for r in rows) + self.steps,
                          self.config.cache_buckets), self.S)
    self.shapes["decode", R, read_len] += 1
    out = self._call(decode, self._decode_args(
        [self._slot(r) for r in rows], draws, max_new, R, stop_strings),
                     read_len=read_len, steps=self.steps)
    return len(rows), R, out

  def _decode_args(self, slots, draws, max_new, R: int, stop_strings):
    return (self._padded(slots, R), _draw_arrays(draws, R),
            np.asarray(list(max_new) + [0] * (R - len(max_new)), np.int32),
            self.sampler.eos_ids, self.sampler.stop_table(stop_strings))

  def decode_finish(self, handle):
    n, R, arrays = handle
    tokens, lps, num, reason = jax.device_get(arrays)
    out = [(tokens[j, :num[j]].tolist(), lps[j, :num[j]].tolist(),
            decoding.REASONS[reason[j]]) for j in range(n)]
    # Every row of the compiled batch runs each step the longest one runs.
    return out, R * int(num.max())

  def text(self, row, tokens, why: str, stop_strings) -> str:
    del row
    return self.sampler.detokenize(tokens, why, stop_strings)[0]

  # -- every program, ahead of time --

  def read_lens(self) -> list[int]:
    """Every prefix of the cache a program may read."""
    return buckets_upto(self.S, self.config.cache_buckets)

  def _programs(self, M: int, stop_strings, read_lens):
    """(program, args, static) of every call shape a run can make, on the
    scratch row (M) only: appends of each piece bucket and decode chunks
    of each row bucket up to the decode batch, at each read length."""
    A = self.decode_batch
    pieces = sorted({self._piece_len(n)
                     for n in range(1, self.append_tokens + 1)})
    for read_len in read_lens:
      for T in (T for T in pieces if T <= read_len):
        yield append, (np.full(A, M, np.int32), np.zeros(A, bool),
                       np.zeros((A, T), np.int32), np.zeros((A, T), bool)
                       ), dict(read_len=read_len)
      for R in buckets_upto(A, self.config.batch_buckets):
        yield decode, (np.full(R, M, np.int32),) + self._decode_args(
            [], [], [], R, stop_strings)[1:], dict(read_len=read_len,
                                                   steps=self.steps)

  def precompile(self, stop_strings) -> None:
    """Runs every program a run can call once (after `open`), so none
    compiles mid-run, at the cost of programs a short run never uses."""
    if (self._M, stop_strings) in self._precompiled:
      return
    self._precompiled.add((self._M, stop_strings))
    for program, args, static in self._programs(self._M, stop_strings,
                                                self.read_lens()):
      self._call(program, args, **static)

  def lowerable(self, slots: int, stop_strings) -> dict[str, Lowerable]:
    """`append` and `decode` of a full decode batch at the full cache of
    `slots` rows, from abstract arguments (the params as a trainer's
    sampling params are held here: compute dtype, this mesh's layout):
    nothing is allocated. What the fit job compiles."""
    cfg, lay = self.sampler.cfg, self.layout
    cfg = cfg.replace(param_dtype=cfg.dtype)
    params = decoding.abstract_params(cfg, split=True)
    if self._shardings is not None:
      params = jax.tree.map(_with_sharding, params, self._shardings)
    with lay.active():
      shardings = init.lower(layout=lay, rows=slots, length=self.S).compile(
      ).output_shardings
    dev = jax.tree.map(_with_sharding, jax.eval_shape(functools.partial(
        init, layout=lay, rows=slots, length=self.S)), shardings)
    whole = (lambda x: x) if lay.mesh is None else (
        lambda x: _with_sharding(x, NamedSharding(lay.mesh, P())))
    out = {}
    T, R = self._piece_len(self.append_tokens), self.decode_batch
    for program, args, static in self._programs(slots, stop_strings,
                                                [self.S]):
      if (args[2].shape[1] == T if program is append
          else args[0].shape[0] == R):
        out[program.__name__] = Lowerable(
            program, (params, dev) + jax.tree.map(whole, args),
            dict(static, layout=lay), lay)
    return out


def _with_sharding(x, sharding):
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


class DataGroups:
  """The device on a decode mesh of D > 1 'data' groups: one `SlotDevice`
  per group, on the group's 'tensor' devices. Slot s is cache row s // D of
  group s % D, so slots taken in order spread rows over the groups; each
  decode dispatches every group's program before reading any back, so
  the groups compute at once."""

  def __init__(self, sampler, decode_batch: int, chunk_steps: int,
               append_tokens: int = 64, limit: int = 0):
    mesh = sampler.mesh  # ('data', 'tensor'), other axes of size 1.
    self.D = mesh.shape["data"]
    devices = np.moveaxis(mesh.devices, mesh.axis_names.index("data"),
                          0).reshape(self.D, -1)
    self.groups = [SlotDevice(
        sampler, decode_batch, chunk_steps, append_tokens, limit,
        mesh=shd.make_mesh([("tensor", devices.shape[1])], list(row)),
        slot_of=lambda r: r.slot // self.D) for row in devices]
    self.limit, self.S = self.groups[0].limit, self.groups[0].S
    self.decode_batch = decode_batch

  @property
  def shapes(self) -> collections.Counter:
    return sum((g.shapes for g in self.groups), collections.Counter())

  def _split(self, rows):
    by = [[] for _ in self.groups]
    for r in rows:
      by[r.slot % self.D].append(r)
    return by

  def open(self, num_rows: int, max_slots: int) -> int:
    """`max_slots` cache rows in each group; returns the slots in all."""
    per = -(-num_rows // self.D)
    return self.D * min(g.open(per, max_slots) for g in self.groups)

  def close(self) -> None:
    for g in self.groups:
      g.close()

  def set_params(self, params) -> None:
    for g in self.groups:
      g.set_params(params)

  def precompile(self, stop_strings) -> None:
    for g in self.groups:
      g.precompile(stop_strings)

  def lowerable(self, slots: int, stop_strings):
    """One group's programs, `slots` rows each (all run the same)."""
    return self.groups[0].lowerable(slots, stop_strings)

  def append(self, rows, fresh: bool) -> None:
    for g, part in zip(self.groups, self._split(rows)):
      if part:
        g.append(part, fresh)

  def select(self, ready: list) -> list:
    return [r for part in self._split(ready) for r in part[:self.decode_batch]]

  def decode(self, rows, draws, stop_strings):
    draw_of = {id(r): d for r, d in zip(rows, draws)}
    parts = self._split(rows)
    handles = [g.decode_start(p, [draw_of[id(r)] for r in p], stop_strings)
               if p else None for g, p in zip(self.groups, parts)]
    got, steps = {}, 0
    for g, p, h in zip(self.groups, parts, handles):
      if h is not None:
        out, n = g.decode_finish(h)
        got.update(zip(map(id, p), out))
        steps += n
    return [got[id(r)] for r in rows], steps

  def text(self, row, tokens, why: str, stop_strings) -> str:
    return self.groups[0].text(row, tokens, why, stop_strings)


def make(sampler, decode_batch: int, chunk_steps: int,
         append_tokens: int = 64, limit: int = 0):
  """The device for `sampler`: `DataGroups` when its mesh has more than
  one 'data' group, else a `SlotDevice`."""
  mesh = sampler.mesh
  if mesh is not None and mesh.shape.get("data", 1) > 1:
    if {a for a, n in mesh.shape.items() if n > 1} - {"data", "tensor"}:
      raise ValueError(f"the slot cache decodes on a ('data', 'tensor') "
                       f"mesh, not {dict(mesh.shape)}")
    return DataGroups(sampler, decode_batch, chunk_steps, append_tokens,
                      limit)
  return SlotDevice(sampler, decode_batch, chunk_steps, append_tokens, limit)
