"""The rollout engine under faults: a row preempted in its tool call and
ended by the call's result, a pool that admits nothing, tools and devices
that raise, and random rollouts on pools small enough to preempt. Every
run returns or raises within a bound (a hang fails the test, it does not
hang the suite), gives every page back, and without faults gives the
trajectories of an unpreempted run.

Most of it runs on `PagedScript`, a scripted device with a page pool kept
as `pages.PagedDevice` keeps its own, so the engine's page bookkeeping
runs in milliseconds without a model; the reported hang runs on the tiny
model too."""

import collections
import itertools
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from swirl_jax import config_lib
from swirl_jax.models import loading
from swirl_jax.models.paged import pages_for
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.scripted import ScriptedDevice, ScriptedSampler
from swirl_jax.rollout.scripted import replaying
from swirl_jax.sampling.device import Seat
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.tasks import synthetic
from swirl_jax.tasks.records import Task
from swirl_jax.tools import parsing

from test_pages import SMALL_POOL

LIMIT, FILLER = 256, "word " * 300  # A stretch is cut to its budget.


class Aborted(Exception):
  """Raised by a device told to stop a run that overran its bound."""


class DeviceFault(Exception):
  pass


class ToolFault(Exception):
  pass


class PagedScript(ScriptedDevice):
  """A `ScriptedDevice` with a page pool: entries and pages of `page`
  tokens handed out, preempted and released as `pages.PagedDevice` does
  (tokens kept on the seat), each stretch decoded in chunks of at most
  `chunk_steps` tokens. A program call without the pages its tokens need
  raises, as the real device's does. `fail_at`: the decode call (0 first)
  that raises `DeviceFault`; `abort`: every call raises `Aborted`."""

  def __init__(self, sampler, decode_batch, chunk_steps, page):
    super().__init__(sampler, decode_batch)
    self.steps, self.page = chunk_steps, page
    self.row_pages = pages_for(self.limit, page)
    self.fail_at, self.abort, self.decodes = None, False, 0
    self._stretch = {}  # Row index -> [ids, text, reason, ids taken].

  def open(self, num_rows, max_rows, pages=0):
    self._M = super().open(num_rows, max_rows)
    self._P = pages or self._M * self.row_pages
    self._free_entries = list(range(self._M))
    self._free_pages = list(range(self._P))
    self._stretch, self.decodes = {}, 0
    return self._M

  def size(self):
    return self._M, self._P

  def free(self):
    return len(self._free_entries), len(self._free_pages)

  def _need(self, row, more):
    seat = row.seat
    held = len(seat.tokens) if seat is not None else 0
    seated = seat is not None and seat.entry >= 0
    return (0 if seated else 1, max(0, pages_for(
        min(held + more, self.limit), self.page)
        - (len(seat.pages) if seated else 0)))

  def reserve(self, rows, more):
    if self.abort:
      raise Aborted()
    needs = [self._need(r, m) for r, m in zip(rows, more)]
    entries, pages = self.free()
    if sum(e for e, _ in needs) > entries or sum(p for _, p in needs) > pages:
      return False
    for r, (e, p) in zip(rows, needs):
      if r.seat is None:
        r.seat = Seat()
      if e:
        r.seat.entry = self._free_entries.pop()
      r.seat.pages += [self._free_pages.pop() for _ in range(p)]
    return True

  def _take(self, rows, more):
    if not self.reserve(rows, more):
      raise RuntimeError("reserve them first")

  def preempt(self, row):
    if row.seat.entry >= 0:
      self._free_entries.append(row.seat.entry)
      row.seat.entry = -1
    self._free_pages += row.seat.pages
    row.seat.pages = []

  def release(self, row):
    if row.seat is not None:
      self.preempt(row)
      row.seat = None

  def select(self, ready):
    if self.abort:
      raise Aborted()
    return super().select(ready)

  def append(self, rows, fresh):
    if fresh:
      for r in rows:
        if r.seat is not None:
          self._free_pages += r.seat.pages
          r.seat.pages, r.seat.tokens = [], []
    self._take(rows, [len(r.obs) for r in rows])
    super().append(rows, fresh)
    for r in rows:
      r.seat.tokens += r.obs

  def decode(self, rows, draws, stop_strings):
    del draws
    if self.decodes == self.fail_at:
      raise DeviceFault(f"decode call {self.decodes}")
    self.decodes += 1
    more = [min(self.steps, r.budget, self.limit - len(r.seat.tokens))
            for r in rows]
    self._take(rows, more)
    out = []
    for r, n in zip(rows, more):
      out.append(self._chunk(r, n, stop_strings))
      r.seat.tokens += out[-1][0]
    return out, len(rows) * max(len(o[0]) for o in out)

  def _chunk(self, row, n, stop_strings):
    """The next piece of the row's scripted stretch (begun if new)."""
    st = self._stretch.get(row.index)
    if st is None:
      k = self._turns.get(row.index, 0)
      self._turns[row.index] = k + 1
      st = self._stretch[row.index] = list(self.sampler.turn(
          row.index, k, min(row.budget, self.limit - row.length),
          stop_strings)) + [0]
    ids, text, reason, at = st
    piece = ids[at:at + self.steps]
    if len(piece) > n:
      raise RuntimeError(f"row {row.index}: {len(piece)} tokens, {n} "
                         "reserved")
    st[3] = at + len(piece)
    if st[3] < len(ids):
      return piece, [-0.5] * len(piece), "length"  # The chunk's end.
    del self._stretch[row.index]
    self._texts[row.index] = text
    return piece, [-0.5] * len(piece), reason


