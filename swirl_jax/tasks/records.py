"""The `Task` record: one question, its gold answer(s), where it came from."""

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Task:
  """A question to solve.

  id: unique within its source, e.g. 'gsm8k/test/12'.
  question: the question or problem text, without any prompt template.
  answers: gold answers; the first is canonical, the rest are aliases.
  source: dataset name; picks the answer checker (see checkers.py).
  split: the split it came from.
  metadata: anything else (solution text, supporting facts, solution
    graph of a synthetic task, ...). Must be JSON-serialisable.
  """
  id: str
  question: str
  answers: tuple[str, ...]
  source: str
  split: str = ""
  metadata: dict[str, Any] = dataclasses.field(
      default_factory=dict, compare=False, hash=False)

  def __post_init__(self):
    if isinstance(self.answers, str):
      object.__setattr__(self, "answers", (self.answers,))
    else:
      object.__setattr__(self, "answers", tuple(self.answers))

  @property
  def answer(self) -> str:
    """The canonical gold answer."""
    return self.answers[0] if self.answers else ""

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self) | {"answers": list(self.answers)}

  @classmethod
  def from_json(cls, d: dict[str, Any]) -> "Task":
    return cls(id=d["id"], question=d["question"],
               answers=tuple(d["answers"]), source=d["source"],
               split=d.get("split", ""), metadata=d.get("metadata", {}))
