"""A sampler that replays fixed texts: rollouts without a model.

`ScriptedSampler` gives the rollout engine a `ScriptedDevice` (a
`device.Device` with no cache), which tokenises each scripted turn with
the real tokenizer, so turn logic, records and masks can be checked
exactly; demonstrations of synthetic tasks are recorded with it too.
`replaying` replays recorded turn lengths and actions on a real model.
"""

import collections
from typing import Callable

from swirl_jax.sampling.device import Seat


class ScriptedSampler:
  """Row i of a rollout (its i-th pair) replays `script(i, k)` as its k-th
  stretch. `script(row, turn) -> str` gives the text ('' ends it with
  EOS); a text is cut after its first stop string, as a sampler would.
  `limit`: the context a row holds (a model's cache would)."""

  def __init__(self, tokenizer, script: Callable[[int, int], str],
               limit: int = 2 ** 31 - 1):
    self.tokenizer, self.script, self.limit = tokenizer, script, limit
    self.extended: list[list[list[int]]] = []  # Observations, per append.

  def local_params(self, params):
    """`params` as given: a script decodes with none."""
    return params

  def device(self, decode_batch: int, chunk_steps: int,
             append_tokens: int = 64) -> "ScriptedDevice":
    del chunk_steps, append_tokens  # A stretch comes whole.
    return ScriptedDevice(self, decode_batch)

  def turn(self, row: int, turn: int, budget: int, stop_strings):
    """(ids, text, stop reason) of one scripted stretch."""
    text = self.script(row, turn)
    reason = "eos"
    hits = [(text.find(s), s) for s in stop_strings if s in text]
    if hits:
      pos, matched = min(hits)
      text, reason = text[:pos + len(matched)], "stop"
    ids = self.tokenizer.encode_continuation(text) if text else []
    if reason == "eos":
      ids = ids + [self.tokenizer.eos_id]
    if len(ids) > budget:
      ids, reason = ids[:budget], "length"
      text = self.tokenizer.decode(ids)
    return ids, text, reason


class ScriptedDevice:
  """A `device.Device` replaying a `ScriptedSampler`'s script: no cache,
  no programs; each row's k-th decode is its k-th scripted stretch."""

  def __init__(self, sampler: ScriptedSampler, decode_batch: int):
    self.sampler, self.decode_batch = sampler, decode_batch
    self.limit = sampler.limit
    self.shapes = collections.Counter()  # No programs.
    self._free = 0  # Seats left.
    self._turns: dict[int, int] = {}
    self._texts: dict[int, str] = {}
    self.params = None

  def open(self, num_rows: int, max_rows: int, pages: int = 0) -> int:
    del pages  # No cache: a seat is all a row takes.
    self._turns, self._texts = {}, {}
    self._free = min(num_rows, max_rows)
    return self._free

  def close(self) -> None:
    pass

  def set_params(self, params) -> None:
    self.params = params  # A script reads none; tests read them here.

  def precompile(self, stop_strings) -> None:
    del stop_strings  # No programs.

  def lowerable(self, rows: int, stop_strings, pages: int = 0) -> dict:
    del rows, stop_strings, pages
    return {}

  def reserve(self, rows, more) -> bool:
    """A seat for each row without one (as many as `open` gave), no
    pages."""
    del more
    new = [r for r in rows if r.seat is None]
    if len(new) > self._free:
      return False
    self._free -= len(new)
    for r in new:
      r.seat = Seat()
    return True

  def preempt(self, row) -> None:
    del row  # Nothing to free: a scripted row holds no pages.

  def release(self, row) -> None:
    if row.seat is not None:
      row.seat, self._free = None, self._free + 1

  def select(self, ready: list) -> list:
    return ready[:self.decode_batch]

  def append(self, rows, fresh: bool) -> None:
    if not fresh:
      self.sampler.extended.append([list(r.obs) for r in rows])

  def decode(self, rows, draws, stop_strings):
    del draws
    out = []
    for r in rows:
      k = self._turns.get(r.index, 0)
      self._turns[r.index] = k + 1
      ids, text, reason = self.sampler.turn(
          r.index, k, min(r.budget, self.limit - r.length), stop_strings)
      self._texts[r.index] = text
      out.append((ids, [-0.5] * len(ids), reason))
    return out, len(rows) * max(len(o[0]) for o in out)

  def text(self, row, tokens, why: str, stop_strings) -> str:
    del tokens, why, stop_strings
    return self._texts[row.index]


def replaying(base, lengths: Callable[[str, int], int],
              action: Callable[[str, int], object]):
  """`base` (a class with the engine's `turn_budget` and `parse` hooks)
  with turns replayed: turn k of trajectory `traj_id` samples up to
  `lengths(traj_id, k)` real model tokens and then acts as
  `action(traj_id, k)` (a `parsing.ParsedTurn`) says, whatever the tokens
  read. Decode cost, tool calls and trajectory shapes follow a recording;
  the tokens stay the model's own."""

  class Replayed(base):

    def turn_budget(self, traj, turn_no):
      return lengths(traj.id, turn_no)

    def parse(self, traj, text):
      del text
      return action(traj.id, len(traj.turns) - 1)

  Replayed.__name__ = f"Replayed{base.__name__}"
  return Replayed
