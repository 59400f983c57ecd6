"""The multi-turn agent loop over a batch of trajectories.

Each turn: sample every active row until a stop string (a closing tool tag
or code fence), an EOS or the token budget → parse → run every tool call of
the batch in parallel → append each observation with the sampler's `extend`
→ continue. Finished rows leave the batch. Every turn keeps the model's
token ids and behaviour log-probs and the observation's token ids, so
trainers never re-tokenise text.
"""

import collections
import concurrent.futures
import dataclasses
import time
import zlib
from typing import Sequence

import numpy as np

from swirl_jax import config_lib
from swirl_jax.rollout import prompts
from swirl_jax.rollout.records import Trajectory, Turn
from swirl_jax.tasks.records import Task
from swirl_jax.tools import parsing
from swirl_jax.tools.registry import BatchTool

@dataclasses.dataclass(frozen=True)
class RolloutConfig(config_lib.FromConfig):
  fmt: str = "swirl"  # 'swirl' | 'simpletir'
  max_turns: int = 5  # SWiRL: 5 for QA, 10 for maths; SimpleTIR: 5 / 10.
  max_new_tokens: int = 256  # Per turn.
  max_response_tokens: int = 4096  # Whole trajectory; beyond: 'overlong'.
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0

  def __post_init__(self):
    if self.fmt not in parsing.FORMATS:
      raise config_lib.ConfigError(f"unknown rollout format {self.fmt!r}; "
                                   f"valid: {', '.join(parsing.FORMATS)}")


class ToolSet:
  """Runs the calls of a batch, every tool's share concurrently."""

  def __init__(self, tools: dict[str, BatchTool]):
    self.tools = dict(tools)

  def run(self, calls: Sequence[tuple[str, str]]) -> list[str]:
    out: list[str | None] = [None] * len(calls)
    by_tool: dict[str, list[int]] = {}
    for i, (tool, _) in enumerate(calls):
      by_tool.setdefault(tool, []).append(i)

    def run_one(tool, idx):
      args = [calls[i][1] for i in idx]
      if tool not in self.tools:
        return [f"{a} -> Error: no tool {tool!r} here (available: "
                f"{', '.join(sorted(self.tools))})" for a in args]
      return self.tools[tool](args)

    with concurrent.futures.ThreadPoolExecutor(max(1, len(by_tool))) as ex:
      futures = {t: ex.submit(run_one, t, idx) for t, idx in by_tool.items()}
      for tool, idx in by_tool.items():
        for i, obs in zip(idx, futures[tool].result()):
          out[i] = obs
    return out


@dataclasses.dataclass
class _Row:
  traj: Trajectory
  turn: Turn | None = None  # The turn being sampled.
  done: bool = False
  response_tokens: int = 0
  obs: list[int] | None = None  # Observation ids to append next.
  end_s: float | None = None  # When the row finished (wall clock).


