"""The rollout engine: continuous batching, tools run while others decode.

Each trajectory advances on its own. A row that stops at a tool call hands
the call to a thread pool (the sandbox runs its snippets in processes) and
the other rows keep decoding; when the observation is ready it is appended
to that row's cache and the row decodes again. A finished row frees its
cache row at once and the next pending (task, sample) is prefilled into it.
Decode runs in jitted chunks of `chunk_steps` steps between host checks;
prefills and observation appends of the rows that arrive together run as
one batched `append` each (bucketed shapes: a fixed, small set of compiled
programs, `trace_counts`).

The cache is slot-per-row (`sampling/slots.py`) with more rows in flight
(`slots`) than the decode batch (`decode_batch`): rows waiting for a tool
keep their context in their cache row but take no decode slot, which goes
to a row that is ready. A paged cache would pack contexts tighter, but it
needs a page table and gathering pages on every attention step; with one
contiguous row per trajectory the decoder's cached path stays as it is
(plus a per-row write index), and each program gathers its rows' live
prefix once per chunk.

Exactness: a row's key is fold_in(key(row_seed(seed, trajectory, turn)),
0) and each token's folds in its position, as in `loop.RolloutLoop`: the
tokens depend on the row alone, never on its slot or neighbours, and the
turn logic (false stops, answers, caps, observations) is the loop's own.
"""

import collections
import concurrent.futures
import dataclasses
import time

import jax
import numpy as np

from swirl_jax.rollout import loop
from swirl_jax.rollout.records import Turn
from swirl_jax.sampling import decoding, slots
from swirl_jax.shapes import bucket


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  slots: int = 32  # Cache rows: trajectories in flight.
  decode_batch: int = 16  # Ready rows decoded together.
  chunk_steps: int = 8  # Decode steps between host checks.
  tool_workers: int = 16  # Threads running single tool calls.

  @classmethod
  def from_config(cls, c) -> "EngineConfig":
    return cls(**{k: c[k] for k in dataclasses.asdict(cls()) if k in c})


@dataclasses.dataclass
class _Live(loop._Row):  # pylint: disable=protected-access
  slot: int = -1
  phase: str = "pending"  # prefill | decode | tool | append | done
  turn_no: int = 0
  seg: int = 0  # Continuations of this turn after false stops.
  seg_tokens: list = dataclasses.field(default_factory=list)
  seg_lps: list = dataclasses.field(default_factory=list)
  budget: int = 0  # New tokens left in this turn.
  length: int = 0  # Tokens of context in the cache.
  start_s: float = 0.0
  call: tuple | None = None  # (tool, argument, final) being run.


