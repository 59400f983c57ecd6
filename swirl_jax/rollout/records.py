"""Trajectory records and their JSONL shards.

A shard holds one JSON object per line, so `head shard.jsonl` shows whole
records. Records round-trip losslessly: `cls.from_json(r.to_json()) == r`.

Text and ids. A turn's `text` is the decoded `action_ids` and its
`observation` the decoded `observation_ids` (whatever the rollout wraps the
tool result in, e.g. the end of the assistant turn and a user turn holding
`QUERY -> RESULT`). So `prompt + Σ(text + observation)` is the transcript
and `prompt_ids + Σ(action_ids + observation_ids)` its token ids. Training
sequences are always built from the ids, segment by segment; joined text is
never re-tokenised (BPE merges across a boundary would move the mask).
"""

import dataclasses
import json
from typing import Any, Iterable, Iterator, TypeVar

import numpy as np

from swirl_jax import jsonl

R = TypeVar("R")


def _check_keys(cls, d: dict) -> None:
  known = {f.name for f in dataclasses.fields(cls)}
  unknown = set(d) - known
  if unknown:
    raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")


class _JsonRecord:
  """`to_json` / `from_json` for flat dataclasses (lists, dicts, scalars)."""

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]):
    _check_keys(cls, d)
    return cls(**d)

  def to_json(self) -> str:
    # ensure_ascii=False keeps shards readable; NaN/inf log-probs survive as
    # the (Python-readable) tokens NaN / -Infinity.
    return json.dumps(self.to_dict(), ensure_ascii=False)

  @classmethod
  def from_json(cls, line: str):
    return cls.from_dict(json.loads(line))


@dataclasses.dataclass
class Turn(_JsonRecord):
  """One model turn and the observation that answered it.

  `action_logprobs` are the behaviour policy's log-probs of `action_ids`
  (same length), or empty when the writer did not record them.
  """
  text: str = ""
  action_ids: list[int] = dataclasses.field(default_factory=list)
  action_logprobs: list[float] = dataclasses.field(default_factory=list)
  observation: str = ""
  observation_ids: list[int] = dataclasses.field(default_factory=list)
  tool: str | None = None  # Parsed call: tool name ...
  argument: str | None = None  # ... and its argument.
  answer: str | None = None  # Parsed final answer, when the turn gives one.
  void: bool = False  # Neither a complete tool call nor an answer.
  stop_reason: str = ""  # e.g. 'stop', 'length', 'eos'.

  def __post_init__(self):
    if self.action_logprobs and \
        len(self.action_logprobs) != len(self.action_ids):
      raise ValueError(f"Turn: {len(self.action_logprobs)} action_logprobs "
                       f"for {len(self.action_ids)} action_ids")


@dataclasses.dataclass
class Trajectory(_JsonRecord):
  """A prompt and the turns a policy took from it."""
  task_id: str = ""
  sample_index: int = 0
  prompt: str = ""
  prompt_ids: list[int] = dataclasses.field(default_factory=list)
  turns: list[Turn] = dataclasses.field(default_factory=list)
  final_answer: str | None = None
  outcome: bool | None = None  # Final answer correct; None: not checked.
  reward: float | None = None  # SimpleTIR's scalar reward.
  source: str = ""  # Dataset / generator that produced it.
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def id(self) -> str:
    return f"{self.task_id}/{self.sample_index}"

  @property
  def has_behaviour_logprobs(self) -> bool:
    return all(t.action_logprobs or not t.action_ids for t in self.turns)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
    _check_keys(cls, d)
    d = dict(d)
    d["turns"] = [t if isinstance(t, Turn) else Turn.from_dict(t)
                  for t in d.get("turns", [])]
    return cls(**d)

  def token_sequence(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens int32, loss_mask int32, behaviour_logprobs float32), [T].

    Concatenates the id segments: prompt (mask 0), then per turn the action
    (mask 1) and the observation (mask 0). Behaviour log-probs are 0 off the
    mask and where a turn has none recorded (see `has_behaviour_logprobs`).
    """
    tokens, mask, logps = [self.prompt_ids], [np.zeros(len(self.prompt_ids))], \
        [np.zeros(len(self.prompt_ids))]
    for t in self.turns:
      n, m = len(t.action_ids), len(t.observation_ids)
      tokens += [t.action_ids, t.observation_ids]
      mask += [np.ones(n), np.zeros(m)]
      logps += [np.asarray(t.action_logprobs) if t.action_logprobs
                else np.zeros(n), np.zeros(m)]
    cat = lambda xs, dt: np.concatenate(
        [np.asarray(x, dt).reshape(-1) for x in xs])
    return cat(tokens, np.int32), cat(mask, np.int32), cat(logps, np.float32)


@dataclasses.dataclass
class StepUnit(_JsonRecord):
  """SWiRL's (state, action) unit: one model turn and everything before it."""
  trajectory_id: str = ""  # f"{task_id}/{sample_index}"
  step_index: int = 0
  state_ids: list[int] = dataclasses.field(default_factory=list)
  state_text: str = ""
  action_ids: list[int] = dataclasses.field(default_factory=list)
  action_text: str = ""
  action_logprobs: list[float] = dataclasses.field(default_factory=list)
  process_good: bool | None = None  # Judge label; None: not judged.
  process_prob: float | None = None  # Judge's P(GOOD).
  outcome: bool | None = None  # The trajectory's final answer was correct.
  is_final: bool = False  # The action gives the final answer.
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def task_id(self) -> str:
    return self.trajectory_id.rsplit("/", 1)[0]


# ---------------------------------------------------------------- JSONL IO
# Record files: torn-tail recovery and `path:line: reason` errors come from
# `swirl_jax.jsonl`; these bind it to the record classes.


def write_jsonl(path: str, records: Iterable[Any]) -> int:
  """Appends records to the shard `path`; see `jsonl.append`."""
  return jsonl.append(path, records)


def iter_jsonl(path: str, cls: type[R] | None = None) -> Iterator[R]:
  """Records of a shard (`cls.from_dict` per line; dicts if cls is None).

  A torn last line (a killed writer) is skipped with a warning; any other
  bad line raises `jsonl.FormatError` (`path:line: reason`).
  """
  return jsonl.iterate(path, cls.from_dict if cls is not None else None,
                       torn_tail=True)


def read_jsonl(path: str, cls: type[R] | None = None) -> list[R]:
  """All records of a shard; see `iter_jsonl`."""
  return list(iter_jsonl(path, cls))
