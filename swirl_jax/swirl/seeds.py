"""The SWiRL pipeline over several seeds, with the mean and spread of its
held-out table (job `swirl_seeds`):

  python -m swirl_jax.main --config=configs/demo.py:seeds=3 \
      --workdir=/tmp/swirl_demo_seeds

Seed s runs the whole pipeline in `<workdir>/seed_<s>` with every `seed`
field of the config set to s (what `get_config(seed=s)` gives); see
`evaluation/seeds.py` for resuming and the table (mean, sample std, min
and max per policy and metric, and each policy's paired gain over the
base). `config.rl_filters` (optional) adds a stage 2 run per filter
strategy on the seed's same stage 1 (`rl_<strategy>`, beside the
pipeline's own `rl`, which uses `filter.strategy`), all evaluated
together. Plots in the workdir: `seeds_reward.png` (stage 2's reward per
step, a line per seed) and `seeds_heldout.png` (held-out accuracy of each
policy, a line per seed).
"""

import pathlib

from swirl_jax.evaluation import agent_eval
from swirl_jax.evaluation import seeds as seeds_lib
from swirl_jax.swirl import jobs, report

METRICS = ("accuracy", "process_correctness", "void_rate")
_LAST = ("eval", "report")  # Stages that run after every arm is trained.


def arms(c) -> list[tuple[str, str]]:
  """(policy name, filter strategy) of every stage 2 run of a seed."""
  out = [("rl", c.filter.strategy)] if "rl" in _stages(c) else []
  out += [(f"rl_{f}", f) for f in c.get("rl_filters", ())
          if f != c.filter.strategy or not out]
  return out


def _stages(c) -> list[str]:
  return jobs._stage_list(c.stages)  # pylint: disable=protected-access


def run_seed(c, workdir) -> None:
  """The pipeline, each extra filter's stage 2, then eval and report."""
  stages = _stages(c)
  first = c.copy_and_resolve_references()
  first.stages = tuple(s for s in stages if s not in _LAST)
  jobs.run_pipeline(first, workdir)
  for name, strategy in arms(c)[1:] if "rl" in stages else arms(c):
    arm = c.copy_and_resolve_references()
    arm.stages, arm.rl_name = ("rl",), name
    arm.filter.strategy = strategy
    jobs.run_pipeline(arm, workdir)
  last = c.copy_and_resolve_references()
  last.stages = tuple(s for s in stages if s in _LAST)
  trained = [n for n, _ in arms(c)] + (["sft"] if "sft" in stages else [])
  last.eval.policies = tuple(dict.fromkeys(
      [p for p in c.eval.policies if p == "base"] + trained))
  if last.stages:
    jobs.run_pipeline(last, workdir)


def read_seed(workdir) -> dict:
  res = agent_eval.read(str(pathlib.Path(workdir) / "eval"))
  if not res:
    raise FileNotFoundError(f"{workdir}/eval/results.json: missing; the "
                            "config's stages must include eval")
  return res


def plot(workdir, per_seed: dict, policies) -> None:
  work = pathlib.Path(workdir)
  curves = {"stage 2 reward (mean over the step's samples)": {
      s: [(r["step"], r["reward"])
          for r in report.stage2_steps(work / f"seed_{s}")]
      for s in per_seed}}
  if any(curves["stage 2 reward (mean over the step's samples)"].values()):
    seeds_lib.plot_curves(curves, work / "seeds_reward.png", xlabel="step")
  shown = [p for p in policies if all(p in r for r in per_seed.values())]
  seeds_lib.plot_before_after(per_seed, "accuracy", shown,
                              work / "seeds_heldout.png")


def run(c, workdir):
  """The seeds (`evaluation.seeds.run`), then the plots."""
  out = seeds_lib.run(c, workdir, run_seed=lambda cs, w: run_seed(
      _pipeline(cs), w), read_seed=read_seed, metrics=METRICS)
  if out is None:  # One seed of several (only_seed).
    return None
  per_seed = {int(s): r for s, r in out["per_seed"].items()}
  plot(workdir, per_seed, list(next(iter(per_seed.values()))))
  return out


def _pipeline(c):
  c.job = "swirl_pipeline"
  return c
