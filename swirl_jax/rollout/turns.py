"""Turn logic of a rollout, as plain functions over a row's state.

A row is one trajectory in flight. Each turn it samples a stretch of
tokens until a stop string (a closing tool tag or code fence), an EOS or
its token budget; a stop string that is not a complete action (a fence
that opens a block) is a false stop and the same turn goes on with fresh
randomness. The turn is then parsed: an answer or a void turn ends the
row, a call goes to its tool and the tool's result comes back as the
observation appended before the next turn. Caps end rows too: turns,
response tokens (`overlong`), context room (`context_full`).

Schedulers compose these functions: `engine.RolloutEngine` (rows advance
on their own, tools beside decode) and the lock-step oracle of the tests
(every row of a turn together). Every turn keeps the model's token ids and
behaviour log-probs and the observation's token ids, so trainers never
re-tokenise text.
"""

import abc
import concurrent.futures
import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from swirl_jax import config_lib, distributed
from swirl_jax.rollout import prompts
from swirl_jax.rollout.records import Trajectory, Turn
from swirl_jax.sampling.device import Draw, Seat
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
class Row:
  """One trajectory in flight (a `device.Row`)."""
  traj: Trajectory
  index: int = 0  # Position in the rollout's pairs.
  seat: Seat | None = None  # Its place on the device (the device's).
  phase: str = "pending"  # prefill | decode | tool | append | done
  done: bool = False
  turn: Turn | None = None  # The turn being sampled.
  turn_no: int = 0
  seg: int = 0  # Continuations of this turn after false stops.
  seg_tokens: list = dataclasses.field(default_factory=list)
  seg_lps: list = dataclasses.field(default_factory=list)
  budget: int = 0  # New tokens left in this turn.
  length: int = 0  # Tokens of context it holds.
  response_tokens: int = 0
  obs: list[int] | None = None  # Ids to append next (the prompt first).
  call: tuple | None = None  # (tool, argument, final) being run.
  start_s: float = 0.0
  end_s: float | None = None  # When the row finished (wall clock).
  # Turn index -> the oldest policy version that sampled its tokens.
  versions: dict[int, int] = dataclasses.field(default_factory=dict)


def new_rows(pairs: Sequence[tuple[Task, int]], tokenizer,
             fmt: str) -> list[Row]:
  """A row per (task, sample index), its prompt to prefill."""
  rows, cache = [], {}
  for i, (task, k) in enumerate(pairs):
    if task.id not in cache:
      cache[task.id] = prompts.prompt_ids(tokenizer, task, fmt)
    text, ids = cache[task.id]
    rows.append(Row(Trajectory(
        task_id=task.id, sample_index=k, prompt=text, prompt_ids=list(ids),
        source=task.source, meta={"fmt": fmt}), index=i, obs=list(ids)))
  return rows


def start_turn(row: Row, turn_no: int, want: int, c: RolloutConfig) -> None:
  """Turn `turn_no` begins: up to `want` new tokens, within what the
  trajectory has left."""
  row.turn, row.turn_no, row.seg = Turn(), turn_no, 0
  row.budget = max(1, min(want, c.max_response_tokens - row.response_tokens))


def draw(row: Row, c: RolloutConfig) -> Draw:
  """How the row samples now. The seed comes from the run seed, the
  trajectory, the turn and the stretch of the turn alone: with each
  token's position it fixes the draw, whatever else is decoded."""
  return Draw(distributed.mix_seed(c.seed, row.traj.id, row.turn_no,
                                   row.seg), c.temperature, c.top_k, c.top_p)


def sampled_with(row: Row, version: int) -> None:
  """Policy `version` sampled tokens of the row's current turn (the one
  `record_turn` appends next)."""
  turn = len(row.traj.turns)
  row.versions[turn] = min(row.versions.get(turn, version), version)


def stamp(row: Row) -> None:
  """The trajectory's `meta['policy_version']`: the oldest policy version
  that sampled any of its tokens; where its turns differ (a swap fell
  inside it), `meta['turn_versions']` too: each turn's oldest (None for a
  turn with no sampled token). Rows sampled without versions get none."""
  if not row.versions:
    return
  meta = row.traj.meta
  meta["policy_version"] = min(row.versions.values())
  if len(set(row.versions.values())) > 1:
    meta["turn_versions"] = [row.versions.get(i)
                             for i in range(len(row.traj.turns))]


