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
import functools
import time

from swirl_jax import config_lib
from swirl_jax.rollout import loop
from swirl_jax.rollout.records import Turn
from swirl_jax.rollout import slot_device


@dataclasses.dataclass(frozen=True)
class EngineConfig(config_lib.FromConfig):
  slots: int = 32  # Cache rows: trajectories in flight (per data group).
  decode_batch: int = 16  # Ready rows decoded together (per data group).
  chunk_steps: int = 8  # Decode steps between host checks.
  tool_workers: int = 16  # Threads running single tool calls.
  append_tokens: int = 64  # Prompt/observation tokens per append call.
  # Compile every program a rollout can call when the cache is first
  # allocated, so none compiles mid-rollout (`SlotDevice.precompile`).
  precompile: bool = False


@dataclasses.dataclass
class _Live(loop._Row):  # pylint: disable=protected-access
  index: int = 0  # Position in the rollout's pairs.
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

  The device work goes to the sampler's own rollout device when it has one
  (`sampler.rollout_device(decode_batch, chunk_steps)`: the scripted
  sampler's), else to `slot_device.make`'s: a `SlotDevice` on the
  `Sampler`'s model, or one per data group of its mesh (`slots` and
  `decode_batch` are then each group's). `metrics` describe the last
  rollout (see `loop.rollout_metrics`; also `idle_s`, time with nothing to
  decode while tools ran).
  """

  def __init__(self, sampler, tokenizer, tools, config: loop.RolloutConfig,
               engine: EngineConfig = EngineConfig()):
    super().__init__(sampler, tokenizer, tools, config)
    if not 0 < engine.decode_batch <= engine.slots:
      raise ValueError(f"decode_batch {engine.decode_batch} must be in "
                       f"1..slots ({engine.slots})")
    self.engine = engine
    make = getattr(sampler, "rollout_device", None)
    self.device = (make or functools.partial(
        slot_device.make, sampler, append_tokens=engine.append_tokens))(
            engine.decode_batch, engine.chunk_steps)

  @property
  def trace_counts(self) -> collections.Counter:
    return self.device.trace_counts

  @property
  def shapes(self) -> collections.Counter:
    return self.device.shapes

  # -- the engine loop --

  def run_pairs(self, pairs, stop_admitting=None):
    """One trajectory per (task, sample index), in the order of `pairs`.

    `stop_admitting(trajectory) -> bool`, called as each trajectory ends:
    once it returns True no further pair is started (those in flight
    finish), and only the started pairs' trajectories are returned.
    """
    rows = [_Live(traj=r.traj, index=i)
            for i, r in enumerate(self._rows(pairs))]
    if not rows:
      return []
    for r in rows:
      self._check_prompt(r)
    self._stats, t0 = collections.Counter(), time.perf_counter()
    free = list(range(self.device.open(len(rows), self.engine.slots)))
    if self.engine.precompile:
      self.device.precompile(self.config, self.stops)
    pending, live, started = collections.deque(rows), [], []
    futures: dict[concurrent.futures.Future, tuple] = {}
    with concurrent.futures.ThreadPoolExecutor(
        self.engine.tool_workers) as pool:
      while pending or live:
        self._collect(futures, block=False)
        while free and pending:
          started.append(pending.popleft())
          live.append(self._admit(started[-1], free.pop(0)))
        self._device_step(live, futures, pool)
        for r in [r for r in live if r.phase == "done"]:
          live.remove(r)
          free.append(r.slot)
          if stop_admitting is not None and stop_admitting(r.traj):
            pending.clear()
    self.device.close()
    self._stats["not_started"] = len(rows) - len(started)
    self.metrics = loop.rollout_metrics(started, self._stats, t0)
    return [r.traj for r in sorted(started, key=lambda r: r.index)]

  def _device_step(self, live, futures, pool) -> None:
    """Prefills and appends the arrived rows, then one decode chunk of
    the ready ones (or waits for a tool when none is ready)."""
    t1 = time.perf_counter()
    for phase, fresh in (("prefill", True), ("append", False)):
      group = [r for r in live if r.phase == phase]
      if group:
        self.device.append(group, fresh)
        self._appended(group, fresh)
    t2 = time.perf_counter()
    self._stats["append_s"] += t2 - t1
    ready = [r for r in live if r.phase == "decode"]
    if ready:
      # Decode goes on while calls run: the chunks beside them.
      self._stats["decode_chunks_beside_tools"] += bool(futures)
      for row in self._decode(self.device.select(ready)):
        futures[pool.submit(self._call, row.call)] = row
      self._stats["decode_s"] += time.perf_counter() - t2
    elif futures:
      self._collect(futures, block=True)

  def _check_prompt(self, row: _Live) -> None:
    n = len(row.traj.prompt_ids)
    if not 0 < n < self.device.limit:
      raise ValueError(f"prompt of {row.traj.task_id} has {n} tokens; the "
                       f"KV cache holds {self.device.limit} "
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
    self._check_room(row, self.device.limit - row.length)
    if row.done:
      row.phase, row.end_s = "done", time.perf_counter()
    elif row.obs:
      row.phase = "append"
    else:
      row.phase = "decode"
      self._start_turn(row, row.turn_no + 1)

  # -- decoding --

  def _appended(self, rows: list[_Live], fresh: bool) -> None:
    for r in rows:
      r.length = len(r.obs) if fresh else r.length + len(r.obs)
      r.obs, r.phase = None, "decode"
      if not fresh:
        self._start_turn(r, r.turn_no + 1)

  def _decode(self, rows: list[_Live]) -> list[_Live]:
    """One chunk of decode steps; returns the rows that now call a tool."""
    todo = []
    for r in rows:
      if self.device.limit - r.length <= 0:  # No slot left for a token.
        self._end_segment(r, "cache_full")
      else:
        todo.append(r)
    if todo:
      self._decode_rows(todo)
    return [r for r in rows if r.phase == "tool"]

  def _decode_rows(self, rows: list[_Live]) -> None:
    c = self.config
    seeds = [loop.row_seed(c.seed, r.traj.id, r.turn_no + 1000 * r.seg)
             for r in rows]
    out, slot_steps = self.device.decode(rows, seeds, c, self.stops)
    self._stats["slot_steps"] += slot_steps
    self._stats["decode_chunks"] += 1
    for r, (tokens, lps, why) in zip(rows, out):
      n = len(tokens)
      r.seg_tokens += tokens
      r.seg_lps += lps
      r.budget, r.length = r.budget - n, r.length + n
      if why == "length" and r.budget > 0:
        if r.length < self.device.limit:
          continue  # The chunk ended, the turn did not.
        why = "cache_full"
      self._end_segment(r, why)

  def _end_segment(self, row: _Live, why: str) -> None:
    """A sampled stretch ended (as one `generate` of the loop would)."""
    t = row.turn
    t.action_ids += row.seg_tokens
    t.action_logprobs += [float(x) for x in row.seg_lps]
    t.text += self.device.text(row, row.seg_tokens, why, self.stops)
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
