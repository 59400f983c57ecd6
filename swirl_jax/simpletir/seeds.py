"""SimpleTIR over several seeds (job `simpletir_seeds`): held-out accuracy
before and after GRPO, with its mean and spread, and the reward curves.

  python -m swirl_jax.main --config=configs/simpletir_demo.py:seeds=3 \
      --workdir=/tmp/simpletir_seeds

Seed s (`<workdir>/seed_<s>`, every `seed` field set to s) trains each arm
of `config.arms` ((name, dotted config key, value) triples: e.g. the void
filter on and off) from the same warm start (the first arm makes it, the
others reuse its export), then evaluates the warm-started base policy and
each arm's final policy on the held-out problems (`config.eval`: its
datasets, `limit` problems, `k` samples at `temperature`). The table
(`evaluation/seeds.py`) has each policy's avg@k / pass@k, void rate and
share of samples that run code and are right (`tool_solved_rate`), and
their paired gain over the base; `seeds_curves.png` the reward, void rate and update
grad-norm per iteration, a line per seed and arm; `seeds_heldout.png` the
held-out avg@k per seed.
"""

import json
import pathlib

from swirl_jax import distributed, viewer, warmstart
from swirl_jax.evaluation import agent_eval
from swirl_jax.evaluation import seeds as seeds_lib
from swirl_jax.simpletir import evaluate, report, train


def arms(c) -> list[tuple[str, str, object]]:
  return [tuple(a) for a in c.get("arms", ())] or [("grpo", "", None)]


def _set(c, key: str, value) -> None:
  *path, last = key.split(".")
  block = c
  for p in path:
    block = block[p]
  block[last] = value


def _eval(c, model, workdir) -> dict:
  """{metric: value} of `model` on the config's held-out problems."""
  ce = c.copy_and_resolve_references()
  ce.model = model
  # Its weights by directory: the base (warm start) has no export in
  # `workdir`, and a workdir's own warm start is not the one to load.
  ce.eval.policy = str(model.checkpoint)
  res = evaluate.run(ce, str(workdir))
  if len(res) != 1:
    raise ValueError("simpletir_seeds evaluates one held-out dataset; "
                     f"config.eval.datasets has {len(res)}")
  return next(iter(res.values()))


def run_seed(c, workdir) -> None:
  work = pathlib.Path(workdir)
  base_model, results = None, {}
  for i, (name, key, value) in enumerate(arms(c)):
    ca = c.copy_and_resolve_references()
    ca.job = "simpletir_train"
    ca.train.export_hf = True  # The trained policy, for evaluation.
    if key:
      _set(ca, key, value)
    if i and ca.get("warmstart") and ca.warmstart.enabled:
      ca.warmstart.enabled = False  # The first arm's warm start.
      ca.model = base_model
    if not (work / name / "done.json").exists():
      train.run(ca, str(work / name))
    if i == 0:
      base_model = warmstart.model_config(ca, str(work / name))
    trained = base_model.copy_and_resolve_references()
    trained.checkpoint = trained.tokenizer = str(work / name / "hf")
    results[name] = _eval(c, trained, work / name)
  results["base"] = _eval(c, base_model, work / "base")
  (work / "results.json").write_text(json.dumps(results, indent=2))


def read_seed(workdir) -> dict:
  res = json.loads((pathlib.Path(workdir) / "results.json").read_text())
  return {"base": res.pop("base"), **res}


_CURVES = (("reward (training prompts, temperature 1)", "reward"),
           ("void rate", "void_rate"),
           ("update grad-norm before clipping (max)", "grad_norm_max"))


def plot(c, workdir, per_seed: dict) -> None:
  work = pathlib.Path(workdir)
  curves = {}
  for title, key in _CURVES:
    by_line = {}
    for s in per_seed:
      for name, _, _ in arms(c):
        rows = report.iterations(work / f"seed_{s}" / name)
        label = s if len(arms(c)) == 1 else f"{s}, {name}"
        by_line[label] = [(r["iteration"], r[key]) for r in rows
                          if r.get(key) is not None]
    curves[title] = by_line
  seeds_lib.plot_curves(curves, work / "seeds_curves.png")
  metric = f"avg@{c.eval.k}"
  seeds_lib.plot_before_after(per_seed, metric,
                              ["base"] + [a[0] for a in arms(c)],
                              work / "seeds_heldout.png")


def run_heldout(c, workdir) -> dict:
  """One run in `workdir` itself (job `simpletir_heldout`, the demo
  without seeds): trains (a rerun resumes), then evaluates the base (warm
  start) and the trained policy on the held-out problems. The table (base,
  trained, and the gain) goes to heldout.md and report.md and is printed,
  its JSON as the last line."""
  work = pathlib.Path(workdir)
  ct = c.copy_and_resolve_references()
  ct.job, ct.train.export_hf = "simpletir_train", True
  if not (work / "done.json").exists():
    train.run(ct, workdir)
  results = {}
  for name in ("base", "trained"):
    ce = c.copy_and_resolve_references()
    ce.eval.policy = name
    res = evaluate.run(ce, workdir)
    if len(res) != 1:
      raise ValueError("simpletir_heldout evaluates one held-out dataset; "
                       f"config.eval.datasets has {len(res)}")
    results[name] = next(iter(res.values()))
  cols = (f"avg@{c.eval.k}", f"pass@{c.eval.k}", "void_rate",
          "tool_solved_rate")
  results["trained − base"] = {m: results["trained"][m] - results["base"][m]
                               for m in cols if m in results["base"]}
  md = (f"Held out: {c.eval.limit} problems, {c.eval.k} samples each at "
        f"temperature {c.eval.temperature}.\n\n"
        + agent_eval.table(results, cols) + "\n")
  line = warmstart.criterion_line(work)
  md += f"\n{line}\n" if line else ""
  with distributed.one_writer(f"{work} heldout") as writing:
    if writing:
      (work / "heldout.json").write_text(json.dumps(results, indent=2))
      (work / "heldout.md").write_text(md)
      with open(work / "report.md", "a", encoding="utf-8") as f:
        f.write("\n## Held out\n\n" + md)
  # The viewer again, now with the held-out answers of both policies.
  viewer.write_for_run(work)
  print(md)
  print(json.dumps(results), flush=True)
  return results


def run(c, workdir):
  k = c.eval.k
  out = seeds_lib.run(c, workdir, run_seed=run_seed, read_seed=read_seed,
                      metrics=(f"avg@{k}", f"pass@{k}", "void_rate",
                               "tool_solved_rate"))
  if out is None:  # One seed of several (only_seed).
    return None
  per_seed = {int(s): r for s, r in out["per_seed"].items()}
  plot(c, workdir, per_seed)
  _criteria(c, workdir, per_seed)
  return out


def _criteria(c, workdir, per_seed: dict) -> None:
  """Each seed's warm-start criterion (made by its first arm), one line a
  seed under the seeds.md table."""
  work, first = pathlib.Path(workdir), arms(c)[0][0]
  lines = [f"- seed {s}: {line}" for s in per_seed
           if (line := warmstart.criterion_line(work / f"seed_{s}" / first))]
  if lines:
    with open(work / "seeds.md", "a", encoding="utf-8") as f:
      f.write("\n" + "\n".join(lines) + "\n")
