"""The device interface generation runs on: rows of a KV cache, appended
to and decoded in batches, read back and detokenised.

`slots.SlotDevice` (a model's slot-per-row cache), `slots.DataGroups` (one
per data group of a decode mesh) and `rollout.scripted.ScriptedDevice` (a
script, no model) implement `Device`; `Sampler.generate` and the rollout
engine drive one. Anything with a `device(...)` method (`Maker`: the
`Sampler`, the scripted sampler) gives the engine its device.
"""

import collections
import dataclasses
from typing import (Any, Callable, NamedTuple, Protocol, Sequence,
                    runtime_checkable)


class Row(Protocol):
  """What a device reads of a row (the engine's `turns.Row`)."""
  index: int  # Position in the run (a script replays by it).
  slot: int  # Its cache row.
  length: int  # Tokens of context in its cache row.
  budget: int  # New tokens it may still sample in this stretch.
  obs: list[int] | None  # Tokens to append next.


@dataclasses.dataclass
class SlotRow:
  """A plain `Row` in cache row `slot` (`Sampler.generate`'s prompts)."""
  slot: int
  obs: list[int] | None
  budget: int = 0
  length: int = 0

  @property
  def index(self) -> int:
    return self.slot


class Draw(NamedTuple):
  """How a row samples: key fold_in(key(seed), salt), each token's key
  then folding in its position; temperature <= 0 is greedy, top_k <= 0
  and top_p >= 1 are off."""
  seed: int
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  salt: int = 0


# One row's decoded stretch: (tokens, log-probs, reason), the reason one
# of `decoding.REASONS` ('length' when the chunk or the budget ended it).
Decoded = tuple[list[int], list[float], str]


class Lowerable(NamedTuple):
  """A program and abstract arguments to lower it with (`fit_programs`);
  `layout` (a `slots.Layout`) gives the mesh context it lowers in."""
  fn: Callable
  args: tuple
  kwargs: dict
  layout: Any

  def lower(self):
    with self.layout.active():
      return self.fn.lower(*self.args, **self.kwargs)


@runtime_checkable
class Device(Protocol):
  """Cache rows and the programs that fill and decode them."""
  limit: int  # Context tokens a row holds.
  decode_batch: int  # Rows one decode call takes at most.
  shapes: collections.Counter  # Program calls since `open`, by shape.

  def open(self, num_rows: int, max_slots: int) -> int:
    """Allocates a cache for a run of `num_rows` rows; returns its rows
    (slots), at most `max_slots`."""

  def close(self) -> None:
    """Frees the cache."""

  def set_params(self, params) -> None:
    """Decodes with `params` from the next program call on (between
    decode chunks; the cache keeps what earlier params wrote). `params`
    are laid out as `Sampler.params` (this host's own copy)."""

  def append(self, rows: Sequence[Row], fresh: bool) -> None:
    """Appends each row's `obs` to its cache row (`fresh`: the row starts
    empty, a prefill); lengths are the caller's to update."""

  def select(self, ready: Sequence[Row]) -> list[Row]:
    """The ready rows the next `decode` takes."""

  def decode(self, rows: Sequence[Row], draws: Sequence[Draw],
             stop_strings: tuple[str, ...]
             ) -> tuple[list[Decoded], int]:
    """Up to a chunk of steps of each row (each with room, at most its
    `budget`), stopping at EOS or `stop_strings` too. Returns each row's
    stretch and the slot-steps computed."""

  def text(self, row: Row, tokens: Sequence[int], why: str,
           stop_strings: tuple[str, ...]) -> str:
    """The text of a stretch as `Sampler.generate` gives it."""

  def precompile(self, stop_strings: tuple[str, ...]) -> None:
    """Compiles every program a run can call (after `open`)."""

  def lowerable(self, slots: int, stop_strings: tuple[str, ...]
                ) -> dict[str, Lowerable]:
    """Each program at the device's own sizes with `slots` cache rows,
    reading the whole cache, from abstract arguments (nothing is
    allocated): what the fit job compiles."""


class Maker(Protocol):
  """What the engine decodes with: gives it a device."""

  def device(self, decode_batch: int, chunk_steps: int,
             append_tokens: int = 64) -> Device:
    ...
