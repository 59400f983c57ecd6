"""The rollout engine's device work on a `Sampler`'s model: a slot-per-row
KV cache (`sampling/slots.py`) and its batched, bucketed programs.

The engine decides which rows prefill, append or decode; this module turns
a group of rows into one call of a compiled program (a fixed, small set:
`trace_counts`; the shapes run: `shapes`) and reads back what it sampled.
A row's key is fold_in(key(row seed), 0) and each token's folds in its
position, as the `Sampler` makes them: tokens depend on the row alone.

On a `Sampler` with a mesh, decode is tensor parallel: weights and KV
heads over the mesh's 'tensor' axis, every row of a group on each of its
devices. The mesh's 'data' groups each get a `SlotDevice` of their own
(`DataGroups`: own cache rows, own programs on the group's devices): the
engine moves single rows in and out of a cache each call, which stays a
local copy only while each device holds every row of its cache; a slot
lives in one group and the groups run side by side.
"""

import collections
import contextlib

import jax
import numpy as np
from swirl_jax import sharding as shd
from swirl_jax.sampling import decoding, slots
from swirl_jax.shapes import bucket, buckets_upto


class SlotDevice:
  """`Sampler` (params, sizes, stop tables, token texts) on cache rows."""

  def __init__(self, sampler, decode_batch: int, chunk_steps: int,
               append_tokens: int = 64, mesh=None, slot_of=None):
    self.sampler = sampler
    self.decode_batch, self.steps = decode_batch, chunk_steps
    # Appends go in pieces of at most this many tokens (a long prompt or
    # observation takes several calls): the append programs are one per
    # (piece bucket, read_len), not one per prompt length.
    self.append_tokens = append_tokens
    self.mesh = sampler.mesh if mesh is None else mesh
    self._slot = slot_of or (lambda r: r.slot)  # A row's cache row here.
    self.rules = decoding.decode_rules(sampler.rules)
    self.programs = slots.programs(sampler.cfg, self.mesh, self.rules)
    self._shardings = None if self.mesh is None else decoding.param_shardings(
        sampler.cfg, self.mesh, self.rules, split=True)
    self._params = None
    self.limit = sampler.config.max_cache_len  # Context tokens per row.
    # Decode chunks write up to chunk_steps past a row's last token.
    self.S = self.limit + chunk_steps
    self.shapes = collections.Counter()  # (program, rows, ..., read_len).
    self._dev, self._M = None, 0
    self._precompiled = set()  # (cache rows, stop strings) compiled for.

  @property
  def trace_counts(self) -> collections.Counter:
    return self.programs.trace_counts

  def _on_mesh(self):
    return (contextlib.nullcontext() if self.mesh is None
            else shd.use_mesh(self.mesh, self.rules))

  def open(self, num_rows: int, max_slots: int) -> int:
    """Allocates the cache and takes the sampler's current params on this
    device's mesh (no copy where they are laid out so already); returns
    the cache's number of rows (slots)."""
    sc = self.sampler.config
    self._M = min(max_slots, bucket(num_rows, sc.batch_buckets))
    # A data group's copy is the sampler's own buffers on its devices.
    self._params = self.sampler.params if self.mesh is None else \
        jax.tree.map(shd.reuse_shards, self.sampler.params, self._shardings)
    with self._on_mesh():
      self._dev = self.programs.init(self._M, self.S, sc.cache_dtype)
    self.shapes = collections.Counter()
    return self._M

  def close(self) -> None:
    self._dev = self._params = None

  def append(self, rows, fresh: bool) -> None:
    """Prefills (fresh) or appends each row's `obs` into its cache row, a
    decode batch of rows and `append_tokens` tokens at a time; row lengths
    are the engine's to update."""
    C = self.append_tokens
    for lo in range(0, len(rows), self.decode_batch):
      group = rows[lo:lo + self.decode_batch]
      for k in range(0, max(len(r.obs) for r in group), C):
        part = [r for r in group if len(r.obs) > k]
        self._append(part, [r.obs[k:k + C] for r in part],
                     [(0 if fresh else r.length) + k for r in part],
                     fresh and k == 0)

  def _piece_len(self, n: int) -> int:
    return bucket(n, [b for b in self.sampler.config.length_buckets
                      if b < self.append_tokens] + [self.append_tokens])

  def _append(self, group, pieces, start, fresh: bool) -> None:
    T = self._piece_len(max(len(p) for p in pieces))
    if max(start) + T > self.S:  # Rare: near the end of the cache.
      if len(group) > 1:
        for r, p, s in zip(group, pieces, start):
          self._append([r], [p], [s], fresh)
        return
      T = self.S - start[0]
    read_len = min(bucket(max(start) + T, self.sampler.config.cache_buckets),
                   self.S)
    A = self.decode_batch  # Rows: one shape, padded with the scratch row.
    self.shapes["append", A, T, read_len] += 1
    tokens, mask = np.zeros((A, T), np.int32), np.zeros((A, T), bool)
    rows_A = np.full((A,), self._M, np.int32)
    for i, (r, p) in enumerate(zip(group, pieces)):
      tokens[i, :len(p)], mask[i, :len(p)] = p, True
      rows_A[i] = self._slot(r)
    self._call_append(rows_A, (np.arange(A) < len(group)) & fresh, tokens,
                      mask, read_len)

  def _call_append(self, rows_A, fresh_A, tokens, mask, read_len) -> None:
    with self._on_mesh():
      self._dev = self.programs.append(self._params, *self._dev, rows_A,
                                       fresh_A, tokens, mask, read_len)

  def read_lens(self) -> list[int]:
    """Every prefix of the cache a program may read."""
    return buckets_upto(self.S, self.sampler.config.cache_buckets)

  def precompile(self, config, stop_strings) -> None:
    """Compiles every program a rollout can call (after `open`): appends
    of each piece bucket and decode chunks of each row bucket up to the
    decode batch, at each read length. They run on the scratch row only,
    so the cache's rows are untouched. Compiling them all up front keeps
    compiles out of the rollouts (at the cost of programs a short rollout
    would never use)."""
    A, M = self.decode_batch, self._M
    if (M, stop_strings) in self._precompiled:
      return
    self._precompiled.add((M, stop_strings))
    rows = np.full((A,), M, np.int32)
    for read_len in self.read_lens():
      for T in sorted({self._piece_len(n)
                       for n in range(1, self.append_tokens + 1)}):
        if T <= read_len:
          self._call_append(rows, np.zeros(A, bool), np.zeros((A, T),
                            np.int32), np.zeros((A, T), bool), read_len)
      for R in buckets_upto(self.decode_batch,
                            self.sampler.config.batch_buckets):
        self._call_decode(np.full((R,), M, np.int32), np.zeros(R, np.uint32),
                          config, np.zeros(R, np.int32), stop_strings,
                          read_len)

  def select(self, ready: list) -> list:
    """The ready rows the next decode chunk takes."""
    return ready[:self.decode_batch]

  def decode(self, rows, seeds, config, stop_strings):
    """One chunk of up to `chunk_steps` steps of `rows` (each with room),
    stopping at `stop_strings` as well.

    Returns ([(tokens, logprobs, reason)] per row, slot-steps computed).
    """
    return self.decode_finish(self.decode_start(rows, seeds, config,
                                                stop_strings))

  def decode_start(self, rows, seeds, config, stop_strings):
    """Dispatches the chunk (`decode`); `decode_finish` reads it back."""
    sc, steps = self.sampler.config, self.steps
    R = bucket(len(rows), sc.batch_buckets)
    pad = lambda xs, fill, dt: np.asarray(
        list(xs) + [fill] * (R - len(rows)), dt)
    max_new = pad([min(r.budget, self.limit - r.length) for r in rows], 0,
                  np.int32)
    read_len = min(bucket(max(r.length for r in rows) + steps,
                          sc.cache_buckets), self.S)
    self.shapes["decode", R, read_len] += 1
    return len(rows), R, self._call_decode(
        pad([self._slot(r) for r in rows], self._M, np.int32),
        pad(seeds, 0, np.uint32), config, max_new, stop_strings, read_len)

  def decode_finish(self, handle):
    n, R, arrays = handle
    tokens, lps, num, reason = jax.device_get(arrays)
    out = [(tokens[j, :num[j]].tolist(), lps[j, :num[j]].tolist(),
            decoding.REASONS[reason[j]]) for j in range(n)]
    # Every row of the compiled batch runs each step the longest one runs.
    return out, R * int(num.max())

  def _call_decode(self, rows_R, seeds_R, c, max_new_R, stop_strings,
                   read_len):
    """Runs the decode program; returns (tokens, logprobs, num, reason)."""
    R = rows_R.shape[0]
    sampling = (np.full(R, c.temperature, np.float32),
                np.full(R, c.top_k, np.int32), np.full(R, c.top_p, np.float32))
    # pylint: disable-next=protected-access
    eos, table = self.sampler._eos, self.sampler._stop_table(stop_strings)
    with self._on_mesh():
      *dev, tokens, lps, num, reason = self.programs.decode(
          self._params, *self._dev, rows_R, seeds_R, sampling, max_new_R,
          eos, table, read_len, self.steps)
    self._dev = tuple(dev)
    return tokens, lps, num, reason

  def text(self, row, tokens, why: str, stop_strings) -> str:
    """The text of a sampled stretch, as `Sampler.generate` returns it."""
    del row
    # pylint: disable-next=protected-access
    return self.sampler._texts([tokens], [why], stop_strings)[0][0]


