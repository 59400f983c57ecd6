"""SWiRL's judged steps, as the filter stage left them in `<dir>/filter/`.

  units.jsonl              every step unit with the judge's label and P(GOOD)
  units_<strategy>.jsonl   the units each filter kept
  judge.json               the judge's identity (kind, endpoint, model...)
  judge_cache*.sqlite      an HTTP judge's replies (the default cache path)

A step is a turn: unit `step_index` i of trajectory `task_id/sample` is its
turn i (swirl_jax/rollout/decompose.py). The judge's reply text exists only
for an HTTP judge with its cache on: the cache key is rebuilt from the
judge's identity and the step, as `HTTPScorer` builds it. A model judge
reads P(GOOD) off its next-token distribution and a programmatic judge
checks the step against the task's solution, so neither has a reply.
"""

import dataclasses
import hashlib
import json
import logging
import pathlib
import sqlite3

from swirl_jax import jsonl
from swirl_jax import judges
from swirl_jax.rollout.records import StepUnit

STRATEGIES = ("none", "process", "outcome", "process_outcome")


@dataclasses.dataclass
class Judged:
  """What the filter stage says about one run's steps."""
  judge: dict  # judge.json ({} when absent).
  # (trajectory id, step) -> (label or None, P(GOOD) or None).
  labels: dict[tuple[str, int], tuple[bool | None, float | None]]
  kept: dict[str, set[tuple[str, int]]]  # strategy -> its kept steps.
  replies: dict[tuple[str, int], str]
  problems: list[str]

  def step(self, traj_id: str, i: int) -> dict:
    """The step's fields in a trajectory's detail (short keys)."""
    key = (traj_id, i)
    label, prob = self.labels.get(key, (None, None))
    out = {"j": None if label is None else int(label), "pg": prob,
           "kept": [s for s in STRATEGIES if s in self.kept
                    and key in self.kept[s]]}
    if key in self.replies:
      out["reply"] = self.replies[key]
    return out


def _reply_key(ident: dict, unit: StepUnit) -> str:
  """HTTPScorer's cache key of the process prompt for `unit`."""
  body = dict(model=ident.get("model_name", ""),
              messages=judges.process_chat(unit.state_text, unit.action_text),
              temperature=ident.get("temperature", 0.0),
              max_tokens=ident.get("max_tokens", 8))
  if ident.get("logprobs"):
    body.update(logprobs=True, top_logprobs=ident.get("top_logprobs", 20))
  return hashlib.sha256(json.dumps([ident.get("url", ""), body],
                                   sort_keys=True).encode()).hexdigest()


def _replies(filt: pathlib.Path, ident: dict, units, problems) -> dict:
  """Reply text per step from the HTTP judge's caches (read-only)."""
  caches = sorted(filt.glob("judge_cache*.sqlite"))
  if ident.get("kind") != "http" or not caches:
    return {}
  keys = {_reply_key(ident, u): (u.trajectory_id, u.step_index)
          for u in units}
  out = {}
  for path in caches:
    try:
      db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
      try:
        for key, value in db.execute("SELECT key, value FROM judge"):
          if key in keys:
            out[keys[key]] = str(json.loads(value).get("text") or "")
      finally:
        db.close()
    except (sqlite3.Error, ValueError, AttributeError) as e:
      problems.append(f"{path}: judge replies not read ({e})")
  return out


def _step_of(d: dict) -> tuple[str, int]:
  return d["trajectory_id"], int(d["step_index"])


def _read_units(path: pathlib.Path, problems: list[str],
                parse=StepUnit.from_dict) -> list:
  """`parse` of each unit of `path`, up to a bad line (reported)."""
  out = []
  try:
    for u in jsonl.iterate(path, parse, torn_tail=True):
      out.append(u)
  except jsonl.FormatError as e:
    problems.append(f"{e} (the units after it are not shown)")
  return out


def read(filt: pathlib.Path | None) -> Judged:
  """The labels, kept sets and replies of a `filter/` directory (all
  empty for None or a directory the filter stage has not finished)."""
  problems = []
  if filt is None or not (filt / "units.jsonl").exists():
    return Judged({}, {}, {}, {}, problems)
  units = _read_units(filt / "units.jsonl", problems)
  ident = {}
  if (filt / "judge.json").exists():
    try:
      ident = jsonl.read_json(filt / "judge.json")
    except jsonl.FormatError as e:
      problems.append(str(e))
  labels = {(u.trajectory_id, u.step_index): (u.process_good, u.process_prob)
            for u in units}
  kept = {}
  for s in STRATEGIES:
    path = filt / f"units_{s}.jsonl"
    if path.exists():
      kept[s] = set(_read_units(path, problems, _step_of))
  replies = _replies(filt, ident, units, problems)
  if problems:
    logging.warning("viewer: %s", "; ".join(problems))
  return Judged(ident, labels, kept, replies, problems)
