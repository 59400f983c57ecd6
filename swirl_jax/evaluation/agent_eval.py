"""Evaluation of a policy with tools: accuracy, F1, process correctness.

Inference stays sequential (reason → act → observe → … → answer) with the
step caps of training; process correctness is the share of the evaluated
trajectories' steps that the judge calls GOOD.
"""

import json
import pathlib
from typing import Sequence

import numpy as np

from swirl_jax import jsonl
from swirl_jax.rollout import decompose
from swirl_jax.rollout import turns
from swirl_jax.rollout.records import Trajectory
from swirl_jax.tasks import checkers
from swirl_jax.tasks.records import Task


def summarize(trajs: Sequence[Trajectory], tasks: Sequence[Task],
              judge=None) -> dict[str, float]:
  by_id = {t.id: t for t in tasks}
  scores = [checkers.score(by_id[t.task_id], t.final_answer) for t in trajs]
  out = dict(n=float(len(trajs)),
             accuracy=float(np.mean([s["correct"] for s in scores])),
             f1=float(np.mean([s["f1"] for s in scores])),
             answered=float(np.mean([t.final_answer is not None
                                     for t in trajs])),
             **turns.response_stats(trajs))
  if judge is not None:
    units = decompose.decompose_all(trajs)
    labels = judge.label([u.state_text for u in units],
                         [u.action_text for u in units],
                         task_ids=[u.task_id for u in units])
    out["process_correctness"] = float(np.mean(labels)) if labels else 0.0
    out["steps"] = float(len(units))
  return out


def pass_at_k(trajs: Sequence[Trajectory], k: int) -> dict[str, float]:
  """avg@k (mean correctness) and pass@k (any of a task's k correct)."""
  by_task: dict[str, list[bool]] = {}
  for t in trajs:
    by_task.setdefault(t.task_id, []).append(bool(t.outcome))
  avg = float(np.mean([np.mean(v) for v in by_task.values()]))
  return {f"avg@{k}": avg,
          f"pass@{k}": float(np.mean([any(v) for v in by_task.values()]))}


def table(results: dict[str, dict[str, float]],
          columns=("accuracy", "f1", "process_correctness", "turns",
                   "void_rate")) -> str:
  """A Markdown table: one row per policy, the chosen columns."""
  cols = [c for c in columns if any(c in r for r in results.values())]
  lines = ["| policy | " + " | ".join(cols) + " |",
           "|---" * (len(cols) + 1) + "|"]
  for name, r in results.items():
    cells = [f"{r[c]:.3f}" if c in r else "-" for c in cols]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def read(path: str) -> dict:
  """The results a `write` left in `path`; {} when none."""
  f = pathlib.Path(path) / "results.json"
  return json.loads(f.read_text()) if f.exists() else {}


def write(path: str, results: dict, trajs: dict[str, list] | None = None):
  p = pathlib.Path(path)
  p.mkdir(parents=True, exist_ok=True)
  (p / "results.json").write_text(json.dumps(results, indent=2))
  (p / "results.md").write_text(table(results) + "\n")
  for name, ts in (trajs or {}).items():
    jsonl.write(p / f"trajectories_{name}.jsonl", ts)