class RolloutEngine(loop.RolloutLoop):
  """`RolloutLoop`'s rollouts (same records), trajectory by trajectory.

  Needs a `Sampler` (its params, sizes, stop tables and token texts).
  `metrics` describe the last rollout (see `loop.rollout_metrics`; also
  `idle_s`, time with nothing to decode while tools ran).
  """

  def __init__(self, sampler, tokenizer, tools, config: loop.RolloutConfig,
               engine: EngineConfig = EngineConfig()):
    super().__init__(sampler, tokenizer, tools, config)
    if not 0 < engine.decode_batch <= engine.slots:
      raise ValueError(f"decode_batch {engine.decode_batch} must be in "
                       f"1..slots ({engine.slots})")
    self.engine = engine
    self.programs = slots.programs(sampler.cfg)
    self._limit = sampler.config.max_cache_len
    # Decode chunks write up to chunk_steps past a row's last token.
    self._S = self._limit + engine.chunk_steps

  @property
  def trace_counts(self) -> collections.Counter:
    return self.programs.trace_counts

  # -- the engine loop --

  def run_pairs(self, pairs):
    rows = [_Live(traj=r.traj) for r in self._rows(pairs)]
    if not rows:
      return []
    for r in rows:
      self._check_prompt(r)
    self._stats, t0 = collections.Counter(), time.perf_counter()
    self.shapes = collections.Counter()  # (program, rows, read_len) runs.
    sc = self.sampler.config
    M = min(self.engine.slots, bucket(len(rows), sc.batch_buckets))
    self._M = M
    self._dev = slots.init(self.sampler.cfg, M, self._S, sc.cache_dtype)
    free, pending, live = list(range(M)), collections.deque(rows), []
    futures: dict[concurrent.futures.Future, tuple] = {}
    with concurrent.futures.ThreadPoolExecutor(
        self.engine.tool_workers) as pool:
      while pending or live:
        self._collect(futures, block=False)
        while free and pending:
          live.append(self._admit(pending.popleft(), free.pop(0)))
        t1 = time.perf_counter()
        self._append([r for r in live if r.phase == "prefill"], fresh=True)
        self._append([r for r in live if r.phase == "append"], fresh=False)
        t2 = time.perf_counter()
        self._stats["append_s"] += t2 - t1
        ready = [r for r in live if r.phase == "decode"]
        if ready:
          # Decode goes on while calls run: the chunks beside them.
          self._stats["decode_chunks_beside_tools"] += bool(futures)
          for row in self._decode(ready[:self.engine.decode_batch]):
            futures[pool.submit(self._call, row.call)] = row
          self._stats["decode_s"] += time.perf_counter() - t2
        elif futures:
          self._collect(futures, block=True)
        for r in [r for r in live if r.phase == "done"]:
          live.remove(r)
          free.append(r.slot)
    self._dev = None
    self.metrics = loop.rollout_metrics(rows, self._stats, t0)
    return [r.traj for r in rows]

  def _check_prompt(self, row: _Live) -> None:
    n = len(row.traj.prompt_ids)
    if not 0 < n < self._limit:
      raise ValueError(f"prompt of {row.traj.task_id} has {n} tokens; the "
                       f"KV cache holds {self._limit} "
                       "(SamplerConfig.max_cache_len)")

  def _admit(self, row: _Live, slot: int) -> _Live:
    row.slot, row.phase, row.start_s = slot, "prefill", time.perf_counter()
    row.obs = list(row.traj.prompt_ids)
    self._start_turn(row, 0)
    return row

  def _start_turn(self, row: _Live, turn_no: int) -> None:
    row.turn, row.turn_no, row.seg = Turn(), turn_no, 0
    row.budget = self._budget(row, turn_no)

  # -- tools --

  def _call(self, call) -> tuple[str, float]:
    t0 = time.perf_counter()
    text = self.toolset.run([call[:2]])[0]
    return text, time.perf_counter() - t0

  def _collect(self, futures, block: bool) -> None:
    """Takes the observations of finished calls (waits for one if
    `block`)."""
    if not futures:
      return
    t0 = time.perf_counter()
    done, _ = concurrent.futures.wait(
        futures, timeout=None if block else 0,
        return_when=concurrent.futures.FIRST_COMPLETED)
    if block:
      self._stats["idle_s"] += time.perf_counter() - t0
    for f in done:
      row = futures.pop(f)
      text, took = f.result()
      self._stats["tool_wait_s"] += took
      self._stats["tool_calls"] += 1
      self._take_result(row, row.call, text)
      self._after_turn(row)

  def _after_turn(self, row: _Live) -> None:
    """A turn is over (its observation, if any, is set): end the row,
    append the observation, or go on to the next turn."""
    self._turn_cap(row, row.turn_no)
    self._check_room(row, self._limit - row.length)
    if row.done:
      row.phase, row.end_s = "done", time.perf_counter()
    elif row.obs:
      row.phase = "append"
    else:
      row.phase = "decode"
      self._start_turn(row, row.turn_no + 1)

  # -- device work --

  def _append(self, rows: list[_Live], fresh: bool) -> None:
    """Prefills (fresh) or appends each row's `obs`, batched."""
    size = self.engine.decode_batch
    for lo in range(0, len(rows), size):
      group = rows[lo:lo + size]
      sc = self.sampler.config
      T = bucket(max(len(r.obs) for r in group), sc.length_buckets)
      start = [0 if fresh else r.length for r in group]
      if max(start) + T > self._S:  # Rare: near the end of the cache.
        if len(group) > 1:
          for r in group:
            self._append([r], fresh)
          continue
        T = self._S - start[0]
      read_len = min(bucket(max(start) + T, sc.cache_buckets), self._S)
      A = bucket(len(group), sc.batch_buckets)
      self.shapes["append", A, T, read_len] += 1
      tokens = np.zeros((A, T), np.int32)
      mask = np.zeros((A, T), bool)
      rows_A = np.full((A,), self._M, np.int32)
      for i, r in enumerate(group):
        tokens[i, :len(r.obs)], mask[i, :len(r.obs)] = r.obs, True
        rows_A[i] = r.slot
      self._dev = self.programs.append(
          self.sampler.params, *self._dev, rows_A,
          np.arange(A) < len(group) if fresh else np.zeros(A, bool),
          tokens, mask, read_len)
      for r in group:
        r.length = len(r.obs) if fresh else r.length + len(r.obs)
        r.obs, r.phase = None, "decode"
        if not fresh:
          self._start_turn(r, r.turn_no + 1)

  def _decode(self, rows: list[_Live]) -> list[_Live]:
    """One chunk of decode steps; returns the rows that now call a tool."""
    c, sc, steps = self.config, self.sampler.config, self.engine.chunk_steps
    todo = []
    for r in rows:
      if self._limit - r.length <= 0:  # No slot left for a token.
        self._end_segment(r, "cache_full")
      else:
        todo.append(r)
    if todo:
      self._decode_rows(todo, c, sc, steps)
    calls = [r for r in rows if r.phase == "tool"]
    return calls

  def _decode_rows(self, rows, c, sc, steps) -> None:
    R = bucket(len(rows), sc.batch_buckets)
    pad = lambda xs, fill, dt: np.asarray(
        list(xs) + [fill] * (R - len(rows)), dt)
    rows_R = pad([r.slot for r in rows], self._M, np.int32)
    seeds = pad([loop.row_seed(c.seed, r.traj.id, r.turn_no + 1000 * r.seg)
                 for r in rows], 0, np.uint32)
    sampling = (np.full(R, c.temperature, np.float32),
                np.full(R, c.top_k, np.int32), np.full(R, c.top_p, np.float32))
    max_new = pad([min(r.budget, self._limit - r.length) for r in rows], 0,
                  np.int32)
    read_len = min(bucket(max(r.length for r in rows) + steps,
                          sc.cache_buckets), self._S)
    self.shapes["decode", R, read_len] += 1
    # pylint: disable-next=protected-access
    eos, table = self.sampler._eos, self.sampler._stop_table(self.stops)
    *self._dev, tokens, lps, num, reason = self.programs.decode(
        self.sampler.params, *self._dev, rows_R, seeds, sampling, max_new,
        eos, table, read_len, steps)
    tokens, lps, num, reason = jax.device_get((tokens, lps, num, reason))
    self._dev = tuple(self._dev)
    self._stats["slot_steps"] += self.engine.decode_batch * int(num.max())
    self._stats["decode_chunks"] += 1
    for j, r in enumerate(rows):
      n = int(num[j])
      r.seg_tokens += tokens[j, :n].tolist()
      r.seg_lps += lps[j, :n].tolist()
      r.budget, r.length = r.budget - n, r.length + n
      why = decoding.REASONS[reason[j]]
      if why == "length" and r.budget > 0:
        if r.length < self._limit:
          continue  # The chunk ended, the turn did not.
        why = "cache_full"
      self._end_segment(r, why)

  def _end_segment(self, row: _Live, why: str) -> None:
    """A sampled stretch ended (as one `generate` of the loop would)."""
    # pylint: disable-next=protected-access
    texts, _ = self.sampler._texts([row.seg_tokens], [why], self.stops)
    t = row.turn
    t.action_ids += row.seg_tokens
    t.action_logprobs += [float(x) for x in row.seg_lps]
    t.text += texts[0]
    t.stop_reason = why
    row.seg_tokens, row.seg_lps = [], []
    if self._false_stop(t, row.budget):
      row.seg += 1  # Fresh randomness, same turn.
      self._stats["false_stops"] += 1
      return
    row.call = self._record_turn(row)
    if row.call is not None and not row.done:
      row.phase = "tool"
    else:
      self._after_turn(row)
