"""A sampler that replays fixed texts: the rollout loop without a model.

It speaks the `Sampler` interface the loop uses (`generate`, `extend`,
`select`), tokenising each scripted turn with the real tokenizer, so loop
logic, records and masks can be checked exactly; demonstrations of
synthetic tasks are recorded with it too.
"""

import collections
import dataclasses
from typing import Callable, Sequence

import numpy as np


@dataclasses.dataclass
class ScriptedState:
  rows: list[int]  # Script index of each row.
  turns: list[int]  # Next turn of each row.
  consumed: bool = False

  @property
  def num_rows(self) -> int:
    return len(self.rows)


@dataclasses.dataclass
class ScriptedResult:
  tokens: list[list[int]]
  logprobs: list[np.ndarray]
  texts: list[str]
  stop_reasons: list[str | None]
  matched_stops: list[str | None]
  state: ScriptedState


class ScriptedSampler:
  """Row i of the first `generate` replays `script(i, turn)` each turn.

  `script(row, turn) -> str` gives the text of that turn ('' ends it with
  EOS). A text is cut after its first stop string, as a sampler would.
  """

  def __init__(self, tokenizer, script: Callable[[int, int], str]):
    self.tokenizer, self.script = tokenizer, script
    self.extended: list[list[list[int]]] = []  # Observations seen, per call.

  def generate(self, prompts=None, max_new_tokens=256, stop_strings=(),
               temperature=0.0, top_k=0, top_p=1.0, seed=None, *,
               state: ScriptedState | None = None,
               rows: Sequence[int] | None = None) -> ScriptedResult:
    del temperature, top_k, top_p, seed
    if state is None:
      state = ScriptedState(list(range(len(prompts))), [0] * len(prompts))
    n = state.num_rows
    budget = np.broadcast_to(np.asarray(max_new_tokens), (n,))
    active = range(n) if rows is None else rows
    out = ScriptedResult([[] for _ in range(n)], [np.zeros(0)] * n,
                         [""] * n, [None] * n, [None] * n, state)
    for j in active:
      ids, text, reason, matched = self.turn(state.rows[j], state.turns[j],
                                             int(budget[j]), stop_strings)
      state.turns[j] += 1
      out.tokens[j], out.texts[j] = ids, text
      out.logprobs[j] = np.full(len(ids), -0.5, np.float32)
      out.stop_reasons[j], out.matched_stops[j] = reason, matched
    return out

  def turn(self, row: int, turn: int, budget: int, stop_strings):
    """(ids, text, stop reason, matched stop) of one scripted stretch."""
    text = self.script(row, turn)
    reason, matched = "eos", None
    hits = [(text.find(s), s) for s in stop_strings if s in text]
    if hits:
      pos, matched = min(hits)
      text, reason = text[:pos + len(matched)], "stop"
    ids = self.tokenizer.encode_continuation(text) if text else []
    if reason == "eos":
      ids = ids + [self.tokenizer.eos_id]
    if len(ids) > budget:
      ids, reason, matched = ids[:budget], "length", None
      text = self.tokenizer.decode(ids)
    return ids, text, reason, matched

  def rollout_device(self, decode_batch: int, chunk_steps: int):
    """What the rollout engine decodes with: this script, row by row."""
    del chunk_steps
    return ScriptedDevice(self, decode_batch)

  def extend(self, state: ScriptedState, observations) -> ScriptedState:
    self.extended.append([list(o or []) for o in observations])
    return state

  def select(self, state: ScriptedState, rows) -> ScriptedState:
    return ScriptedState([state.rows[r] for r in rows],
                         [state.turns[r] for r in rows])


class ScriptedDevice:
  """The rollout engine's device for a `ScriptedSampler`: no cache; row i
  of a rollout (its i-th pair) replays `script(i, k)` as its k-th
  stretch, as it would as row i of the loop's first `generate`."""

  limit = 2 ** 31 - 1  # No cache to fill.

  def __init__(self, sampler: ScriptedSampler, decode_batch: int):
    self.sampler, self.decode_batch = sampler, decode_batch
    self.trace_counts = self.shapes = collections.Counter()  # No programs.
    self._turns: dict[int, int] = {}
    self._texts: dict[int, str] = {}

  def open(self, num_rows: int, max_slots: int) -> int:
    self._turns, self._texts = {}, {}
    return min(num_rows, max_slots)

  def close(self) -> None:
    pass

  def precompile(self, config, stop_strings) -> None:
    del config, stop_strings  # No programs.

  def select(self, ready: list) -> list:
    return ready[:self.decode_batch]

  def append(self, rows, fresh: bool) -> None:
    if not fresh:
      self.sampler.extended.append([list(r.obs) for r in rows])

  def decode(self, rows, seeds, config, stop_strings):
    del seeds, config
    out = []
    for r in rows:
      k = self._turns.get(r.index, 0)
      self._turns[r.index] = k + 1
      ids, text, reason, _ = self.sampler.turn(r.index, k, r.budget,
                                               stop_strings)
      self._texts[r.index] = text
      out.append((ids, [-0.5] * len(ids), reason))
    return out, len(rows) * max(len(o[0]) for o in out)

  def text(self, row, tokens, why: str, stop_strings) -> str:
    del tokens, why, stop_strings
    return self._texts[row.index]


def replaying(base, lengths: Callable[[str, int], int],
              action: Callable[[str, int], object]):
  """`base` (a `RolloutLoop` or `RolloutEngine` class) with turns replayed:
  turn k of trajectory `traj_id` samples up to `lengths(traj_id, k)` real
  model tokens and then acts as `action(traj_id, k)` (a
  `parsing.ParsedTurn`) says, whatever the tokens read. Decode cost, tool
  calls and trajectory shapes follow a recording; the tokens stay the
  model's own."""

  class Replayed(base):

    def turn_budget(self, traj, turn_no):
      return lengths(traj.id, turn_no)

    def parse(self, traj, text):
      del text
      return action(traj.id, len(traj.turns) - 1)

  Replayed.__name__ = f"Replayed{base.__name__}"
  return Replayed
