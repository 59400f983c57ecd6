"""The rollout engine: continuous batching, tools run while others decode.

Each trajectory advances on its own. A row that stops at a tool call hands
the call to a thread pool (the sandbox runs its snippets in processes) and
the other rows keep decoding; when the observation is ready it is appended
to that row's cache and the row decodes again. A finished row frees its
cache row at once and the next pending (task, sample) is prefilled into it.
Decode runs in jitted chunks of `chunk_steps` steps between host checks;
prefills and observation appends of the rows that arrive together run as
one batched `append` each (bucketed shapes: a fixed, small set of compiled
programs).

The device is the sampler's (`device.Maker`): on a `Sampler`, a page pool
(`sampling/pages.py`), with more rows in flight (`slots`) than the decode
batch (`decode_batch`): rows waiting for a tool keep their context in
their pages but take no decode slot, which goes to a row that is ready.
A row holds pages for the tokens it has, not for the longest context it
could reach, so a pool (`pages`) far smaller than `slots` full-length
rows holds them all while most are short. A row is admitted when an entry
and the pages for its prompt and a decode chunk are free (and no
preempted row waits); the samples of a task admitted together prefill its
prompt once and share its pages (`SamplerConfig.share_prompts`: only the
first takes the prompt's full pages). When the pool runs out mid-run, the rows that need
pages are served oldest first, and each takes them from the youngest rows,
those in a tool call last (preemption by recompute, as vLLM's): a
preempted row's pages are freed, its tokens kept, and its next program
recomputes its cache from them (`metrics['preempted']`,
`metrics['recomputed_tokens']`); a row older than every other one is never
preempted, so the oldest always advances. A rollout that raises (a tool,
the device) gives every page back first; one in which nothing can advance
raises rather than wait forever.

Exactness: a row's draw depends on the row alone (`turns.draw`: the seed
of its trajectory, turn and stretch; each token's key folds in its
position), never on its pages, its neighbours or a preemption; the turn
logic is `turns.py`'s, which the tests' lock-step oracle composes too.

Policy versions: given a `Policy` (params and their version), or a feed
of them, the engine samples with it and stamps each trajectory with the
versions that sampled it; a feed's newer version goes into the device
between decode chunks (`Device.set_params`). Which chunk that is depends
on timing, so a caller that needs reproducible tokens changes versions
only between rollouts (simpletir/pipeline.py does).
"""

import collections
import concurrent.futures
import dataclasses
import time
from typing import Any, Callable, NamedTuple

from swirl_jax import config_lib
from swirl_jax.rollout import turns


@dataclasses.dataclass(frozen=True)
class EngineConfig(config_lib.FromConfig):
  # Trajectories in flight (per data group): each holds a page table and
  # its logits, and pages for the tokens it has.
  slots: int = 32
  # Pages of the KV-cache pool (per data group; `sampler.page_size` tokens
  # each); 0: enough for `slots` rows at the cache's limit, so no row is
  # ever preempted (the fit job says how many rows a pool holds).
  pages: int = 0
  decode_batch: int = 16  # Ready rows decoded together (per data group).
  chunk_steps: int = 8  # Decode steps between host checks.
  tool_workers: int = 16  # Threads running single tool calls.
  append_tokens: int = 64  # Prompt/observation tokens per append call.
  # Compile every program a rollout can call when the cache is first
  # allocated, so none compiles mid-rollout (`Device.precompile`).
  precompile: bool = False
  # Check the engine's bookkeeping after every step (`_check`): each pair
  # pending, live or done, preempted rows live, every page accounted for.
  # Costs a pass over the rows a step; tests turn it on.
  check_invariants: bool = False


class Policy(NamedTuple):
  """Params to sample with (laid out as `Sampler.params`) and their
  version (e.g. the trainer's data position when they were taken)."""
  version: int
  params: Any


PolicyFeed = Policy | Callable[[], Policy]


class _State:
  """One rollout's rows: pending, live (admitted, in index order), done;
  `dropped` counts the pending ones `stop_admitting` dropped."""

  def __init__(self, rows: list[turns.Row]):
    self.rows = rows
    self.pending = collections.deque(rows)
    self.live: list[turns.Row] = []
    self.done: list[turns.Row] = []
    self.started: list[turns.Row] = []
    self.dropped = 0
    self.futures: dict[concurrent.futures.Future, turns.Row] = {}