class PagedScriptSampler(ScriptedSampler):

  def __init__(self, tokenizer, page=16, limit=LIMIT):
    super().__init__(tokenizer, lambda i, k: FILLER, limit)
    self.page = page

  def device(self, decode_batch, chunk_steps, append_tokens=64):
    del append_tokens
    return PagedScript(self, decode_batch, chunk_steps, self.page)


@pytest.fixture(scope="module")
def tok():
  return loading.load_tokenizer("bundled")


def _tasks(n):
  """Prompts of one length that differ (rows with one prompt would share
  its pages, and the pool's arithmetic here is each row's own)."""
  return [Task(f"t{i}", f"{i}+1?", (str(i + 1),), "synthetic_arith")
          for i in range(n)]


def _row(traj_id: str) -> int:
  return int(traj_id.split("/")[0][1:])  # 't3/0' -> 3.


def _bounded(eng, pairs, timeout_s, stop=None):
  """`eng.run_pairs(pairs)`: its trajectories, or the exception it
  raised. A run still going after `timeout_s` fails the test; `stop()`
  (or the device's abort flag) then makes its next device call raise, so
  a spinning loop ends rather than burn the suite's CPUs."""
  out = {}

  def target():
    try:
      out["trajs"] = eng.run_pairs(pairs)
    except Exception as e:  # pylint: disable=broad-except
      out["error"] = e

  t0 = time.perf_counter()
  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  thread.join(timeout_s)
  if thread.is_alive():
    if stop is not None:
      stop()
    else:
      eng.device.abort = True
    thread.join(10)
    pytest.fail(f"run_pairs did not return within {timeout_s} s")
  out["wall_s"] = time.perf_counter() - t0
  return out


def _call_all(traj_id, k):
  return parsing.ParsedTurn("call", tool="calculator",
                            argument=f"{_row(traj_id)} {k}")


def _gate_on_preemption(eng, phases):
  """A tool whose result waits for the first preemption (so the call is
  in flight when the pool runs out); `phases` gets (row, phase) of each
  preempted row."""
  preempted = threading.Event()
  real = eng.device.preempt

  def preempt(row):
    phases.append((row.index, row.phase))
    real(row)
    preempted.set()

  eng.device.preempt = preempt

  def calculator(args):
    preempted.wait(20)
    return [f"{a} -> 3" for a in args]
  return calculator


def _preempted_in_tool_case(eng, run_s):
  """Row 0 samples a long turn while row 1's call runs; the pool runs
  out, row 1 is preempted in its call and the call's result ends it at
  the turn cap (max_turns=1). Rows 2 and 3 must still be admitted."""
  phases = []
  eng.toolset.tools["calculator"] = _gate_on_preemption(eng, phases)
  got = _bounded(eng, [(t, 0) for t in _tasks(4)], run_s)
  assert "error" not in got, got.get("error")
  trajs = got["trajs"]
  assert len(trajs) == 4 and all(t.meta.get("turn_cap") for t in trajs)
  assert phases[0] == (1, "tool")
  assert eng.device.free() == eng.device.size()
  return got


def _long_first(traj_id, k):
  del k
  return 200 if _row(traj_id) == 0 else 2


