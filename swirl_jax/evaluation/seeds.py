"""A run over several seeds: the mean and spread of its results, and plots.

The methods' seed jobs (`swirl/seeds.py`, `simpletir/seeds.py`) run seed s
in `<workdir>/seed_<s>` with every `seed` field of the config set to s;
a seed whose run finished (`seed_<s>/done.json`) is not run again, so a
killed driver resumes. Then `seeds.{json,md}` in the workdir hold, per
policy and metric, the mean, sample std, min and max over the seeds, and
for every policy but the base its paired gain over the base (the mean and
spread of the per-seed differences, which the seeds' shared variation,
e.g. a stronger warm start, leaves out); `config.contrasts` ("a-b", ...)
adds the same paired difference between two trained policies (e.g.
"rl-sft": SWiRL against SFT on one seed's same data). The JSON is
printed as the last line. Each seed's rollout viewer
(`seed_<s>/rollouts.html`: its runs' trajectories and every policy's
held-out answers, swirl_jax/viewer) is built with the table, which links
it from seeds.md.
"""

import json
import pathlib
import subprocess
import time
from typing import Callable, Sequence

import ml_collections
import numpy as np
from absl import logging
from matplotlib.figure import Figure  # No pyplot: no global backend.

from swirl_jax import viewer

DIFF = " − "  # In a row's name: a paired difference, "a − b".


def with_seed(c, seed: int) -> ml_collections.ConfigDict:
  """A copy of `c` with every field named `seed` set to `seed`."""
  out = ml_collections.ConfigDict(c.to_dict())

  def walk(d):
    for k, v in d.items():
      if isinstance(v, ml_collections.ConfigDict):
        walk(v)
      elif k == "seed":
        d[k] = seed
  walk(out)
  return out


def _stats(v) -> dict:
  v = np.asarray(v, np.float64)
  std = float(v.std(ddof=1)) if len(v) > 1 else 0.0
  return dict(mean=float(v.mean()), std=std, se=std / float(np.sqrt(len(v))),
              min=float(v.min()), max=float(v.max()), n=len(v))


def aggregate(per_seed: dict[int, dict], metrics: Sequence[str],
              base: str | None = "base", contrasts: Sequence[str] = ()
              ) -> dict:
  """{policy: {metric: {mean, std, se, min, max, n}}} over the seeds'
  results ({policy: {metric: value}} each); std is the sample std (ddof
  1; 0 for one seed), se its standard error. With a `base` policy, each
  other policy P also gets 'P − base': the same statistics of its
  per-seed difference; each contrast "a-b" gets 'a − b'."""
  runs = list(per_seed.values())
  policies = [p for p in runs[0] if all(p in r for r in runs)]
  out = {}
  for p in policies:
    out[p] = {m: _stats([r[p][m] for r in runs]) for m in metrics
              if all(m in r[p] for r in runs)}
  pairs = [(p, base) for p in policies if base in policies and p != base]
  for spec in contrasts:
    a, sep, b = spec.partition("-")
    if not sep or a not in policies or b not in policies:
      raise ValueError(f"contrast {spec!r}: 'a-b' of two policies every "
                       f"seed has ({', '.join(policies)})")
    pairs.append((a, b))
  for a, b in pairs:
    out[a + DIFF + b] = {m: _stats([r[a][m] - r[b][m] for r in runs])
                         for m in out[a] if m in out[b]}
  return out


def exceeds_spread(s: dict) -> bool:
  """Whether a gain's mean is larger than its spread over the seeds (its
  sample std) and every seed's difference has the mean's sign; never for
  one seed, which has no spread."""
  same_sign = s["min"] > 0 if s["mean"] > 0 else s["max"] < 0
  return s.get("n", 2) > 1 and abs(s["mean"]) > s["std"] and same_sign


