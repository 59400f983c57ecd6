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

from swirl_jax.rollout.records import read_jsonl

# Rollout statistics, logged with every step of an iteration (and once for
# an iteration whose groups were all filtered out).
_ROLLOUT_KEYS = ("reward", "void_rate", "turns", "turn_cap_rate",
                 "response_len", "rows_in_loss")


def iterations(workdir) -> list[dict]:
  """One row per iteration: its rollout statistics, the number of
  optimizer updates, and the mean and max grad-norm and the max importance
  ratio of those updates (None for an iteration with none)."""
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    raise FileNotFoundError(f"{path}: not a SimpleTIR training workdir")
  by_iter = {}
  for m in read_jsonl(str(path)):
    if "iteration" not in m:
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


def _fmt(v) -> str:
  return "–" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def curve_table(rows) -> str:
  cols = ("iteration", "reward", "void_rate", "turns", "rows_in_loss",
          "updates", "grad_norm", "ratio_max")
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
  }


def compare_table(runs: dict[str, list[dict]]) -> str:
  sums = {name: summary(rows) for name, rows in runs.items()}
  keys = list(next(iter(sums.values())))
  lines = ["| | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
  lines += [f"| {k} | " + " | ".join(_fmt(sums[n][k]) for n in runs) + " |"
            for k in keys]
  return "\n".join(lines)


def _plot(rows, path):
  fig = Figure(figsize=(6, 3.5))
  ax = fig.subplots()
  its = [r["iteration"] for r in rows]
  ax.plot(its, [r["reward"] for r in rows], marker="o", ms=3, label="reward")
  ax.plot(its, [r["void_rate"] for r in rows], marker="x", ms=3,
          label="void rate")
  ax.set_xlabel("iteration")
  ax.set_ylim(0, 1)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def write(workdir) -> str:
  """Writes report.md and reward.png into `workdir`; returns the table."""
  work = pathlib.Path(workdir)
  rows = iterations(work)
  table = curve_table(rows)
  if rows:
    _plot(rows, work / "reward.png")
  (work / "report.md").write_text(
      f"# SimpleTIR run: {work}\n\nPer iteration (reward.png):\n\n{table}\n")
  return table


def main(argv) -> None:
  if len(argv) < 2:
    raise SystemExit(__doc__)
  named = [a.split("=", 1) if "=" in a else [pathlib.Path(a).name, a]
           for a in argv[1:]]
  runs = {name: iterations(path) for name, path in named}
  if len(runs) == 1:
    print(write(named[0][1]))
    return
  text = compare_table(runs)
  for _, path in named:
    (pathlib.Path(path) / "compare.md").write_text(text + "\n")
  print(text)


if __name__ == "__main__":
  main(sys.argv)