def test_row_preempted_in_its_tool_call_and_ended_by_it_frees_admission(
    tok):
  """The reported hang, scripted: a row preempted during its tool call
  and ended by the result stayed in the engine's preempted set (only a
  served row left it), which bars admission: 2 of 4 rows done, nothing
  live, and the old loop spun forever (this test then fails on its
  bound)."""
  rc = turns.RolloutConfig(fmt="swirl", max_turns=1, max_new_tokens=256)
  eng = replaying(engine_lib.RolloutEngine, lambda i, k: _long_first(i, k),
                  _call_all)(
      PagedScriptSampler(tok), tok, {}, rc, engine_lib.EngineConfig(
          slots=2, decode_batch=2, chunk_steps=4, pages=16,
          check_invariants=True))
  _preempted_in_tool_case(eng, 20)


@pytest.fixture(scope="module")
def tiny():
  cfg, params, t = loading.load_policy(config_lib.model_config("tiny", ""))
  return Sampler(params, cfg, t, SamplerConfig(**SMALL_POOL["sampler_kw"])), t


def _tiny_engine(tiny, lengths, action, **kw):
  rc = turns.RolloutConfig(fmt="swirl", max_turns=1, max_new_tokens=512,
                           temperature=0.0)
  return replaying(engine_lib.RolloutEngine, lengths, action)(
      *tiny, {}, rc, engine_lib.EngineConfig(
          slots=2, decode_batch=2, chunk_steps=32, tool_workers=2,
          **dict(SMALL_POOL["engine_kw"], **kw)))  # Invariants checked.


def _abort_on(eng):
  """A `stop` for `_bounded`: the real device's next reserve raises."""
  real = eng.device.reserve
  flag = []

  def reserve(rows, more):
    if flag:
      raise Aborted()
    return real(rows, more)
  eng.device.reserve = reserve
  return lambda: flag.append(1)


def test_tiny_model_row_preempted_in_its_tool_call(tiny):
  """The same on the tiny model and `SMALL_POOL` (as reported): 2 slots,
  row 0 samples 300 tokens past its 120-token prompt while row 1 (10
  pages: its prompt and a chunk) is in its calculator call; the 32-page
  pool runs out past 352 tokens, row 1 is preempted, and the call's
  result ends it."""
  eng = _tiny_engine(tiny, lambda i, k: 300 if _row(i) == 0 else 5,
                     _call_all)
  stop = _abort_on(eng)
  phases = []
  eng.toolset.tools["calculator"] = _gate_on_preemption(eng, phases)
  got = _bounded(eng, [(t, 0) for t in _tasks(4)], 120, stop)
  assert "error" not in got, got.get("error")
  assert len(got["trajs"]) == 4 and phases[0] == (1, "tool")
  assert eng.metrics["preempted"] >= 1
  assert eng.device.free() == eng.device.size() == (2, 32)


@pytest.mark.parametrize("where", ["tool", "device"])
def test_a_raising_tool_or_device_gives_every_page_back(tiny, where):
  """The exception propagates out of `run_pairs` and the pool's free
  count equals its size (the old loop had no try/finally: the live rows'
  pages stayed allocated)."""
  eng = _tiny_engine(tiny, lambda i, k: 40, _call_all)

  def calculator(args):
    raise ToolFault(args)

  eng.toolset.tools["calculator"] = calculator
  if where == "device":
    real, calls = eng.device.decode, []

    def decode(*a):
      calls.append(1)
      if len(calls) == 2:
        raise DeviceFault()
      return real(*a)
    eng.device.decode = decode
  got = _bounded(eng, [(t, 0) for t in _tasks(4)], 120, _abort_on(eng))
  assert isinstance(got.get("error"),
                    ToolFault if where == "tool" else DeviceFault), got
  assert eng.device.free() == eng.device.size() == (2, 32)


def test_a_pool_that_admits_nothing_is_an_error_not_a_spin(tok):
  """Pending rows, nothing live, nothing admissible: no call or page is
  ever coming back, so the engine raises (the old loop spun: it checked
  only while a row was live)."""
  rc = turns.RolloutConfig(fmt="swirl", max_turns=1, max_new_tokens=8)
  eng = engine_lib.RolloutEngine(
      PagedScriptSampler(tok), tok, {}, rc,
      engine_lib.EngineConfig(slots=2, decode_batch=2, check_invariants=True))
  eng.device.reserve = lambda rows, more: False
  got = _bounded(eng, [(t, 0) for t in _tasks(2)], 20)
  assert isinstance(got.get("error"), RuntimeError), got
  assert "stuck" in str(got["error"]) and "2 rows pending" in str(
      got["error"])