class RolloutLoop:
  """Turns tasks into trajectories with a sampler, a tokenizer and tools.

  Lock-step: every turn samples all live rows, then runs all their calls,
  then extends all rows. `engine.RolloutEngine` runs the same rows
  trajectory by trajectory; this loop is its reference.
  """

  def __init__(self, sampler, tokenizer, tools: dict[str, BatchTool],
               config: RolloutConfig):
    parsing.stop_strings(config.fmt)  # Validates the format.
    self.sampler, self.tokenizer = sampler, tokenizer
    self.toolset, self.config = ToolSet(tools), config
    self.stops = tuple(parsing.stop_strings(config.fmt))
    self.frame = prompts.observation_frame(tokenizer, config.fmt)
    self.eos = set(getattr(tokenizer, "eos_ids", ()) or ())
    self.metrics: dict[str, float] = {}  # Of the last rollout.

  # -- prompts and observations --

  def prompt_ids(self, task: Task, tools=None) -> tuple[str, list[int]]:
    text = self.tokenizer.apply_chat_template(
        prompts.messages(task, self.config.fmt, tools),
        add_generation_prompt=True)
    return text, self.tokenizer.encode(text)

  def observation_ids(self, obs: str, action_ids: list[int]) -> list[int]:
    before, after = self.frame
    # The model's own EOS already closed its turn: do not close it twice.
    if action_ids and action_ids[-1] in self.eos and before:
      closing = self.tokenizer.encode_continuation(before)
      if closing and closing[0] == action_ids[-1]:
        before = self.tokenizer.decode(closing[1:])
    # Tool output is plain text: it cannot fake a turn boundary.
    enc = self.tokenizer.encode_continuation
    return enc(before) + enc(obs, allow_special=False) + enc(after)

  # -- hooks (a benchmark replays recorded turns through them) --

  def turn_budget(self, traj: Trajectory, turn_no: int) -> int:
    """New tokens allowed in turn `turn_no` of `traj`."""
    del traj, turn_no
    return self.config.max_new_tokens

  def parse(self, traj: Trajectory, text: str) -> parsing.ParsedTurn:
    del traj
    return parsing.parse_turn(text, self.config.fmt)

  # -- the loop --

  def run(self, tasks: Sequence[Task], samples_per_task: int = 1,
          sample_offset: int = 0) -> list[Trajectory]:
    """Rollouts of every (task, sample); sample indices start at offset."""
    return self.run_pairs([(task, sample_offset + k) for task in tasks
                           for k in range(samples_per_task)])

  def _rows(self, pairs: Sequence[tuple[Task, int]]) -> list[_Row]:
    rows, prompt_cache = [], {}
    for task, k in pairs:
      if task.id not in prompt_cache:
        prompt_cache[task.id] = self.prompt_ids(task)
      text, ids = prompt_cache[task.id]
      rows.append(_Row(Trajectory(
          task_id=task.id, sample_index=k, prompt=text, prompt_ids=list(ids),
          source=task.source, meta={"fmt": self.config.fmt})))
    return rows

  def _budget(self, row: _Row, turn_no: int) -> int:
    c = self.config
    return max(1, min(self.turn_budget(row.traj, turn_no),
                      c.max_response_tokens - row.response_tokens))

  def run_pairs(self, pairs: Sequence[tuple[Task, int]]) -> list[Trajectory]:
    """One trajectory per (task, sample index), sampled as one batch."""
    c = self.config
    rows = self._rows(pairs)
    if not rows:
      return []
    self._stats = collections.Counter()
    t0 = time.perf_counter()
    live = list(range(len(rows)))  # State row -> index in `rows`.
    state = None
    for turn_no in range(c.max_turns):
      state = self._sample_turn(rows, live, state, turn_no)
      self._act(rows, live, turn_no)
      self._end_rows_out_of_room(rows, live, state)
      now = time.perf_counter()
      for r in live:
        if rows[r].done:
          rows[r].end_s = now
      keep = [j for j, r in enumerate(live) if not rows[r].done]
      if not keep:
        break
      if len(keep) < len(live):
        state = self.sampler.select(state, keep)
        live = [live[j] for j in keep]
      state = self.sampler.extend(state, [rows[r].obs for r in live])
    for r in rows:
      if not r.done:
        r.traj.meta["turn_cap"] = True
    self.metrics = rollout_metrics(rows, self._stats, t0)
    return [r.traj for r in rows]

  def _sample_turn(self, rows, live, state, turn_no):
    """Samples one turn for every live row; re-samples false stops."""
    c = self.config
    budget = [self._budget(rows[r], turn_no) for r in live]
    for r in live:
      rows[r].turn, rows[r].obs = Turn(), None
    todo = list(range(len(live)))
    while todo:
      seeds = [row_seed(c.seed, rows[r].traj.id, turn_no) for r in live]
      kw = dict(max_new_tokens=budget, stop_strings=self.stops,
                temperature=c.temperature, top_k=c.top_k, top_p=c.top_p,
                seed=seeds)
      if state is None:
        res = self.sampler.generate([rows[r].traj.prompt_ids for r in live],
                                    **kw)
      else:
        res = self.sampler.generate(state=state, rows=todo, **kw)
      state, again = res.state, []
      # Every row of the batch takes each step the longest row takes.
      self._stats["slot_steps"] += len(live) * max(
          len(res.tokens[j]) for j in todo)
      for j in todo:
        t = rows[live[j]].turn
        t.action_ids += res.tokens[j]
        t.action_logprobs += [float(x) for x in res.logprobs[j]]
        t.text += res.texts[j]
        t.stop_reason = res.stop_reasons[j]
        budget[j] -= len(res.tokens[j])
        if self._false_stop(t, budget[j]):
          again.append(j)
      todo = again
      turn_no += 1000  # Fresh randomness for a continued turn.
    return state

  def _false_stop(self, t: Turn, budget_left: int) -> bool:
    """A stop string that is not a complete action (e.g. a fence that
    opens a block): the same turn goes on."""
    return (t.stop_reason == "stop" and budget_left > 0 and
            not parsing.should_stop(t.text, self.config.fmt))

  def _end_rows_out_of_room(self, rows, live, state) -> None:
    """Rows whose observation leaves no room to answer in the sampler's
    context end here (meta 'context_full'), instead of failing the batch."""
    room_fn = getattr(self.sampler, "room", None)
    if room_fn is None:
      return
    room = room_fn(state)
    for r in live:
      self._check_room(rows[r], room)

  @staticmethod
  def _check_room(row: _Row, room: int) -> None:
    if not row.done and len(row.obs or ()) >= room:
      row.traj.meta["context_full"], row.done = True, True

  def _act(self, rows, live, turn_no) -> None:
    """Parses the turns, runs the calls, sets each row's observation."""
    calls, call_rows = [], []
    for r in live:
      call = self._record_turn(rows[r])
      if call is not None:
        calls.append(call)
        call_rows.append(r)
    t0 = time.perf_counter()
    results = self.toolset.run([call[:2] for call in calls])
    self._stats["tool_wait_s"] += time.perf_counter() - t0
    self._stats["tool_calls"] += len(calls)
    for r, call, text in zip(call_rows, calls, results):
      self._take_result(rows[r], call, text)
    for r in live:
      self._turn_cap(rows[r], turn_no)

  def _record_turn(self, row: _Row):
    """Records a sampled turn; returns its call (tool, argument, final) or
    None. Answers, void turns and overlong rows end the row here."""
    c = self.config
    t, traj = row.turn, row.traj
    row.response_tokens += len(t.action_ids)
    traj.turns.append(t)
    p = self.parse(traj, t.text)
    t.tool, t.argument, t.answer = p.tool, p.argument, p.answer
    t.void = p.is_void
    call = None
    if p.is_answer:
      traj.final_answer, row.done = p.answer, True
    elif p.is_call:
      call = (p.tool, p.argument, p.final)
    elif p.kind == "invalid":
      row.obs = self._observe(t, p.error or "invalid action")
    else:  # Void, or cut off: the trajectory ends here.
      traj.meta["void"] = True
      row.done = True
    if row.response_tokens >= c.max_response_tokens and not row.done:
      traj.meta["overlong"], row.done = True, True
    return call

  def _take_result(self, row: _Row, call, text: str) -> None:
    """A call's observation; a final answer in it ends the row."""
    if row.done:  # Overlong: the call is recorded but not answered.
      return
    tool, _, final = call
    row.obs = self._observe(row.turn, text)
    boxed = parsing.extract_boxed(text) if tool == parsing.PYTHON_TOOL \
        else None
    if boxed is not None and final:
      row.traj.final_answer, row.done = boxed, True

  def _turn_cap(self, row: _Row, turn_no: int) -> None:
    if (turn_no == self.config.max_turns - 1 and not row.done
        and row.traj.final_answer is None):
      row.traj.meta["turn_cap"], row.done = True, True

  def _observe(self, turn: Turn, text: str) -> list[int]:
    turn.observation_ids = self.observation_ids(text, turn.action_ids)
    turn.observation = self.tokenizer.decode(turn.observation_ids)
    return turn.observation_ids


