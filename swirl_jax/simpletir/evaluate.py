"""SimpleTIR evaluation: avg@k and pass@k, as SimpleTIR's code evaluates.

Job `simpletir_eval` evaluates the policy `eval.policy` names:

  ''       the workdir's trained policy, `<workdir>/hf` (the training job
           exports it at the end and at every validation)
  'base'   the policy training started from: `config.model`, or the CPU
           runs' warm start
  a path   any Hugging Face directory

and refuses in one line (exit 2) when there are no weights to load, rather
than evaluating a randomly initialised model. Each held-out set gets k
samples a problem (10 turns at evaluation, 5 in training) with the
sampling and token budget of `config.eval`; results go to
`<workdir>/eval/<policy>/` (`results.json` and `results.md`: avg@k, pass@k
and the rollout statistics per set; `summary.json`: the same with the
policy's name and the weights it loaded; trajectories as JSONL), and
`<workdir>/eval/results.{json,md}` hold every policy evaluated in the
workdir, a row per (policy, set), with the weights each loaded.

`evaluate` is also the training job's validation (swirl_jax/simpletir/
train.py), with the training sampler and the `config.validation` block.
"""

import json
import pathlib

import ml_collections
import numpy as np
from absl import logging

from swirl_jax import distributed, errors, warmstart
from swirl_jax.evaluation import agent_eval
from swirl_jax.models import loading
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.records import Trajectory
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.tasks import checkers
from swirl_jax.tasks import datasets
from swirl_jax.tools import registry

# What `config.eval` / `config.validation` hold besides the datasets.
_ROLLOUT_KEYS = ("max_turns", "temperature", "top_p", "max_new_tokens",
                 "max_response_tokens")


class NoPolicy(errors.UserError, FileNotFoundError):
  """No weights to evaluate (one line naming what to run)."""


def _from_dir(c, path: pathlib.Path) -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict(c.model.to_dict())
  m.checkpoint = m.tokenizer = str(path)
  return m


def policy(c, workdir) -> tuple[str, ml_collections.ConfigDict]:
  """(name, model block) of the policy `c.eval.policy` names."""
  name, work = c.eval.policy, pathlib.Path(workdir)
  if name in ("", "trained"):
    hf = work / "hf"
    if not (hf / "config.json").is_file():
      raise NoPolicy(
          f"{hf}: no trained policy to evaluate; train one in this workdir "
          f"first (the same command with --config.job=simpletir_train), or "
          "pick one with --config.eval.policy=base or =DIR (a Hugging Face "
          "directory)")
    return "trained", _from_dir(c, hf)
  if name == "base":
    m = warmstart.model_config(c, workdir)
    if c.warmstart.enabled and \
        not (warmstart.hf_dir(workdir) / "config.json").is_file():
      raise NoPolicy(f"{warmstart.hf_dir(workdir)}: no base policy (the "
                     "warm start); run the training job in this workdir "
                     "first")
    if not m.checkpoint:
      raise NoPolicy(
          "eval.policy=base: model.checkpoint is empty, so there are no "
          "weights to load (random init); set the config's checkpoint "
          "(:checkpoint=DIR) or --config.eval.policy=DIR")
    return "base", m
  path = pathlib.Path(name)
  if not (path / "config.json").is_file():
    raise NoPolicy(f"eval.policy={name!r}: not a Hugging Face directory (no "
                   "config.json); valid: '' (the workdir's export), 'base', "
                   "or a directory")
  # Named after its run: <run>/hf -> <run>.
  label = path.resolve().parent.name if path.name == "hf" else path.name
  return label or "policy", _from_dir(c, path)


def rollout_config(c, block) -> turns.RolloutConfig:
  """The training rollout with an eval/validation block's sampling."""
  rc = dict(c.rollout, seed=c.seed)
  rc.update({k: block[k] for k in _ROLLOUT_KEYS})
  return turns.RolloutConfig.from_config(rc)