class RolloutEngine(turns.Schedule):
  """Trajectories of (task, sample) pairs, with a sampler, a tokenizer
  and tools.

  `sampler.device(decode_batch, chunk_steps, append_tokens)` gives the
  device: a `Sampler`'s page pool (one per data group of its mesh:
  `slots`, `pages` and `decode_batch` are then each group's) or a
  scripted sampler's script. `metrics` describe the last rollout (see
  `turns.rollout_metrics`; also `idle_s`, time with nothing to decode
  while tools ran, and `preempted` / `recomputed_tokens`).
  """

  def __init__(self, sampler, tokenizer, tools, config: turns.RolloutConfig,
               engine: EngineConfig = EngineConfig()):
    if not 0 < engine.decode_batch <= engine.slots:
      raise ValueError(f"decode_batch {engine.decode_batch} must be in "
                       f"1..slots ({engine.slots})")
    super().__init__(tokenizer, tools, config)
    self.engine = engine
    self.device = sampler.device(engine.decode_batch, engine.chunk_steps,
                                 engine.append_tokens)
    self._version = None  # Of the params in the device (with a policy).

  @property
  def shapes(self) -> collections.Counter:
    """Program calls of the last rollout by shape (`Device.shapes`)."""
    return self.device.shapes

  def run_pairs(self, pairs, stop_admitting=None,
                policy: PolicyFeed | None = None):
    """One trajectory per (task, sample index), in the order of `pairs`.

    `stop_admitting(trajectory) -> bool`, called as each trajectory ends:
    once it returns True no further pair is started (those in flight
    finish), and only the started pairs' trajectories are returned.

    `policy`: what to sample with, a `Policy` or a callable giving the one
    to sample with now, asked before each device step: one of another
    version goes into the device between decode chunks
    (`Device.set_params`; the cache keeps what older params wrote). With
    it, each trajectory is stamped with the versions that sampled it
    (`turns.stamp`). Without it, the sampler's params at the start.
    """
    rows = turns.new_rows(pairs, self.tokenizer, self.config.fmt)
    if not rows:
      return []
    for r in rows:
      self._check_prompt(r)
    self._stats, t0 = collections.Counter(), time.perf_counter()
    self.device.open(len(rows), self.engine.slots, self.engine.pages)
    self._version = None
    self._preempted: set[int] = set()  # Rows waiting to be recomputed.
    s = _State(rows)
    try:
      if self.engine.precompile:
        self._take(policy)
        self.device.precompile(self.stops)
      with concurrent.futures.ThreadPoolExecutor(
          self.engine.tool_workers) as pool:
        try:
          while s.pending or s.live:
            self._step(s, policy, stop_admitting, pool)
        finally:
          # On an error, calls not yet started never start; those running
          # end within their tool's own limit.
          for f in s.futures:
            f.cancel()
    finally:
      # Every page back, also when a tool or the device raised: the pool
      # outlives the rollout (the next one opens it afresh).
      for r in s.live:
        self.device.release(r)
      self._preempted.clear()
      self.device.close()
    self._stats["not_started"] = len(rows) - len(s.started)
    self._stats.update(getattr(self.device, "counts", {}))
    self.metrics = turns.rollout_metrics(s.started, self._stats, t0)
    return [r.traj for r in sorted(s.started, key=lambda r: r.index)]

  def _step(self, s: "_State", policy, stop_admitting, pool) -> None:
    """One pass of the loop: finished calls taken, finished rows retired,
    pending rows admitted, one device step. Raises when nothing could
    advance: with nothing live no call or page is ever coming back, so a
    loop that went on would spin forever."""
    moved = self._collect(s.futures, block=False)
    moved |= self._retire(s, stop_admitting)
    while s.pending and not self._preempted and self.device.reserve(
        [s.pending[0]], [len(s.pending[0].obs) + self.engine.chunk_steps]):
      s.started.append(s.pending.popleft())
      s.live.append(self._admit(s.started[-1]))
      moved = True
    self._take(policy)
    moved |= self._device_step(s.live, s.futures, pool)
    moved |= self._retire(s, stop_admitting)
    if self.engine.check_invariants:
      self._check(s)
    if not moved:
      raise RuntimeError(
          f"the rollout is stuck: {len(s.pending)} rows pending, "
          f"{len(s.live)} live (phases "
          f"{sorted(collections.Counter(r.phase for r in s.live).items())}"
          f", {len(self._preempted)} preempted), none could advance: the "
          "page pool holds less than its oldest row needs")

  def _retire(self, s: "_State", stop_admitting) -> bool:
    """Frees the rows that are done; True if there were any."""
    done = [r for r in s.live if r.phase == "done"]
    for r in done:
      s.live.remove(r)
      s.done.append(r)
      # A row preempted in its tool call may end on the call's result,
      # never to be recomputed: left in the set it would bar admission
      # for good.
      self._preempted.discard(r.index)
      self.device.release(r)
      turns.stamp(r)
      if stop_admitting is not None and stop_admitting(r.traj):
        s.dropped += len(s.pending)
        s.pending.clear()
    return bool(done)

  def _check(self, s: "_State") -> None:
    """The bookkeeping's invariants (`EngineConfig.check_invariants`):
    raises RuntimeError (an `assert` would vanish under `python -O`)."""
    where = collections.Counter(
        id(r) for part in (s.pending, s.live, s.done) for r in part)
    if (len(where) != sum(where.values())
        or len(where) + s.dropped != len(s.rows)):
      raise RuntimeError(
          f"pairs lost or doubled: {len(s.rows)} rows, {len(s.pending)} "
          f"pending, {len(s.live)} live, {len(s.done)} done, {s.dropped} "
          "dropped")
    live = {r.index for r in s.live}
    if not self._preempted <= live:
      raise RuntimeError(f"preempted rows {sorted(self._preempted - live)} "
                         "are not live")
    if any(r.phase == "done" for r in s.live) or any(
        r.seat is not None for r in s.done):
      raise RuntimeError("a finished row is still live or seated")
    size = getattr(self.device, "size", None)
    if size is None:  # A device with no pool (a script's).
      return
    (entries, pages), (free_e, free_p) = size(), self.device.free()
    seats = [r.seat for r in s.live if r.seat is not None]
    held_e = sum(t.entry >= 0 for t in seats)
    # Rows with one prompt share its pages: each page counts once.
    held_p = len({(t.group, p) for t in seats for p in t.pages})
    if free_e + held_e != entries or free_p + held_p != pages:
      raise RuntimeError(
          f"pages lost: {free_p} free + {held_p} held by live rows != "
          f"{pages} (entries: {free_e} + {held_e} != {entries})")

  def _take(self, policy: PolicyFeed | None) -> None:
    """The feed's policy into the device, when its version is new."""
    if policy is None:
      return
    p = policy() if callable(policy) else policy
    if p.version != self._version:
      self.device.set_params(p.params)
      self._stats["policy_swaps"] += self._version is not None
      self._version = p.version

  def _check_prompt(self, row: turns.Row) -> None:
    n = len(row.traj.prompt_ids)
    if not 0 < n < self.device.limit:
      raise ValueError(f"prompt of {row.traj.task_id} has {n} tokens; the "
                       f"KV cache holds {self.device.limit} "
                       "(SamplerConfig.max_cache_len)")

  def _admit(self, row: turns.Row) -> turns.Row:
    row.phase, row.start_s = "prefill", time.perf_counter()
    self._start_turn(row, 0)
    return row

  def _start_turn(self, row: turns.Row, turn_no: int) -> None:
    turns.start_turn(row, turn_no, self.turn_budget(row.traj, turn_no),
                     self.config)

  def _device_step(self, live, futures, pool) -> bool:
    """Prefills and appends the arrived rows, then one decode chunk of
    the ready ones (or waits for a tool when none is ready); False if
    none of that could happen."""
    t1 = time.perf_counter()
    moved = False
    for phase, fresh in (("prefill", True), ("append", False)):
      group = self._fit([r for r in live if r.phase == phase],
                        lambda r: len(r.obs), live)
      if group:
        moved = True
        self.device.append(group, fresh)
        for r in group:
          turns.appended(r, fresh)
          if not fresh:
            self._start_turn(r, r.turn_no + 1)
    t2 = time.perf_counter()
    self._stats["append_s"] += t2 - t1
    ready = self._fit(
        self.device.select([r for r in live if r.phase == "decode"]),
        self._chunk_tokens, live)
    if ready:
      # Decode goes on while calls run: the chunks beside them.
      self._stats["decode_chunks_beside_tools"] += bool(futures)
      for row in self._decode(ready):
        futures[pool.submit(self._call, row.call)] = row
      self._stats["decode_s"] += time.perf_counter() - t2
    elif futures:
      self._collect(futures, block=True)
    else:
      return moved
    return True

  # -- pages --

  def _chunk_tokens(self, row: turns.Row) -> int:
    return max(0, min(self.engine.chunk_steps, row.budget,
                      self.device.limit - row.length))

  def _fit(self, rows, more, live) -> list[turns.Row]:
    """The rows (of one program call) the pool holds with `more(row)` more
    tokens each, served oldest first; a row short of pages preempts rows
    younger than itself (their caches to be recomputed from their
    tokens), and waits when none is left.

    Victims, in order: rows not in a tool call, youngest first, then rows
    in one, youngest first. A row in a tool call comes back only when its
    call returns, and while any preempted row waits no pending row is
    admitted: preempting it would hold admission up for the call's
    latency, where a ready row is recomputed by its next chunk. `live`
    is in admission order (by index), so the victims are listed in one
    pass, and each is passed over at most once: one that is not younger
    than the row being served is not younger than any row served after
    it either. O(live + rows) a call, besides the reserves."""
    victims = [v for v in reversed(live) if v.phase != "tool"] + [
        v for v in reversed(live) if v.phase == "tool"]
    victims = [v for v in victims if v.seat is not None
               and v.index not in self._preempted]
    at, kept = 0, set()
    for r in sorted(rows, key=lambda r: r.index):
      while not self.device.reserve([r], [more(r)]):
        while at < len(victims) and (victims[at].index <= r.index
                                     or victims[at].index in
                                     self._preempted):
          at += 1
        if at == len(victims):
          break
        self._preempt(victims[at])
        at += 1
      else:
        kept.add(id(r))
        self._preempted.discard(r.index)
    return [r for r in rows if id(r) in kept]

  def _preempt(self, row: turns.Row) -> None:
    self.device.preempt(row)
    self._preempted.add(row.index)
    self._stats["preempted"] += 1
    self._stats["recomputed_tokens"] += row.length

  # -- tools --

  def _call(self, call) -> tuple[str, float]:
    t0 = time.perf_counter()
    text = self.toolset.run([call[:2]])[0]
    return text, time.perf_counter() - t0

  def _collect(self, futures, block: bool) -> bool:
    """Takes the observations of finished calls (waits for one if
    `block`); True if any had finished. A call that raised raises here."""
    if not futures:
      return False
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
      turns.take_result(row, text, self.observe)
      self._end_turn(row)
    return bool(done)

  def _end_turn(self, row: turns.Row) -> None:
    turns.end_turn(row, self.config, self.device.limit - row.length)
    if row.phase == "decode":  # No observation: the next turn at once.
      self._start_turn(row, row.turn_no + 1)

  # -- decoding --

  def _decode(self, rows: list[turns.Row]) -> list[turns.Row]:
    """One chunk of decode steps; returns the rows that now call a tool."""
    todo = []
    for r in rows:
      if self.device.limit - r.length <= 0:  # No room left for a token.
        self._end_stretch(r, "cache_full")
      else:
        todo.append(r)
    if todo:
      out, slot_steps = self.device.decode(
          todo, [turns.draw(r, self.config) for r in todo], self.stops)
      self._stats["slot_steps"] += slot_steps
      self._stats["decode_chunks"] += 1
      for r, (tokens, lps, why) in zip(todo, out):
        if self._version is not None:
          turns.sampled_with(r, self._version)
        why = turns.take_decoded(r, tokens, lps, why, self.device.limit)
        if why is not None:
          self._end_stretch(r, why)
    return [r for r in rows if r.phase == "tool"]

  def _end_stretch(self, row: turns.Row, why: str) -> None:
    text = self.device.text(row, row.seg_tokens, why, self.stops)
    if turns.end_stretch(row, text, why, self.config):
      self._stats["false_stops"] += 1
      return
    if turns.record_turn(row, self.parse, self.config,
                         self.observe) is not None and not row.done:
      row.phase = "tool"
    else:
      self._end_turn(row)