def row_seed(seed: int, traj_id: str, turn: int) -> int:
  """A row's sampling seed for one turn (a continued turn adds 1000): with
  the token's position it fixes the draw, whatever else is decoded."""
  return zlib.crc32(f"{seed}/{traj_id}/{turn}".encode()) & 0x7FFFFFFF


def rollout_metrics(rows, stats, t0: float) -> dict[str, float]:
  """Wall time, kept tokens / slot-steps, tool wait and the longest row's
  share of the wall time, for one rollout."""
  wall = max(time.perf_counter() - t0, 1e-9)
  tokens = sum(len(t.action_ids) for r in rows for t in r.traj.turns)
  longest = max(((r.end_s or t0 + wall) - t0) for r in rows)
  out = dict(stats)
  out.update(wall_s=wall, tokens=float(tokens), tokens_per_s=tokens / wall,
             slot_utilisation=tokens / max(stats.get("slot_steps", 0), 1),
             longest_row_share=longest / wall)
  return {k: float(v) for k, v in out.items()}


def response_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
  """Turns per trajectory, void / turn-cap / overlong shares, lengths."""
  n = max(1, len(trajectories))
  lengths = [sum(len(t.action_ids) for t in tr.turns) for tr in trajectories]
  return {
      "turns": float(np.mean([len(t.turns) for t in trajectories] or [0])),
      "void_rate": sum(bool(t.meta.get("void")) for t in trajectories) / n,
      "turn_cap_rate": sum(bool(t.meta.get("turn_cap"))
                           for t in trajectories) / n,
      "overlong_rate": sum(bool(t.meta.get("overlong"))
                           for t in trajectories) / n,
      "response_len": float(np.mean(lengths or [0])),
  }
