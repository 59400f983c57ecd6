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
              judge=None, outcome_judge=None) -> dict[str, float]:
  """accuracy (exact match after normalisation), F1, answer rate and
  rollout statistics; with `judge`, process correctness; with
  `outcome_judge` (judges.OutcomeJudge), `llm_correct`: the share of
  trajectories whose answer the judge calls the gold one's (the SWiRL
  paper's metric; no answer is wrong without asking)."""
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
  if outcome_judge is not None:
    out["llm_correct"] = llm_correct(outcome_judge, trajs, by_id)
  return out


def llm_correct(outcome_judge, trajs, by_id) -> float:
  """Share of trajectories whose answer the judge matches to the gold."""
  answered = [t for t in trajs if t.final_answer is not None]
  labels = outcome_judge.label(
      [by_id[t.task_id].question for t in answered],
      [t.final_answer for t in answered],
      [" / ".join(by_id[t.task_id].answers) for t in answered]) \
      if answered else []
  return float(sum(labels)) / max(1, len(trajs))


def pass_at_k(trajs: Sequence[Trajectory], k: int) -> dict[str, float]:
  """avg@k (mean correctness) and pass@k (any of a task's k correct)."""
  by_task: dict[str, list[bool]] = {}
  for t in trajs:
    by_task.setdefault(t.task_id, []).append(bool(t.outcome))
  avg = float(np.mean([np.mean(v) for v in by_task.values()]))
  return {f"avg@{k}": avg,
          f"pass@{k}": float(np.mean([any(v) for v in by_task.values()]))}


def table(results: dict[str, dict[str, float]],
          columns=("accuracy", "llm_correct", "f1", "process_correctness",
                   "turns", "void_rate"), label: str = "policy") -> str:
  """A Markdown table: one row per entry (policy, or dataset), the chosen
  columns that any entry has."""
  cols = [c for c in columns if any(c in r for r in results.values())]
  lines = [f"| {label} | " + " | ".join(cols) + " |",
           "|---" * (len(cols) + 1) + "|"]
  for name, r in results.items():
    cells = [f"{r[c]:.3f}" if c in r else "-" for c in cols]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def read(path: str) -> dict:
  """The results a `write` left in `path`; {} when none."""
  f = pathlib.Path(path) / "results.json"
  return json.loads(f.read_text()) if f.exists() else {}


def write(path: str, results: dict, trajs: dict[str, list] | None = None,
          *, columns=None, label: str = "policy", header: str = ""):
  """results.json, results.md (`table` of `columns`, rows named `label`,
  under `header`) and the trajectories of each entry as JSONL."""
  p = pathlib.Path(path)
  p.mkdir(parents=True, exist_ok=True)
  # Atomic: a run killed mid-write leaves the old results, never half.
  jsonl.write_bytes(p / "results.json", json.dumps(results, indent=2).encode())
  text = table(results, label=label) if columns is None else \
      table(results, columns, label=label)
  head = f"{header}\n\n" if header else ""
  jsonl.write_bytes(p / "results.md", (head + text + "\n").encode())
  for name, ts in (trajs or {}).items():
    jsonl.write(p / f"trajectories_{name}.jsonl", ts)
