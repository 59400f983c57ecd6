"""The device interface generation runs on: rows of a KV cache, appended
to and decoded in batches, read back and detokenised.

`pages.PagedDevice` (a model's page pool), `pages.DataGroups` (one per
data group of a decode mesh) and `rollout.scripted.ScriptedDevice` (a
script, no model) implement `Device`; `Sampler.generate` and the rollout
engine drive one. Anything with a `device(...)` method (`Maker`: the
`Sampler`, the scripted sampler) gives the engine its device.

Rows and their place on the device. A row's `seat` (a `Seat`, given by the
device) is where its context lives: an entry of the device's row tables
(its logits and stop-string state) and the pages holding its tokens. A
device hands out entries and pages when asked (`reserve`, and on its own
in `append` and `decode`), takes them back when a row ends (`release`) and
frees a row's pages for others while keeping its tokens (`preempt`): the
next program the row is in recomputes its cache from its tokens first.
(Before the page pool a row held `slot`, a cache row of the full length;
`open` took no pool size, and `reserve`, `release` and `preempt` did not
exist.)
"""

import collections
import dataclasses
from typing import (Any, Callable, NamedTuple, Protocol, Sequence,
                    runtime_checkable)


@dataclasses.dataclass
class Seat:
  """A row's place on a device (`Row.seat`): the device's to change.

  `entry` is its index in its data group's row tables (-1 while
  preempted); `pages` hold its tokens, in order (slot s in page
  pages[s // page_size]); `tokens` are those tokens, kept on the host so a
  preempted row can be recomputed; `stop` its stop-string matcher state,
  kept while preempted; `in_pool` False while its pages are yet to be
  refilled from `tokens`.
  """
  group: int = 0
  entry: int = -1
  pages: list[int] = dataclasses.field(default_factory=list)
  tokens: list[int] = dataclasses.field(default_factory=list)
  stop: int = 0
  in_pool: bool = True


class Row(Protocol):
  """What a device reads of a row (the engine's `turns.Row`)."""
  index: int  # Position in the run (a script replays by it).
  seat: Seat | None  # Its place on the device; None before it has one.
  length: int  # Tokens of context it holds.
  budget: int  # New tokens it may still sample in this stretch.
  obs: list[int] | None  # Tokens to append next.


@dataclasses.dataclass
class PlainRow:
  """A plain `Row` (`Sampler.generate`'s prompts)."""
  index: int
  obs: list[int] | None
  budget: int = 0
  length: int = 0
  seat: Seat | None = None


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
  `layout` (a `pages.Layout`) gives the mesh context it lowers in."""
  fn: Callable
  args: tuple
  kwargs: dict
  layout: Any

  def lower(self):
    with self.layout.active():
      return self.fn.lower(*self.args, **self.kwargs)


@runtime_checkable
class Device(Protocol):
  """A KV cache's rows and the programs that fill and decode them."""
  limit: int  # Context tokens a row holds at most.
  decode_batch: int  # Rows one decode call takes at most.
  shapes: collections.Counter  # Program calls since `open`, by shape.

  def open(self, num_rows: int, max_rows: int, pages: int = 0) -> int:
    """Allocates a cache for a run of `num_rows` rows; returns how many it
    seats at once, at most `max_rows`. `pages`: the pool's pages (0:
    enough for that many rows at `limit`: no row need be preempted)."""

  def close(self) -> None:
    """Frees the cache."""

  def set_params(self, params) -> None:
    """Decodes with `params` from the next program call on (between
    decode chunks; the cache keeps what earlier params wrote). `params`
    are laid out as `Sampler.params` (this host's own copy)."""

  def reserve(self, rows: Sequence[Row], more: Sequence[int]) -> bool:
    """Gives each row a seat if it has none (or is preempted: its tokens
    are then recomputed by its next program) and the pages to hold
    `more[i]` tokens past its own, all or nothing: False, taking nothing,
    when the entries or pages free fall short. `append` and `decode`
    reserve what they need themselves and raise when it is not there."""

  def preempt(self, row: Row) -> None:
    """Frees the row's entry and pages, keeping its tokens on the host."""

  def release(self, row: Row) -> None:
    """Frees a row that has ended (its seat)."""

  def append(self, rows: Sequence[Row], fresh: bool) -> None:
    """Appends each row's `obs` to its context (`fresh`: the row starts
    empty, a prefill); lengths are the caller's to update."""

  def select(self, ready: Sequence[Row]) -> list[Row]:
    """The ready rows the next `decode` takes."""

  def decode(self, rows: Sequence[Row], draws: Sequence[Draw],
             stop_strings: tuple[str, ...]
             ) -> tuple[list[Decoded], int]:
    """Up to a chunk of steps of each row (each with room, at most its
    `budget`), stopping at EOS or `stop_strings` too. Returns each row's
    stretch and the row-steps computed."""

  def text(self, row: Row, tokens: Sequence[int], why: str,
           stop_strings: tuple[str, ...]) -> str:
    """The text of a stretch as `Sampler.generate` gives it."""

  def precompile(self, stop_strings: tuple[str, ...]) -> None:
    """Compiles every program a run can call (after `open`)."""

  def lowerable(self, rows: int, stop_strings: tuple[str, ...],
                pages: int = 0) -> dict[str, Lowerable]:
    """Each program at the device's own sizes with `rows` row entries and
    a pool of `pages` pages (0: `rows` rows at `limit`), reading its rows'
    whole context, from abstract arguments (nothing is allocated): what
    the fit job compiles."""


class Maker(Protocol):
  """What the engine decodes with: gives it a device."""

  def device(self, decode_batch: int, chunk_steps: int,
             append_tokens: int = 64) -> Device:
    ...
