"""The multi-turn agent loop over a batch of trajectories.

Each turn: sample every active row until a stop string (a closing tool tag
or code fence), an EOS or the token budget → parse → run every tool call of
the batch in parallel → append each observation with the sampler's `extend`
→ continue. Finished rows leave the batch. Every turn keeps the model's
token ids and behaviour log-probs and the observation's token ids, so
trainers never re-tokenise text.
"""

import concurrent.futures
import dataclasses
import zlib
from typing import Sequence

import numpy as np

from swirl_jax.rollout import prompts
from swirl_jax.rollout.records import Trajectory, Turn
from swirl_jax.tasks.records import Task
from swirl_jax.tools import parsing
from swirl_jax.tools.registry import BatchTool

@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  fmt: str = "swirl"  # 'swirl' | 'simpletir'
  max_turns: int = 5  # SWiRL: 5 for QA, 10 for maths; SimpleTIR: 5 / 10.
  max_new_tokens: int = 256  # Per turn.
  max_response_tokens: int = 4096  # Whole trajectory; beyond: 'overlong'.
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0

  @classmethod
  def from_config(cls, c) -> "RolloutConfig":
    return cls(**{k: c[k] for k in dataclasses.asdict(cls()) if k in c})


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


def _row_seed(seed: int, traj_id: str, turn: int) -> int:
  return zlib.crc32(f"{seed}/{traj_id}/{turn}".encode()) & 0x7FFFFFFF


@dataclasses.dataclass
class _Row:
  traj: Trajectory
  turn: Turn | None = None  # The turn being sampled.
  done: bool = False
  response_tokens: int = 0