def appended(row: Row, fresh: bool) -> None:
  """The row's `obs` is in its cache row: it decodes next."""
  row.length = len(row.obs) if fresh else row.length + len(row.obs)
  row.obs, row.phase = None, "decode"


def take_decoded(row: Row, tokens, logprobs, why: str,
                 limit: int) -> str | None:
  """Adds a decoded chunk to the stretch; returns why the stretch ended,
  or None when only the chunk did."""
  n = len(tokens)
  row.seg_tokens += tokens
  row.seg_lps += logprobs
  row.budget, row.length = row.budget - n, row.length + n
  if why == "length" and row.budget > 0:
    if row.length < limit:
      return None
    why = "cache_full"
  return why


def end_stretch(row: Row, text: str, why: str, c: RolloutConfig) -> bool:
  """Adds the sampled stretch to the turn; True on a false stop (a stop
  string that is not a complete action): the turn goes on, with the
  next stretch's seed."""
  t = row.turn
  t.action_ids += row.seg_tokens
  t.action_logprobs += [float(x) for x in row.seg_lps]
  t.text += text
  t.stop_reason = why
  row.seg_tokens, row.seg_lps = [], []
  if (why == "stop" and row.budget > 0
      and not parsing.should_stop(t.text, c.fmt)):
    row.seg += 1
    return True
  return False


Observe = Callable[[Turn, str], list[int]]


def record_turn(row: Row, parse: Callable[[Trajectory, str],
                                          parsing.ParsedTurn],
                c: RolloutConfig, observe: Observe):
  """Records the sampled turn, as `parse(trajectory, text)` reads it
  (the turn is the trajectory's last); returns its call (tool, argument,
  final) or None. Answers, void turns and overlong rows end the row."""
  t, traj = row.turn, row.traj
  row.response_tokens += len(t.action_ids)
  traj.turns.append(t)
  p = parse(traj, t.text)
  t.tool, t.argument, t.answer = p.tool, p.argument, p.answer
  t.void = p.is_void
  row.call = None
  if p.is_answer:
    traj.final_answer, row.done = p.answer, True
  elif p.is_call:
    row.call = (p.tool, p.argument, p.final)
  elif p.kind == "invalid":
    row.obs = observe(t, p.error or "invalid action")
  else:  # Void, or cut off: the trajectory ends here.
    traj.meta["void"], row.done = True, True
  if row.response_tokens >= c.max_response_tokens and not row.done:
    traj.meta["overlong"], row.done = True, True
  return row.call


def take_result(row: Row, text: str, observe: Observe) -> None:
  """The call's result; a final answer in it ends the row."""
  if row.done:  # Overlong: the call is recorded but not answered.
    return
  tool, _, final = row.call
  row.obs = observe(row.turn, text)
  boxed = parsing.extract_boxed(text) if tool == parsing.PYTHON_TOOL \
      else None
  if boxed is not None and final:
    row.traj.final_answer, row.done = boxed, True


def end_turn(row: Row, c: RolloutConfig, room: int) -> None:
  """The turn is over (its observation, if any, set): the last turn ends
  the row ('turn_cap'), as does an observation that leaves no `room` to
  answer ('context_full'); else the row appends its observation."""
  if (row.turn_no == c.max_turns - 1 and not row.done
      and row.traj.final_answer is None):
    row.traj.meta["turn_cap"], row.done = True, True
  if not row.done and len(row.obs or ()) >= room:
    row.traj.meta["context_full"], row.done = True, True
  if row.done:
    row.phase, row.end_s = "done", time.perf_counter()
  else:
    row.phase = "append" if row.obs else "decode"


def observer(tokenizer, fmt: str) -> Observe:
  """`observe(turn, text)`: sets the turn's observation (ids and their
  text) for a tool result `text`; returns the ids."""
  frame = prompts.observation_frame(tokenizer, fmt)

  def observe(turn: Turn, text: str) -> list[int]:
    turn.observation_ids = prompts.observation_ids(tokenizer, frame, text,
                                                   turn.action_ids)
    turn.observation = tokenizer.decode(turn.observation_ids)
    return turn.observation_ids
  return observe


