"""A run's summary: report.md and plots, from what the stages wrote.

  report.md          the evaluation table, the filter report, and per
                     stage 2 step the reward distribution (mean, std,
                     10/50/90th percentiles), the share of sampled actions
                     the reward model calls GOOD (their process
                     correctness) and the sampler-trainer mismatch
  reward.png         those per step, one quantity per panel
  judged_steps.png   two panels: the share of steps judged GOOD (stage 1
                     samples, the evaluated policies) and the share each
                     filter keeps

Reads only files, so it also runs on a copied or finished workdir.
"""

import json
import pathlib

from matplotlib.figure import Figure  # No pyplot: no global backend.
from matplotlib.ticker import MaxNLocator

from swirl_jax.evaluation import agent_eval
from swirl_jax.rollout.records import read_jsonl


# Logged with each stage 2 update (swirl/jobs.py `_rl`): the step's reward
# distribution (stage2.reward_stats) and the sampler-trainer mismatch.
STEP_KEYS = ("reward", "reward_std", "reward_p10", "reward_p50", "reward_p90",
             "reward_good_share", "mismatch_kl", "grad_norm")


def stage2_steps(work: pathlib.Path, rl_name: str = "rl") -> list[dict]:
  """One row per stage 2 step (its first update's metrics), by `iteration`
  (runs that logged none: by optimizer step)."""
  path = work / rl_name / "metrics.jsonl"
  rows = {}
  for r in read_jsonl(str(path)) if path.exists() else []:
    if r.get("reward") is not None:
      it = int(r.get("iteration", r["step"]))
      rows.setdefault(it, dict({k: r.get(k) for k in STEP_KEYS}, step=it))
  return [rows[k] for k in sorted(rows)]


def judged_shares(work: pathlib.Path) -> dict[str, dict[str, float]]:
  """{'judged GOOD': {set: share}, 'kept': {filter: share}}."""
  good, kept = {}, {}
  rep = work / "filter" / "report.json"
  if rep.exists():
    report = json.loads(rep.read_text())
    for name, r in report.items():
      if isinstance(r, dict) and r.get("steps_in"):
        good.setdefault("stage 1 (all)",
                        r["steps_judged_good"] / r["steps_in"])
        kept[name] = r["steps_kept"] / r["steps_in"]
  res = work / "eval" / "results.json"
  if res.exists():
    for name, r in json.loads(res.read_text()).items():
      if "process_correctness" in r:
        good[f"eval: {name}"] = r["process_correctness"]
  return {k: v for k, v in (("judged GOOD", good), ("kept", kept)) if v}


_PANELS = (("reward", "reward: mean, median, 10-90th pct"),
           ("reward_good_share", "share of sampled actions judged GOOD"),
           ("mismatch_kl", "sampler-trainer k3 KL"),
           ("grad_norm", "grad-norm before clipping"))


def _plot_steps(rows, path):
  panels = [(k, t) for k, t in _PANELS
            if any(r.get(k) is not None for r in rows)]
  fig = Figure(figsize=(6, 2.4 * len(panels)))
  axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
  for ax, (key, title) in zip(axes, panels):
    pts = [r for r in rows if r.get(key) is not None]
    x = [r["step"] for r in pts]
    ax.plot(x, [r[key] for r in pts], marker="o", ms=3)
    if key == "reward" and all(r.get("reward_p90") is not None for r in pts):
      ax.plot(x, [r["reward_p50"] for r in pts], ls="--", lw=1)
      ax.fill_between(x, [r["reward_p10"] for r in pts],
                      [r["reward_p90"] for r in pts], alpha=0.2)
    if key.startswith("reward"):
      ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("stage 2 step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return fig


def _plot_shares(shares, path):
  n = sum(len(v) for v in shares.values())
  fig = Figure(figsize=(6, 0.4 * n + 1.4 * len(shares)))
  axes = fig.subplots(len(shares), 1, squeeze=False,
                      height_ratios=[len(v) for v in shares.values()])[:, 0]
  for ax, (what, part) in zip(axes, shares.items()):
    names = list(part)
    ax.barh(names, [part[k] for k in names])
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    ax.set_xlabel(f"share of steps {what}")
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def _steps_table(rows, max_rows: int = 12) -> list[str]:
  every = max(1, -(-len(rows) // max_rows))
  shown = rows[::every] + ([rows[-1]] if (len(rows) - 1) % every else [])
  cols = ("step",) + STEP_KEYS
  out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for r in shown:
    out.append("| " + " | ".join(
        "–" if r.get(k) is None else str(r[k]) if k == "step"
        else f"{r[k]:.3f}" if k != "mismatch_kl" else f"{r[k]:.2e}"
        for k in cols) + " |")
  return out


def write(workdir, rl_name: str = "rl") -> str:
  """Writes report.md and the plots; returns the report's text."""
  work = pathlib.Path(workdir)
  lines = [f"# SWiRL run: {work}", ""]
  res = work / "eval" / "results.json"
  if res.exists():
    lines += ["## Held-out evaluation", "",
              agent_eval.table(json.loads(res.read_text())), ""]
  rows = stage2_steps(work, rl_name)
  if rows:
    _plot_steps(rows, work / "reward.png")
    rewards = [r["reward"] for r in rows]
    k = max(1, len(rewards) // 5)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    lines += ["## Stage 2 (reward.png)", "",
              f"{len(rows)} steps; mean reward over the first {k}: "
              f"{first:.3f}, over the last {k}: {last:.3f}. Per step: the "
              "reward model's P(GOOD) of the sampled actions (mean, std, "
              "percentiles), the share it calls GOOD, the sampler-trainer "
              "mismatch and the update's grad-norm.", "",
              *_steps_table(rows), ""]
  shares = judged_shares(work)
  if shares:
    _plot_shares(shares, work / "judged_steps.png")
    lines += ["## Judged steps (judged_steps.png)", "",
              "| share of steps | set | share |", "|---|---|---|"]
    lines += [f"| {what} | {n} | {v:.3f} |"
              for what, part in shares.items() for n, v in part.items()]
    lines.append("")
  text = "\n".join(lines)
  (work / "report.md").write_text(text)
  return text
