"""The judge calibration job: `config.judge` against the exact step labels.

  python -m swirl_jax.main --config=configs/demo.py --workdir=/tmp/swirl_demo \
      --config.job=judge_calibration --config.judge.kind=model

Judges the steps of the workdir's stage 1 trajectories (synthetic tasks,
whose solution graphs give every step an exact label) with the config's
judge and with the programmatic one, and reports their agreement
(`judges.calibration`): confusion matrix, Cohen's kappa, GOOD rates, by
step position. Writes `<workdir>/judge_calibration/<kind>_<id>.json` once,
at the end, and prints the report as one JSON line. `calibration.max_steps`
> 0 judges a seeded sample of that many steps.
"""

import hashlib
import json
import pathlib

import numpy as np
from absl import logging

from swirl_jax import judges, warmstart
from swirl_jax.judges import calibration
from swirl_jax.models import loading
from swirl_jax.rollout import decompose
from swirl_jax.swirl import stage1
from swirl_jax.tasks import datasets


def _steps(c, workdir):
  trajs = stage1.read_trajectories(str(pathlib.Path(workdir) / "stage1"))
  if not trajs:
    raise FileNotFoundError(f"{pathlib.Path(workdir) / 'stage1'}: no "
                            "trajectories; run stage1 first")
  units = decompose.decompose_all(trajs)
  n = int(c.get("calibration", {}).get("max_steps", 0))
  if 0 < n < len(units):
    keep = np.random.default_rng(c.seed).choice(len(units), n, replace=False)
    units = [units[i] for i in sorted(keep)]
  return units


def _tasks(c):
  d = c.data
  if not d.train.startswith("synthetic"):
    raise ValueError(f"judge calibration needs exact step labels: data.train "
                     f"{d.train!r} is not a synthetic task")
  return datasets.load_tasks(d.train, d.get("train_split") or None,
                             d.get("data_dir") or None,
                             d.get("train_limit") or None)


def run(c, workdir):
  units, tasks = _steps(c, workdir), _tasks(c)
  jc, out = c.judge, pathlib.Path(workdir) / "judge_calibration"
  policy_cfg = None
  if jc.kind == "model" and not jc.model.checkpoint:  # Judges with the policy.
    policy_cfg = warmstart.model_config(c, workdir)
  ident = judges.identity(jc, policy_cfg)
  out.mkdir(parents=True, exist_ok=True)
  judge = judges.make_judge(
      jc, tasks=tasks, name="judge",
      model=None if policy_cfg is None else loading.load_policy(policy_cfg),
      default_cache_path=str(out / "judge_cache.sqlite"))
  logging.info("judge calibration: %d steps, judge %s", len(units), ident)
  rep = dict(judge=ident, **calibration.calibrate(
      judge, judges.ProgrammaticJudge(tasks), units))
  key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode())
  path = out / f"{jc.kind}_{key.hexdigest()[:8]}.json"
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(rep, indent=2))
  tmp.rename(path)
  logging.info("judge calibration written to %s", path)
  print(json.dumps(dict(rep, path=str(path))), flush=True)
  return rep
