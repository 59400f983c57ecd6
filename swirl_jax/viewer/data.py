"""A group's trajectories read from disk, as rows, details and statistics.

Reading never loses what was read: a bad line (corrupt JSON, a record with
unknown fields) ends that file's reading with a problem the page shows
(`path:line: reason`); a torn last line, left by a killed writer, is
skipped and shown as such too.
"""

import os
import pathlib

import numpy as np

from swirl_jax import jsonl
from swirl_jax.rollout.records import Trajectory
from swirl_jax.viewer import extract
from swirl_jax.viewer import judged as judged_lib
from swirl_jax.viewer.sources import Group


def _torn(path: pathlib.Path) -> bool:
  with open(path, "rb") as f:
    if f.seek(0, os.SEEK_END) == 0:
      return False
    f.seek(-1, os.SEEK_END)
    return f.read(1) != b"\n"


def read(group: Group, problems: list[str]) -> list[Trajectory]:
  """The group's trajectories (the first copy of an id wins, as stage 1's
  reader keeps it); what could not be read goes to `problems`."""
  out, seen = [], set()
  for path in group.files:
    try:
      for t in jsonl.iterate(path, Trajectory.from_dict, torn_tail=True):
        if t.id not in seen:
          seen.add(t.id)
          out.append(t)
    except jsonl.FormatError as e:
      problems.append(f"{e}; the rest of the file is not shown")
    except OSError as e:
      problems.append(f"{path}: not read ({e.strerror or e})")
      continue
    if _torn(path):
      problems.append(f"{path}: a torn last line (a killed writer) is not "
                      "shown")
  return out


def steps_of(t: Trajectory, judged: judged_lib.Judged) -> list[dict] | None:
  """SWiRL's judged steps of `t`, one per turn (None: nothing judged)."""
  if not judged.labels:
    return None
  return [judged.step(t.id, i) for i in range(len(t.turns))]


def _mean(xs) -> float | None:
  xs = [x for x in xs if x is not None]
  return round(float(np.mean(xs)), 4) if xs else None


def stats(rows: list[dict]) -> dict:
  """The group's summary figures (shown on top, compared side by side)."""
  out = {"n": len(rows),
         "reward": _mean(r["r"] for r in rows),
         "accuracy": _mean(r["o"] for r in rows),
         "void_rate": _mean(r["v"] for r in rows),
         "tool_error_rate": _mean(int(r["te"] > 0) for r in rows),
         "turns": _mean(r["nt"] for r in rows),
         "tokens": _mean(r["nk"] for r in rows),
         "min_logp": _mean(r["ml"] for r in rows)}
  if any("j" in r for r in rows):
    labels = "".join(r.get("j", "") for r in rows)
    out["steps"] = len(labels)
    out["good_rate"] = round(labels.count("G") / len(labels), 4) \
        if labels else None
    kept = {}
    for r in rows:
      for s, k in r.get("kept", {}).items():
        kept[s] = kept.get(s, 0) + k
    out["kept"] = kept
  return out
