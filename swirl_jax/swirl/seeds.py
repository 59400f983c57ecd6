"""The SWiRL pipeline over several seeds, with the mean and spread of its
held-out table (job `swirl_seeds`):

  python -m swirl_jax.main --config=configs/demo.py:seeds=3 \
      --workdir=/tmp/swirl_demo_seeds

Seed s runs the whole pipeline in `<workdir>/seed_<s>` with every `seed`
field of the config set to s (what `get_config(seed=s)` gives); a seed whose
run finished (`seed_<s>/done.json`) is not run again, so a killed driver
resumes. Then `seeds.{json,md}` in the workdir hold, per policy and metric,
the mean, sample std, min and max over the seeds, and the JSON is printed
as the last line.
"""

import json
import pathlib

import ml_collections
import numpy as np
from absl import logging

from swirl_jax.evaluation import agent_eval
from swirl_jax.swirl import jobs

METRICS = ("accuracy", "process_correctness", "void_rate")


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


def aggregate(per_seed: dict[int, dict]) -> dict:
  """{policy: {metric: {mean, std, min, max, n}}} over the seeds' eval
  results; std is the sample std (ddof 1; 0 for one seed)."""
  policies = [p for p in next(iter(per_seed.values()))
              if all(p in r for r in per_seed.values())]
  out = {}
  for p in policies:
    out[p] = {}
    for m in METRICS:
      v = np.array([r[p][m] for r in per_seed.values() if m in r[p]])
      if len(v):
        out[p][m] = dict(mean=float(v.mean()),
                         std=float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                         min=float(v.min()), max=float(v.max()), n=len(v))
  return out


def table(agg: dict) -> str:
  """Markdown: `mean ± std (min–max)` per policy and metric."""
  lines = ["| policy | " + " | ".join(METRICS) + " |",
           "|---" * (len(METRICS) + 1) + "|"]
  for p, ms in agg.items():
    cells = [f"{s['mean']:.3f} ± {s['std']:.3f} ({s['min']:.3f}–"
             f"{s['max']:.3f})" if (s := ms.get(m)) else "-" for m in METRICS]
    lines.append(f"| {p} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def run(c, workdir):
  n = int(c.seeds)
  if n < 1:
    raise ValueError(f"seeds {n}: the swirl_seeds job needs seeds >= 1")
  work, per_seed = pathlib.Path(workdir), {}
  for s in range(n):
    sub = work / f"seed_{s}"
    if not (sub / "done.json").exists():
      logging.info("seed %d of %d: %s", s + 1, n, sub)
      cs = with_seed(c, s)
      cs.job, cs.seeds = "swirl_pipeline", 0
      jobs.run_pipeline(cs, str(sub))
      (sub / "done.json").write_text(json.dumps({"seed": s}))
    per_seed[s] = agent_eval.read(str(sub / "eval"))
    if not per_seed[s]:
      raise FileNotFoundError(f"{sub}/eval/results.json: missing; the "
                              "config's stages must include eval")
  agg = aggregate(per_seed)
  out = dict(seeds=n, policies=agg)
  (work / "seeds.json").write_text(json.dumps(out, indent=2))
  md = table(agg)
  (work / "seeds.md").write_text(
      f"Held-out results over {n} seeds: mean ± sample std (min–max).\n\n"
      + md + "\n")
  print(md)
  print(json.dumps(out), flush=True)
  return out