def _seated(eng, index, phase, tokens):
  r = turns.Row(traj=None, index=index, phase=phase, length=tokens)
  assert eng.device.reserve([r], [tokens])
  r.seat.tokens = [0] * tokens
  return r


def test_victims_spare_rows_in_a_tool_call(tok):
  """An old row short of pages preempts the youngest row not in a tool
  call before any row in one (the old choice, the youngest whatever its
  phase, took the row in its call)."""
  eng = engine_lib.RolloutEngine(
      PagedScriptSampler(tok), tok, {}, turns.RolloutConfig(fmt="swirl"),
      engine_lib.EngineConfig(slots=3, decode_batch=3, pages=16))
  eng.device.open(3, 3, 16)
  eng._preempted, eng._stats = set(), collections.Counter()  # pylint: disable=protected-access
  live = [_seated(eng, 0, "decode", 128), _seated(eng, 1, "decode", 64),
          _seated(eng, 2, "tool", 64)]  # 8 + 4 + 4 pages: the pool.
  got = eng._fit(live[:1], lambda r: 16, live)  # pylint: disable=protected-access
  assert got == live[:1]
  assert eng._preempted == {1}  # pylint: disable=protected-access
  assert live[2].seat.pages and not live[1].seat.pages
  # With no other candidate the row in its call goes too.
  got = eng._fit(live[:1], lambda r: 16 * 5, live)  # pylint: disable=protected-access
  assert got == live[:1] and eng._preempted == {1, 2}  # pylint: disable=protected-access


class _Passes(list):
  """A list that counts the passes over it."""
  passes = 0

  def __iter__(self):
    self.passes += 1
    return super().__iter__()

  def __reversed__(self):
    self.passes += 1
    return super().__reversed__()


def test_victim_search_is_one_pass(tok):
  """Preempting 31 rows for one takes a fixed number of passes over the
  live rows (the old search listed the candidates again for each victim:
  O(n^2))."""
  n = 41
  eng = engine_lib.RolloutEngine(
      PagedScriptSampler(tok, page=8), tok, {},
      turns.RolloutConfig(fmt="swirl"),
      engine_lib.EngineConfig(slots=n, decode_batch=1, pages=n))
  eng.device.open(n, n, n)  # Full: a page a row.
  eng._preempted, eng._stats = set(), collections.Counter()  # pylint: disable=protected-access
  live = _Passes([_seated(eng, 0, "decode", 8)] + [
      _seated(eng, i, "decode" if i % 2 else "tool", 8)
      for i in range(1, n)])
  live.passes = 0
  assert eng._fit(live[:1], lambda r: LIMIT, live) == live[:1]  # pylint: disable=protected-access
  assert len(eng._preempted) == 31  # pylint: disable=protected-access
  assert live.passes <= 2


def test_invariant_checks_catch_a_leaking_device(tok):
  """With `check_invariants`, a device that keeps a released row's pages
  fails the run at the next step, with pages free + held != the pool."""
  rc = turns.RolloutConfig(fmt="swirl", max_turns=1, max_new_tokens=8)
  eng = replaying(engine_lib.RolloutEngine, lambda i, k: 4,
                  lambda i, k: parsing.ParsedTurn("answer", answer="2"))(
      PagedScriptSampler(tok), tok, {}, rc, engine_lib.EngineConfig(
          slots=2, decode_batch=2, check_invariants=True))

  def leaky(row):
    row.seat = None  # Its pages never come back.
  eng.device.release = leaky
  got = _bounded(eng, [(t, 0) for t in _tasks(3)], 20)
  assert isinstance(got.get("error"), RuntimeError), got
  assert "pages lost" in str(got["error"])


# ------------------------------------------------------------ random runs


