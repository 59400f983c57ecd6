"""SimpleTIR evaluation: avg@k and pass@k on MATH500, AIME 2024/2025, GSM8K.

10 turns at evaluation (5 in training), k samples per problem.
"""

import json
import pathlib

from absl import logging

from swirl_jax import distributed
from swirl_jax.evaluation import agent_eval
from swirl_jax.models import loading
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.records import Trajectory
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.tasks import checkers
from swirl_jax.tasks import datasets
from swirl_jax.tools import registry


def run(config, workdir: str) -> dict:
  c = config
  out = pathlib.Path(workdir) / "eval"
  cfg, params, tok = loading.load_policy(c.model, seed=c.seed)
  tools = registry.from_config(c.tools)
  sampler = Sampler(params, cfg, tok, SamplerConfig.from_config(c.sampler))
  e = c.eval
  rc = dict(c.rollout, max_turns=e.max_turns, temperature=e.temperature,
            seed=c.seed)
  loop = engine_lib.RolloutEngine(
      sampler, tok, tools, turns.RolloutConfig.from_config(rc),
      engine_lib.EngineConfig.from_config(c.get("engine") or {}))
  results, trajs = {}, {}
  for spec in e.datasets:
    name, _, split = spec.partition(":")
    tasks = datasets.load_tasks(name, split or None,
                                c.data.get("data_dir") or None,
                                e.get("limit") or None)
    ts = distributed.run_shared(  # Each host its share; all get all.
        lambda pairs: _scored(loop.run_pairs(pairs), pairs),
        [(t, k) for t in tasks for k in range(e.k)],
        to_text=Trajectory.to_json, from_text=Trajectory.from_json)
    results[spec] = {**agent_eval.pass_at_k(ts, e.k),
                     **turns.response_stats(ts), "n": float(len(tasks))}
    trajs[spec.replace(":", "_")] = ts
    logging.info("%s: %s", spec, results[spec])
  with distributed.one_writer(f"{out}") as writing:
    if writing:
      agent_eval.write(str(out), results, trajs)
      (out / "summary.json").write_text(json.dumps(results, indent=2))
  cols = (f"avg@{e.k}", f"pass@{e.k}", "turns", "void_rate")
  print(agent_eval.table(results, cols))
  return results


def _scored(trajs, pairs):
  checkers.score_trajectories(trajs, [t for t, _ in pairs])
  return trajs