def table(agg: dict, metrics: Sequence[str]) -> str:
  """Markdown: `mean ± std (min–max)` per policy and metric; a paired
  difference's row marks a mean beyond its spread with a '*'."""
  lines = ["| policy | " + " | ".join(metrics) + " |",
           "|---" * (len(metrics) + 1) + "|"]
  for p, ms in agg.items():
    cells = []
    for m in metrics:
      s = ms.get(m)
      if not s:
        cells.append("-")
        continue
      mark = "*" if DIFF in p and exceeds_spread(s) else ""
      sign = "+" if DIFF in p else ""
      cells.append(f"{s['mean']:{sign}.3f}{mark} ± {s['std']:.3f} "
                   f"({s['min']:{sign}.3f}–{s['max']:{sign}.3f})")
    lines.append(f"| {p} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def run(c, workdir, *, run_seed: Callable, read_seed: Callable,
        metrics: Sequence[str], base: str | None = "base",
        note: str = "") -> dict:
  """Runs `run_seed(config, seed_workdir)` for seeds c.first_seed ..
  c.first_seed + c.seeds - 1 (skipping finished ones), reads each with
  `read_seed(seed_workdir)` -> {policy: {metric: value}}, writes
  seeds.{json,md} over every finished seed in the workdir; returns the
  JSON.

  A table extends: a later run with another `first_seed` in the same
  workdir adds its seeds, and the table covers them all (seed_<s> of the
  earlier runs are read, not rerun). `c.only_seed` >= 0 runs that seed
  alone and returns None (seeds as separate processes or jobs; a last run
  without it writes the table).
  """
  n, first = int(c.seeds), int(c.get("first_seed", 0))
  if n < 1:
    raise ValueError(f"seeds {n}: a seeds job needs seeds >= 1")
  if first < 0:
    raise ValueError(f"first_seed {first}: must be >= 0")
  mine = range(first, first + n)
  only = int(c.get("only_seed", -1))
  if only >= 0 and only not in mine:
    raise ValueError(f"only_seed {only}: not one of seeds {first}.."
                     f"{first + n - 1}")
  work, per_seed, done = pathlib.Path(workdir), {}, {}
  for s in mine if only < 0 else (only,):
    sub = work / f"seed_{s}"
    if not (sub / "done.json").exists():
      logging.info("seed %d (%d of %d): %s", s, s - first + 1, n, sub)
      cs = with_seed(c, s)
      cs.seeds, cs.only_seed = 0, -1
      t0 = time.time()
      run_seed(cs, str(sub))
      (sub / "done.json").write_text(json.dumps(
          {"seed": s, "wall_s": time.time() - t0, "commit": commit()}))
    per_seed[s] = read_seed(str(sub))
    done[s] = json.loads((sub / "done.json").read_text())
  if only >= 0:
    return None
  for s in sorted(_finished(work) - set(per_seed)):  # Earlier runs' seeds.
    per_seed[s] = read_seed(str(work / f"seed_{s}"))
    done[s] = json.loads((work / f"seed_{s}" / "done.json").read_text())
  per_seed, done = dict(sorted(per_seed.items())), dict(sorted(done.items()))
  n = len(per_seed)
  agg = aggregate(per_seed, metrics, base, tuple(c.get("contrasts", ())))
  runs = {str(s): dict(wall_s=d.get("wall_s"), commit=d.get("commit"))
          for s, d in done.items()}
  out = dict(seeds=n, policies=agg,
             per_seed={str(s): r for s, r in per_seed.items()}, runs=runs)
  (work / "seeds.json").write_text(json.dumps(out, indent=2))
  md = table(agg, metrics)
  (work / "seeds.md").write_text(
      f"Results over {n} seeds: mean ± sample std (min–max); a paired "
      f"difference's '*': its mean exceeds its spread.{note}\n\n" + md
      + "\n\n" + runs_line(runs) + "\n" + viewer_links(work, per_seed))
  print(md)
  print(json.dumps(out), flush=True)
  return out


def viewer_links(work: pathlib.Path, seeds) -> str:
  """Builds each seed's rollout viewer (seed_<s>/rollouts.html: its runs'
  training rollouts and every policy's held-out answers); returns the
  seeds.md line linking those that exist ('' if none)."""
  for s in seeds:
    viewer.write_for_run(work / f"seed_{s}")
  links = [f"[seed {s}](seed_{s}/rollouts.html)" for s in seeds
           if (work / f"seed_{s}" / "rollouts.html").exists()]
  return f"\nRollout viewers: {', '.join(links)}.\n" if links else ""


def _finished(work: pathlib.Path) -> set[int]:
  """Seeds with a finished run in `work` (seed_<s>/done.json)."""
  out = set()
  for d in work.glob("seed_*/done.json"):
    tail = d.parent.name[len("seed_"):]
    if tail.isdigit():
      out.add(int(tail))
  return out


def commit() -> str:
  """The checkout's commit (`+dirty` with uncommitted changes to tracked
  files), or '' outside a git checkout."""
  root = pathlib.Path(__file__).resolve().parents[2]
  git = lambda *a: subprocess.run(["git", "-C", str(root), *a],
                                  capture_output=True, text=True,
                                  check=False)
  head = git("rev-parse", "--short", "HEAD")
  if head.returncode:
    return ""
  dirty = git("status", "--porcelain", "--untracked-files=no").stdout
  return head.stdout.strip() + ("+dirty" if dirty.strip() else "")


def runs_line(runs: dict) -> str:
  """'Seed s: M min at commit C', per seed, as one line."""
  parts = []
  for s, r in runs.items():
    wall = "?" if r.get("wall_s") is None else f"{r['wall_s'] / 60:.1f} min"
    parts.append(f"seed {s}: {wall} at {r.get('commit') or '?'}")
  return "Runs: " + "; ".join(parts) + "."


def plot_curves(curves: dict[str, dict[int, list[tuple[float, float]]]],
                path, xlabel: str = "iteration") -> None:
  """One panel per quantity ({title: {seed: [(x, y), ...]}}), a line per
  seed."""
  fig = Figure(figsize=(5.5, 2.6 * len(curves)))
  axes = fig.subplots(len(curves), 1, squeeze=False)[:, 0]
  for ax, (title, by_seed) in zip(axes, curves.items()):
    for s, pts in sorted(by_seed.items()):
      if pts:
        ax.plot(*zip(*pts), marker="o", ms=2, lw=1, label=f"seed {s}")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def plot_before_after(per_seed: dict[int, dict], metric: str,
                      policies: Sequence[str], path,
                      title: str = "") -> None:
  """`metric` of each policy, a line per seed joining its policies."""
  fig = Figure(figsize=(1.2 + 1.1 * len(policies), 3))
  ax = fig.subplots()
  x = np.arange(len(policies))
  for s, r in sorted(per_seed.items()):
    ax.plot(x, [r[p][metric] for p in policies], marker="o", label=f"seed {s}")
  ax.set_xticks(x, policies, fontsize=8)
  ax.set_ylabel(metric)
  ax.set_title(title or f"held-out {metric}", fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