class RolloutLoop:
  """Turns tasks into trajectories with a sampler, a tokenizer and tools."""

  def __init__(self, sampler, tokenizer, tools: dict[str, BatchTool],
               config: RolloutConfig):
    parsing.stop_strings(config.fmt)  # Validates the format.
    self.sampler, self.tokenizer = sampler, tokenizer
    self.toolset, self.config = ToolSet(tools), config
    self.stops = tuple(parsing.stop_strings(config.fmt))
    self.frame = prompts.observation_frame(tokenizer, config.fmt)
    self.eos = set(getattr(tokenizer, "eos_ids", ()) or ())

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

  # -- the loop --

  def run(self, tasks: Sequence[Task], samples_per_task: int = 1,
          sample_offset: int = 0) -> list[Trajectory]:
    """Rollouts of every (task, sample); sample indices start at offset."""
    return self.run_pairs([(task, sample_offset + k) for task in tasks
                           for k in range(samples_per_task)])

  def run_pairs(self, pairs: Sequence[tuple[Task, int]]) -> list[Trajectory]:
    """One trajectory per (task, sample index), sampled as one batch."""
    c = self.config
    rows, prompt_cache = [], {}
    for task, k in pairs:
      if task.id not in prompt_cache:
        prompt_cache[task.id] = self.prompt_ids(task)
      text, ids = prompt_cache[task.id]
      rows.append(_Row(Trajectory(
          task_id=task.id, sample_index=k, prompt=text, prompt_ids=list(ids),
          source=task.source, meta={"fmt": c.fmt})))
    if not rows:
      return []
    live = list(range(len(rows)))  # State row -> index in `rows`.
    state = None
    for turn_no in range(c.max_turns):
      state = self._sample_turn(rows, live, state, turn_no)
      obs = self._act(rows, live, turn_no)
      self._end_rows_out_of_room(rows, live, obs, state)
      keep = [j for j, r in enumerate(live) if not rows[r].done]
      if not keep:
        break
      if len(keep) < len(live):
        state = self.sampler.select(state, keep)
        live = [live[j] for j in keep]
      state = self.sampler.extend(state, [obs[rows[r].traj.id] for r in live])
    for r in rows:
      if not r.done:
        r.traj.meta["turn_cap"] = True
    return [r.traj for r in rows]

  def _sample_turn(self, rows, live, state, turn_no):
    """Samples one turn for every live row; re-samples false stops."""
    c = self.config
    budget = [max(1, min(c.max_new_tokens,
                         c.max_response_tokens - rows[r].response_tokens))
              for r in live]
    for r in live:
      rows[r].turn = Turn()
    todo = list(range(len(live)))
    while todo:
      seeds = [_row_seed(c.seed, rows[r].traj.id, turn_no) for r in live]
      kw = dict(max_new_tokens=budget, stop_strings=self.stops,
                temperature=c.temperature, top_k=c.top_k, top_p=c.top_p,
                seed=seeds)
      if state is None:
        res = self.sampler.generate([rows[r].traj.prompt_ids for r in live],
                                    **kw)
      else:
        res = self.sampler.generate(state=state, rows=todo, **kw)
      state, again = res.state, []
      for j in todo:
        t = rows[live[j]].turn
        t.action_ids += res.tokens[j]
        t.action_logprobs += [float(x) for x in res.logprobs[j]]
        t.text += res.texts[j]
        t.stop_reason = res.stop_reasons[j]
        budget[j] -= len(res.tokens[j])
        # A stop string that is not a complete action (e.g. a fence that
        # opens a block): keep sampling the same turn.
        if (t.stop_reason == "stop" and budget[j] > 0 and
            not parsing.should_stop(t.text, c.fmt)):
          again.append(j)
      todo = again
      turn_no += 1000  # Fresh randomness for a continued turn.
    return state

  def _end_rows_out_of_room(self, rows, live, obs, state) -> None:
    """Rows whose observation leaves no room to answer in the sampler's
    context end here (meta 'context_full'), instead of failing the batch."""
    room_fn = getattr(self.sampler, "room", None)
    if room_fn is None:
      return
    room = room_fn(state)
    for r in live:
      row = rows[r]
      if not row.done and len(obs.get(row.traj.id) or ()) >= room:
        row.traj.meta["context_full"], row.done = True, True

  def _act(self, rows, live, turn_no) -> dict[str, list[int]]:
    """Parses the turns, runs the calls, returns observation ids by row."""
    c = self.config
    calls, call_rows, obs = [], [], {}
    for r in live:
      row = rows[r]
      t, traj = row.turn, row.traj
      row.response_tokens += len(t.action_ids)
      traj.turns.append(t)
      p = parsing.parse_turn(t.text, c.fmt)
      t.tool, t.argument, t.answer = p.tool, p.argument, p.answer
      t.void = p.is_void
      if p.is_answer:
        traj.final_answer, row.done = p.answer, True
      elif p.is_call:
        calls.append((p.tool, p.argument))
        call_rows.append(r)
      elif p.kind == "invalid":
        obs[traj.id] = self._observe(t, p.error or "invalid action")
      else:  # Void, or cut off: the trajectory ends here.
        traj.meta["void"] = True
        row.done = True
      if row.response_tokens >= c.max_response_tokens and not row.done:
        traj.meta["overlong"], row.done = True, True
    results = self.toolset.run(calls)
    for r, (tool, _), text in zip(call_rows, calls, results):
      row = rows[r]
      if row.done:  # Overlong: the call is recorded but not answered.
        continue
      obs[row.traj.id] = self._observe(row.turn, text)
      final = parsing.extract_boxed(text) if tool == parsing.PYTHON_TOOL \
          else None
      if final is not None and parsing.parse_turn(row.turn.text,
                                                  c.fmt).final:
        row.traj.final_answer, row.done = final, True
    if turn_no == c.max_turns - 1:
      for r in live:
        if not rows[r].done and rows[r].traj.final_answer is None:
          rows[r].traj.meta["turn_cap"], rows[r].done = True, True
    return obs

  def _observe(self, turn: Turn, text: str) -> list[int]:
    turn.observation_ids = self.observation_ids(text, turn.action_ids)
    turn.observation = self.tokenizer.decode(turn.observation_ids)
    return turn.observation_ids


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
