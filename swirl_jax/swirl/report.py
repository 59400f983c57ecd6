"""A run's summary: report.md and plots, from what the stages wrote.

  report.md          the evaluation table, the filter report, stage 2's
                     reward at its first and last steps
  reward.png         stage 2's mean reward-model score per step
  judged_steps.png   share of steps the judge calls GOOD: stage 1 samples,
                     what each filter keeps, and the evaluated policies

Reads only files, so it also runs on a copied or finished workdir.
"""

import json
import pathlib

from matplotlib.figure import Figure  # No pyplot: no global backend.

from swirl_jax.evaluation import agent_eval
from swirl_jax.rollout.records import read_jsonl


def reward_curve(work: pathlib.Path, rl_name: str = "rl"):
  """(steps, rewards) of stage 2, from its metrics.jsonl."""
  path = work / rl_name / "metrics.jsonl"
  rows = [r for r in (read_jsonl(str(path)) if path.exists() else [])
          if r.get("reward") is not None]
  return [r["step"] for r in rows], [r["reward"] for r in rows]


def judged_shares(work: pathlib.Path) -> dict[str, float]:
  shares = {}
  rep = work / "filter" / "report.json"
  if rep.exists():
    report = json.loads(rep.read_text())
    for name, r in report.items():
      if isinstance(r, dict) and r.get("steps_in"):
        shares.setdefault("stage 1 (all)",
                          r["steps_judged_good"] / r["steps_in"])
        shares[f"kept: {name}"] = r["steps_kept"] / r["steps_in"]
  res = work / "eval" / "results.json"
  if res.exists():
    for name, r in json.loads(res.read_text()).items():
      if "process_correctness" in r:
        shares[f"eval: {name}"] = r["process_correctness"]
  return shares


def _plot_reward(steps, rewards, path):
  fig = Figure(figsize=(6, 3.5))
  ax = fig.subplots()
  ax.plot(steps, rewards, marker="o", ms=3)
  ax.set_xlabel("stage 2 step")
  ax.set_ylabel("mean reward (judge P(GOOD))")
  ax.set_ylim(0, 1)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def _plot_shares(shares, path):
  fig = Figure(figsize=(6, 0.4 * len(shares) + 1.2))
  ax = fig.subplots()
  names = list(shares)
  ax.barh(names, [shares[n] for n in names])
  ax.set_xlim(0, 1)
  ax.invert_yaxis()
  ax.set_xlabel("share of steps (judged GOOD / kept)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def write(workdir, rl_name: str = "rl") -> str:
  """Writes report.md and the plots; returns the report's text."""
  work = pathlib.Path(workdir)
  lines = [f"# SWiRL run: {work}", ""]
  res = work / "eval" / "results.json"
  if res.exists():
    lines += ["## Held-out evaluation", "",
              agent_eval.table(json.loads(res.read_text())), ""]
  steps, rewards = reward_curve(work, rl_name)
  if steps:
    _plot_reward(steps, rewards, work / "reward.png")
    k = max(1, len(rewards) // 5)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    lines += ["## Stage 2", "",
              f"{len(steps)} steps; mean reward over the first {k}: "
              f"{first:.3f}, over the last {k}: {last:.3f} (reward.png)", ""]
  shares = judged_shares(work)
  if shares:
    _plot_shares(shares, work / "judged_steps.png")
    lines += ["## Judged steps (judged_steps.png)", "",
              "| set | share |", "|---|---|"]
    lines += [f"| {n} | {v:.3f} |" for n, v in shares.items()]
    lines.append("")
  text = "\n".join(lines)
  (work / "report.md").write_text(text)
  return text