def check_specs(specs) -> None:
  """ConfigError for a dataset spec ('name[:split]') no loader reads."""
  for spec in specs:
    name, _, split = spec.partition(":")
    datasets.check(name, split or None)


def token_logp(trajs) -> float:
  """Mean log-prob of the sampled action tokens (the policy's own)."""
  lps = [lp for t in trajs for turn in t.turns for lp in turn.action_logprobs]
  return float(np.mean(lps)) if lps else 0.0


def evaluate(engine, specs, *, k: int, data_dir: str | None,
             limit: int = 0) -> tuple[dict, dict]:
  """(results, trajectories) by dataset spec ('name[:split]'): k samples a
  task, each host its share; avg@k, pass@k and the rollout statistics."""
  results, trajs = {}, {}
  for spec in specs:
    name, _, split = spec.partition(":")
    tasks = datasets.load_tasks(name, split or None, data_dir, limit or None)
    ts = distributed.run_shared(
        lambda pairs: _scored(engine.run_pairs(pairs), pairs),
        [(t, s) for t in tasks for s in range(k)],
        to_text=Trajectory.to_json, from_text=Trajectory.from_json,
        what=f"eval {spec}")
    results[spec] = {**agent_eval.pass_at_k(ts, k),
                     **turns.response_stats(ts),
                     "token_logp": token_logp(ts), "n": float(len(tasks))}
    trajs[spec.replace(":", "_")] = ts
    logging.info("%s: %s", spec, results[spec])
  return results, trajs


def run(config, workdir: str) -> dict:
  c, e = config, config.eval
  check_specs(e.datasets)  # A misspelt set fails before any work.
  name, model = policy(c, workdir)
  logging.info("simpletir_eval: policy %s, weights %s", name,
               model.checkpoint)
  out = pathlib.Path(workdir) / "eval" / name
  cfg, params, tok = loading.load_policy(model, seed=c.seed)
  tools = registry.from_config(c.tools)
  sampler = Sampler(params, cfg, tok, SamplerConfig.from_config(
      dict(c.sampler, max_cache_len=e.max_cache_len)))
  engine = engine_lib.RolloutEngine(
      sampler, tok, tools, rollout_config(c, e),
      engine_lib.EngineConfig.from_config(c.engine))
  results, trajs = evaluate(engine, e.datasets, k=e.k,
                            data_dir=c.data.data_dir or None, limit=e.limit)
  cols = (f"avg@{e.k}", f"pass@{e.k}", "turns", "void_rate", "response_len",
          "token_logp")
  header = f"policy {name}: weights {model.checkpoint}"
  with distributed.one_writer(f"{out}") as writing:
    if writing:
      agent_eval.write(str(out), results, trajs, columns=cols,
                       label="dataset", header=header)
      (out / "summary.json").write_text(json.dumps(
          {"policy": name, "weights": model.checkpoint, "results": results},
          indent=2))
      _merge(out.parent, name, model.checkpoint, results, cols)
  print(header)
  print(agent_eval.table(results, cols, label="dataset"))
  return results


def _merge(path: pathlib.Path, name: str, weights: str, results: dict,
           cols) -> None:
  """eval/results.{json,md}: every policy evaluated in this workdir, a row
  per (policy, dataset), each with the weights it loaded."""
  merged = {k: v for k, v in agent_eval.read(str(path)).items()
            if v.get("policy") != name}
  merged.update({f"{name} {spec}": {**r, "policy": name, "weights": weights}
                 for spec, r in results.items()})
  loaded = {v["policy"]: v["weights"] for v in merged.values()}
  agent_eval.write(str(path), merged, columns=cols, label="policy dataset",
                   header="\n".join(f"policy {p}: weights {w}"
                                    for p, w in loaded.items()))


def _scored(trajs, pairs):
  checkers.score_trajectories(trajs, [t for t, _ in pairs])
  return trajs