class DataGroups:
  """The engine's device on a decode mesh of D > 1 'data' groups: one
  `SlotDevice` per group, on the group's 'tensor' devices. Slot s is cache
  row s // D of group s % D, so slots taken in order spread rows over the
  groups; each call dispatches every group's program before reading any
  back, so the groups compute at once."""

  def __init__(self, sampler, decode_batch: int, chunk_steps: int,
               append_tokens: int = 64):
    devices = sampler.mesh.devices  # [data, tensor]
    self.D = devices.shape[0]
    self.groups = [SlotDevice(
        sampler, decode_batch, chunk_steps, append_tokens,
        mesh=shd.make_mesh([("tensor", devices.shape[1])], list(row)),
        slot_of=lambda r: r.slot // self.D) for row in devices]
    self.limit, self.S = self.groups[0].limit, self.groups[0].S
    self.decode_batch = decode_batch

  @property
  def trace_counts(self) -> collections.Counter:
    return sum((g.trace_counts for g in self.groups), collections.Counter())

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

  def precompile(self, config, stop_strings) -> None:
    for g in self.groups:
      g.precompile(config, stop_strings)

  def append(self, rows, fresh: bool) -> None:
    for g, part in zip(self.groups, self._split(rows)):
      if part:
        g.append(part, fresh)

  def select(self, ready: list) -> list:
    return [r for part in self._split(ready) for r in part[:self.decode_batch]]

  def decode(self, rows, seeds, config, stop_strings):
    seed_of = {id(r): s for r, s in zip(rows, seeds)}
    parts = self._split(rows)
    handles = [g.decode_start(p, [seed_of[id(r)] for r in p], config,
                              stop_strings) if p else None
               for g, p in zip(self.groups, parts)]
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
         append_tokens: int = 64):
  """The engine's device for `sampler`: `DataGroups` when its mesh has
  more than one 'data' group, else a `SlotDevice`."""
  mesh = sampler.mesh
  if mesh is not None and mesh.shape.get("data", 1) > 1:
    if set(mesh.axis_names) - {"data", "tensor"}:
      raise ValueError(f"the rollout engine decodes on a ('data', "
                       f"'tensor') mesh, not {dict(mesh.shape)}")
    return DataGroups(sampler, decode_batch, chunk_steps, append_tokens)
  return SlotDevice(sampler, decode_batch, chunk_steps, append_tokens)
