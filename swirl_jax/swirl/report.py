"""A run's summary: report.md and plots, from what the stages wrote.

  report.md          the evaluation table, the filter report, and per
                     stage 2 step the reward distribution (mean, std,
                     10/50/90th percentiles), the share of sampled actions
                     the reward model calls GOOD (their process
                     correctness) and the sampler-trainer mismatch
  reward.png         those per step (numbered as in metrics.jsonl and
                     TensorBoard), one quantity per panel, every axis
                     labelled, fixed ranges for rewards and shares
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
  """One row per stage 2 optimizer step, numbered as in metrics.jsonl and
  TensorBoard (`step`); a step's reward figures are its iteration's."""
  path = work / rl_name / "metrics.jsonl"
  rows = {}
  for r in read_jsonl(str(path)) if path.exists() else []:
    if r.get("reward") is not None:
      rows[int(r["step"])] = dict({k: r.get(k) for k in STEP_KEYS},
                                  step=int(r["step"]))
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


# (key, title, y-axis label); a panel is drawn when the run logged its key.
_PANELS = (("reward", "reward of the sampled actions", "P(GOOD)"),
           ("reward_good_share", "share of sampled actions judged GOOD",
            "share"),
           ("mismatch_kl", "sampler-trainer k3 KL", "KL (nats)"),
           ("grad_norm", "grad-norm before clipping", "L2 norm"))
_UNIT_RANGE = (-0.04, 1.04)  # Rewards and shares: 0 and 1 off the frame.


def _y_range(ax, key: str, values) -> None:
  """A fixed range: [0, 1] for rewards and shares, else from 0 (or the
  minimum) to a margin above the maximum, so a constant series reads as
  the value it is, not as noise around it (matplotlib's 0.96-1.04)."""
  if key.startswith("reward"):
    ax.set_ylim(*_UNIT_RANGE)
    return
  lo, hi = min(min(values), 0.0), max(max(values), 0.0)
  span = (hi - lo) or 1.0  # All zero: 0 to 1.
  ax.set_ylim(lo - 0.04 * span, hi + 0.08 * span)  # 0 off the frame.


def _reward_panel(ax, pts, x) -> None:
  """Mean, median and mean ± std (clipped to [0, 1]): with 0/1 rewards the
  10th/90th percentiles flip between 0 and 1 (the table keeps them)."""
  mean = [r["reward"] for r in pts]
  ax.plot(x, mean, marker="o", ms=3, label="mean")
  if all(r.get("reward_std") is not None for r in pts):
    std = [r["reward_std"] for r in pts]
    ax.fill_between(x, [max(0.0, m - s) for m, s in zip(mean, std)],
                    [min(1.0, m + s) for m, s in zip(mean, std)],
                    alpha=0.2, label="mean ± std")
  if all(r.get("reward_p50") is not None for r in pts):
    ax.plot(x, [r["reward_p50"] for r in pts], ls="--", marker="s", ms=3,
            lw=1, label="median")
  ax.legend(fontsize=7, loc="best")


def _plot_steps(rows, path):
  panels = [p for p in _PANELS if any(r.get(p[0]) is not None for r in rows)]
  fig = Figure(figsize=(6, 2.4 * len(panels)))
  axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
  for ax, (key, title, ylabel) in zip(axes, panels):
    pts = [r for r in rows if r.get(key) is not None]
    x = [r["step"] for r in pts]
    if key == "reward":
      _reward_panel(ax, pts, x)
    else:
      ax.plot(x, [r[key] for r in pts], marker="o", ms=3)
    _y_range(ax, key, [r[key] for r in pts])
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("stage 2 step (metrics.jsonl, TensorBoard)", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
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
  labels = {"judged GOOD": "set of steps", "kept": "filter"}
  for ax, (what, part) in zip(axes, shares.items()):
    names = list(part)
    bars = ax.barh(names, [part[k] for k in names])
    ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)
    ax.set_xlim(0, 1.12)  # Room for a label beside a bar at 1.
    ax.invert_yaxis()
    ax.set_xlabel(f"share of steps {what}", fontsize=8)
    ax.set_ylabel(labels.get(what, what), fontsize=8)
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
