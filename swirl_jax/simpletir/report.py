r"""SimpleTIR run summaries, from the files a training run writes.

  python -m swirl_jax.simpletir.report /tmp/simpletir_cpu
  python -m swirl_jax.simpletir.report void_on=/tmp/st_on void_off=/tmp/st_off

One directory: the reward curve per iteration (`report.md`, `reward.png` in
that directory, and the table on stdout). Several, named `name=dir`: the
ablation table side by side (reward, void rate, and the update statistics
the void filter is meant to tame: grad-norm before clipping and the max
importance ratio), printed and written to each run's `compare.md`.

Reads only `metrics.jsonl`, so it also runs on a copied or unfinished run.
"""

import pathlib
import sys

import numpy as np
from matplotlib.figure import Figure  # No pyplot: no global backend.
from matplotlib.ticker import MaxNLocator

from swirl_jax import jsonl
from swirl_jax.rollout.records import read_jsonl

# Rollout statistics and diagnostics, logged with every step of an
# iteration (and once for an iteration whose groups were all filtered out):
# token probabilities of void vs other rollouts, tool use, the split
# gradient norms (every `void_grad_every` iterations) and the batch's
# sampler-trainer mismatch (swirl_jax/simpletir/train.py).
_ROLLOUT_KEYS = ("reward", "void_rate", "turns", "turn_cap_rate",
                 "response_len", "rows_in_loss", "tool_call_rate",
                 "tool_calls", "single_turn_rate", "low_p_share_void",
                 "low_p_share_nonvoid", "min_logp_void", "min_logp_nonvoid",
                 "grad_norm_void", "grad_norm_kept", "mismatch_abs_mean",
                 "mismatch_abs_max", "mismatch_kl", "mismatch_out_frac")


def iterations(workdir) -> list[dict]:
  """One row per iteration: its rollout statistics, the number of
  optimizer updates, and the mean and max grad-norm and the max importance
  ratio of those updates (None for an iteration with none)."""
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    raise FileNotFoundError(f"{path}: not a SimpleTIR training workdir")
  by_iter = {}
  for m in read_jsonl(str(path)):
    if "iteration" not in m or "val_iteration" in m:  # Validations: apart.
      continue
    by_iter.setdefault(int(m["iteration"]), []).append(m)
  rows = []
  for it in sorted(by_iter):
    ms = by_iter[it]
    updates = [m for m in ms if not m.get("skipped_batch")
               and m.get("grad_norm") is not None]
    row = {"iteration": it, "updates": len(updates)}
    row.update({k: ms[0].get(k) for k in _ROLLOUT_KEYS})
    norms = [m["grad_norm"] for m in updates]
    row["grad_norm"] = float(np.mean(norms)) if norms else None
    row["grad_norm_max"] = max(norms) if norms else None
    ratios = [m["ratio_max"] for m in updates
              if m.get("ratio_max") is not None]
    row["ratio_max"] = max(ratios) if ratios else None
    rows.append(row)
  return rows


def validations(workdir) -> list[dict]:
  """The training job's validation records, in order: `val_iteration`
  (the policy after that many iterations) and its `val_<set>_avg@k` /
  `pass@k` figures."""
  path = pathlib.Path(workdir) / "metrics.jsonl"
  return [m for m in read_jsonl(str(path)) if "val_iteration" in m] \
      if path.exists() else []


def _val_keys(vals) -> list[str]:
  return sorted({k for v in vals for k in v
                 if k.startswith("val_") and k != "val_iteration"})


def validation_table(vals) -> str:
  keys = _val_keys(vals)
  lines = ["| iteration | " + " | ".join(keys) + " |",
           "|" + "---|" * (len(keys) + 1)]
  lines += [f"| {int(v['val_iteration'])} | " + " | ".join(
      _fmt(v.get(k)) for k in keys) + " |" for v in vals]
  return "\n".join(lines)


def _fmt(v) -> str:
  return "–" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def curve_table(rows) -> str:
  cols = ("iteration", "reward", "void_rate", "turns", "tool_call_rate",
          "rows_in_loss", "updates", "grad_norm", "ratio_max",
          "low_p_share_void", "low_p_share_nonvoid", "min_logp_void",
          "min_logp_nonvoid", "grad_norm_void", "grad_norm_kept",
          "mismatch_kl")
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  lines += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |"
            for r in rows]
  return "\n".join(lines)


def summary(rows) -> dict:
  """Run-level figures for the ablation table."""
  def stats(key, fn):
    xs = [r[key] for r in rows if r.get(key) is not None]
    return float(fn(xs)) if xs else None
  return {
      "iterations": len(rows),
      "updates": sum(r["updates"] for r in rows),
      "reward_mean": stats("reward", np.mean),
      "void_rate_mean": stats("void_rate", np.mean),
      "grad_norm_mean": stats("grad_norm", np.mean),
      "grad_norm_max": stats("grad_norm_max", np.max),
      "ratio_max_mean": stats("ratio_max", np.mean),
      "ratio_max_max": stats("ratio_max", np.max),
      "turns_mean": stats("turns", np.mean),
      "tool_call_rate_mean": stats("tool_call_rate", np.mean),
      "low_p_share_void_mean": stats("low_p_share_void", np.mean),
      "low_p_share_nonvoid_mean": stats("low_p_share_nonvoid", np.mean),
      "grad_norm_void_mean": stats("grad_norm_void", np.mean),
      "grad_norm_kept_mean": stats("grad_norm_kept", np.mean),
      "mismatch_kl_mean": stats("mismatch_kl", np.mean),
  }