class Schedule(abc.ABC):
  """What a schedule of rows shares (the engine's; the tests' lock-step
  oracle's): config, tools, stop strings, observations, and the hooks a
  benchmark replays recorded turns through (`scripted.replaying`)."""

  def __init__(self, tokenizer, tools: dict[str, BatchTool],
               config: RolloutConfig):
    self.tokenizer, self._config = tokenizer, None
    self.config = config
    self.toolset = ToolSet(tools)
    self.metrics: dict[str, float] = {}  # Of the last rollout.

  @property
  def config(self) -> RolloutConfig:
    return self._config

  @config.setter
  def config(self, config: RolloutConfig) -> None:
    """A config of another format brings its stop strings and
    observation frame with it (one of the same format, e.g. another
    seed, keeps them, as a caller may have set them)."""
    if self._config is None or config.fmt != self._config.fmt:
      self.stops = tuple(parsing.stop_strings(config.fmt))
      self.observe = observer(self.tokenizer, config.fmt)
    self._config = config

  def turn_budget(self, traj: Trajectory, turn_no: int) -> int:
    """New tokens allowed in turn `turn_no` of `traj`."""
    del traj, turn_no
    return self.config.max_new_tokens

  def parse(self, traj: Trajectory, text: str) -> parsing.ParsedTurn:
    del traj
    return parsing.parse_turn(text, self.config.fmt)

  def run(self, tasks: Sequence[Task], samples_per_task: int = 1,
          sample_offset: int = 0) -> list[Trajectory]:
    """Rollouts of every (task, sample); sample indices start at offset."""
    return self.run_pairs([(task, sample_offset + k) for task in tasks
                           for k in range(samples_per_task)])

  @abc.abstractmethod
  def run_pairs(self, pairs: Sequence[tuple[Task, int]]
                ) -> list[Trajectory]:
    """One trajectory per (task, sample index), in pair order: the
    schedule itself (the engine's continuous batching, the oracle's lock
    step)."""


def rollout_metrics(rows: Sequence[Row], stats, t0: float
                    ) -> dict[str, float]:
  """Wall time, kept tokens / slot-steps, tool wait and the longest row's
  share of the wall time, for one rollout."""
  wall = max(time.perf_counter() - t0, 1e-9)
  tokens = sum(len(t.action_ids) for r in rows for t in r.traj.turns)
  longest = max((((r.end_s or t0 + wall) - t0) for r in rows), default=0.0)
  out = dict(stats)
  out.update(wall_s=wall, tokens=float(tokens), tokens_per_s=tokens / wall,
             slot_utilisation=tokens / max(stats.get("slot_steps", 0), 1),
             longest_row_share=longest / wall)
  return {k: float(v) for k, v in out.items()}


def response_stats(trajectories: Sequence[Trajectory],
                   fmt: str | None = None) -> dict[str, float]:
  """Turns per trajectory, lengths, and the shares of trajectories with a
  void turn (`void_rate`: a turn that parses as void in `fmt`, default
  each trajectory's own), cut by the turn cap, or overlong, that call a
  tool (`tool_use_rate`), and that call one and end right
  (`tool_solved_rate`, once scored)."""
  n = max(1, len(trajectories))
  lengths = [sum(len(t.action_ids) for t in tr.turns) for tr in trajectories]
  share = lambda f: sum(bool(f(t)) for t in trajectories) / n
  uses_tool = lambda tr: any(t.tool is not None for t in tr.turns)
  void = lambda tr: any(parsing.is_void(t.text, fmt or tr.meta["fmt"])
                        for t in tr.turns)
  return {
      "turns": float(np.mean([len(t.turns) for t in trajectories] or [0])),
      "void_rate": share(void),
      "turn_cap_rate": share(lambda t: t.meta.get("turn_cap")),
      "overlong_rate": share(lambda t: t.meta.get("overlong")),
      "response_len": float(np.mean(lengths or [0])),
      "tool_use_rate": share(uses_tool),
      "tool_solved_rate": share(lambda t: t.outcome and uses_tool(t)),
  }