@st.composite
def _cases(draw):
  n = draw(st.integers(2, 7))
  slots = draw(st.integers(1, 5))
  page = draw(st.sampled_from([8, 16]))
  row_pages = LIMIT // page
  max_turns = draw(st.integers(1, 4))
  grid = lambda s: [[draw(s) for _ in range(max_turns)] for _ in range(n)]
  return dict(
      n=n, slots=slots, decode_batch=draw(st.integers(1, slots)),
      chunk=draw(st.integers(2, 12)), page=page,
      # One row at the limit (the least a pool holds) to two: 2-5 rows
      # of a 120-token prompt and turns outgrow it, and are preempted.
      pages=draw(st.integers(row_pages, 2 * row_pages)),
      max_turns=max_turns,
      lengths=grid(st.integers(1, 100)),
      calls=grid(st.integers(0, 3)),  # 0: answer; else a call.
      latency=grid(st.sampled_from([0.0, 0.0, 0.002, 0.01, 0.03])),
      long_obs=grid(st.integers(0, 9)),  # 0: it ends the row (room).
      fault=draw(st.sampled_from([None, None, None, "tool", "device"])),
      fault_at=draw(st.integers(0, 8)))


def _case_engine(tok, case, pages, slots, decode_batch, faults):
  """The case's engine: its turns and calls, and (`faults`) its tool's
  and device's failures."""
  c, calls = case, itertools.count()
  rc = turns.RolloutConfig(fmt="swirl", max_turns=c["max_turns"],
                           max_new_tokens=64)

  def action(traj_id, k):
    i = _row(traj_id)
    if c["calls"][i][k]:
      return parsing.ParsedTurn("call", tool="calculator",
                                argument=f"{i} {k}")
    return parsing.ParsedTurn("answer", answer=str(i))

  def calculator(args):
    out = []
    for a in args:
      i, k = map(int, a.split())
      time.sleep(c["latency"][i][k])
      if faults and c["fault"] == "tool" and next(calls) == c["fault_at"]:
        raise ToolFault(a)
      out.append("z " * 200 if not c["long_obs"][i][k] else f"{a} -> {i}")
    return out

  eng = replaying(engine_lib.RolloutEngine,
                  lambda i, k: c["lengths"][_row(i)][k], action)(
      PagedScriptSampler(tok, c["page"]), tok, {"calculator": calculator},
      rc, engine_lib.EngineConfig(
          slots=slots, decode_batch=decode_batch, chunk_steps=c["chunk"],
          pages=pages, tool_workers=4, check_invariants=True))
  if faults and c["fault"] == "device":
    eng.device.fail_at = c["fault_at"]
  return eng


def _trace(traj):
  return ([(t.action_ids, t.observation_ids, t.stop_reason, t.text)
           for t in traj.turns], traj.meta, traj.final_answer,
          traj.token_sequence()[0].tolist())


def _check_case(tok, case) -> tuple[int, bool]:
  """Runs the case on its small pool; returns (its preemptions, whether
  it raised)."""
  pairs = [(t, 0) for t in _tasks(case["n"])]
  eng = _case_engine(tok, case, case["pages"], case["slots"],
                     case["decode_batch"], faults=True)
  got = _bounded(eng, pairs, 30)
  assert eng.device.free() == eng.device.size()
  preempted = int(eng._stats["preempted"])  # pylint: disable=protected-access
  if "error" in got:
    assert isinstance(got["error"], (ToolFault, DeviceFault)), got["error"]
    return preempted, True
  # As an unpreempted run: every row in flight at once, a pool for all.
  ref = _case_engine(tok, case, 0, case["n"], case["n"], faults=False)
  want = _bounded(ref, pairs, 30)
  assert "error" not in want and "preempted" not in ref.metrics
  assert [_trace(t) for t in got["trajs"]] == [
      _trace(t) for t in want["trajs"]]
  return preempted, False


RANDOM_CASES = 150


def test_random_rollouts_with_faults_and_preemption(tok):
  """Random slots, decode batches, chunks, pools (from one row at the
  limit), turn lengths, calls, tool latencies, observations that end a
  row, a tool or the device raising: every run ends within its bound,
  leaks no page, and without a fault gives an unpreempted run's
  trajectories. Derandomized: the same cases every run."""
  stats = []

  @settings(derandomize=True, max_examples=RANDOM_CASES, deadline=None,
            database=None)
  @given(case=_cases())
  def one(case):
    stats.append(_check_case(tok, case))

  one()
  preempted = [p for p, _ in stats]
  print(f"random rollouts: {len(stats)} cases, {sum(e for _, e in stats)} "
        f"raised; preemptions: max {max(preempted)} a run, in "
        f"{sum(p > 0 for p in preempted)} runs")
  assert len(stats) >= RANDOM_CASES and max(preempted) > 0