def compare_table(runs: dict[str, list[dict]]) -> str:
  sums = {name: summary(rows) for name, rows in runs.items()}
  keys = list(next(iter(sums.values())))
  lines = ["| | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
  lines += [f"| {k} | " + " | ".join(_fmt(sums[n][k]) for n in runs) + " |"
            for k in keys]
  return "\n".join(lines)


# One quantity per panel: (title, y-axis label, {label: key}); a panel
# plots the keys the run logged.
_PANELS = (
    ("reward", "mean reward", {"reward": "reward"}),
    ("void rate", "share of rollouts", {"void rate": "void_rate"}),
    ("turns per trajectory", "turns", {"turns": "turns"}),
    ("share of turns calling a tool", "share", {"tool calls":
                                                "tool_call_rate"}),
    ("share of tokens with p < 1e-3", "share",
     {"void": "low_p_share_void", "non-void": "low_p_share_nonvoid"}),
    ("grad-norm (before clipping)", "L2 norm",
     {"update": "grad_norm", "void rows": "grad_norm_void",
      "kept rows": "grad_norm_kept"}),
    ("sampler-trainer k3 KL", "KL (nats)", {"mismatch": "mismatch_kl"}),
)
# Rates and shares: a fixed [0, 1] range, with 0 and 1 off the frame.
_UNIT = {"reward", "void_rate", "tool_call_rate", "low_p_share_void",
         "low_p_share_nonvoid"}


def _y_range(ax, keys, values) -> None:
  """[0, 1] for rates and shares, else from 0 to a margin above the
  maximum: a constant series reads as its value (no 0.96-1.04 range)."""
  if all(k in _UNIT or k.startswith("val_") for k in keys):
    ax.set_ylim(-0.04, 1.04)
    return
  lo, hi = min(min(values), 0.0), max(max(values), 0.0)
  span = (hi - lo) or 1.0  # All zero: 0 to 1.
  ax.set_ylim(lo - 0.04 * span, hi + 0.08 * span)  # 0 off the frame.


def _plot(rows, path, vals=()):
  panels = [p for p in _PANELS if any(
      r.get(k) is not None for r in rows for k in p[2].values())]
  if vals:  # Held-out avg@k / pass@k, at the iterations validated.
    rows = list(rows) + [{"iteration": int(v["val_iteration"]), **v}
                         for v in vals]
    panels.append(("validation (held out)", "accuracy",
                   {k[len("val_"):]: k for k in _val_keys(vals)}))
  ncol = 2
  nrow = -(-len(panels) // ncol)
  fig = Figure(figsize=(9, 2.6 * nrow))
  axes = fig.subplots(nrow, ncol, squeeze=False).reshape(-1)
  for ax, (title, ylabel, keys) in zip(axes, panels):
    drawn, values = 0, []
    for label, key in keys.items():
      pts = [(r["iteration"], r[key]) for r in rows
             if r.get(key) is not None]
      if pts:
        ax.plot(*zip(*pts), marker="o", ms=3, label=label)
        drawn, values = drawn + 1, values + [v for _, v in pts]
    _y_range(ax, keys.values(), values)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("iteration (metrics.jsonl)", fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if drawn > 1:
      ax.legend(fontsize=7)
  for ax in axes[len(panels):]:
    ax.set_visible(False)
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def write(workdir) -> str:
  """Writes report.md and reward.png into `workdir`; returns the table."""
  work = pathlib.Path(workdir)
  rows, vals = iterations(work), validations(work)
  table = curve_table(rows)
  if rows:
    _plot(rows, work / "reward.png", vals)
  val = (f"\nValidation (held out, the policy after each iteration "
         f"count):\n\n{validation_table(vals)}\n" if vals else "")
  (work / "report.md").write_text(
      f"# SimpleTIR run: {work}\n\nPer iteration (reward.png):\n\n{table}\n"
      + val)
  return table + (f"\n\n{validation_table(vals)}" if vals else "")


def main(argv) -> None:
  if len(argv) < 2:
    raise SystemExit(__doc__)
  named = [a.split("=", 1) if "=" in a else [pathlib.Path(a).name, a]
           for a in argv[1:]]
  try:
    runs = {name: iterations(path) for name, path in named}
  except (FileNotFoundError, jsonl.FormatError) as e:  # One line, status 2.
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(2) from None
  if len(runs) == 1:
    print(write(named[0][1]))
    return
  text = compare_table(runs)
  for _, path in named:
    (pathlib.Path(path) / "compare.md").write_text(text + "\n")
  print(text)


if __name__ == "__main__":
  main(sys.argv)
