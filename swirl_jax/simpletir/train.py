"""SimpleTIR: online multi-turn GRPO with the Python sandbox.

Each iteration: sample prompts → G rollouts each through the rollout loop
(the sandbox runs every code block) → 1/0 rewards from the answer checker →
void flags → GRPO advantages (void rows keep their place in the group
statistics, out of the loss) → group filters → overlong rows masked → the
shared clipped-surrogate step over mini-batches, using the sampler's
behaviour log-probs.
"""

import json
import pathlib

import numpy as np
from absl import logging

from swirl_jax import distributed, warmstart
from swirl_jax.models import loading
from swirl_jax.rollout import loop as loop_lib
from swirl_jax.rollout.records import Trajectory, write_jsonl
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.simpletir import grpo
from swirl_jax.simpletir import report
from swirl_jax.tasks import checkers
from swirl_jax.tasks import datasets
from swirl_jax.tools import registry
from swirl_jax.training import trainer as trainer_lib


def prompt_batches(tasks, per_step: int, seed: int, start: int):
  """Iteration i's prompts: a seeded shuffle of the tasks, epoch by epoch."""
  i = start
  while True:
    epoch, off = divmod(i * per_step, len(tasks))
    order = np.random.default_rng(seed + epoch).permutation(len(tasks))
    idx = [order[(off + k) % len(tasks)] for k in range(per_step)]
    yield i, [tasks[j] for j in idx]
    i += 1


def run(config, workdir: str, *, make_sampler=None) -> None:
  """The training job; `make_sampler(params, cfg, tok)` overrides the
  sampler (tests replay scripted turns through the real sandbox)."""
  c = config
  work = pathlib.Path(workdir)
  tasks = datasets.load_tasks(c.data.train, c.data.get("train_split"),
                              c.data.get("data_dir") or None,
                              c.data.get("train_limit") or None)
  tools = registry.from_config(c.tools, c.data.get("data_dir") or None)
  if c.get("warmstart") and c.warmstart.enabled:  # CPU runs: a mini policy.
    demos = datasets.load_tasks(c.data.train, c.warmstart.split,
                                c.data.get("data_dir") or None,
                                c.warmstart.tasks)
    warmstart.run(c, workdir, demos, tools)
  cfg, params, tok = loading.load_policy(warmstart.model_config(c, workdir),
                                         seed=c.seed)
  trainer = trainer_lib.Trainer(c.train, workdir, cfg, params=params)
  make_sampler = make_sampler or (lambda p, m, t: Sampler(
      p, m, t, SamplerConfig.from_config(c.sampler)))
  sampler = make_sampler(distributed.local_copy(trainer.policy_params()),
                         cfg, tok)
  rollout = loop_lib.RolloutLoop(sampler, tok, tools,
                                 loop_lib.RolloutConfig.from_config(c.rollout))
  groups = grpo.GroupConfig.from_config(c.grpo)
  start = trainer.data_pos
  ok = False
  try:
    for it, batch_tasks in prompt_batches(tasks, c.prompts_per_step, c.seed,
                                          start):
      if it >= c.num_iterations:
        break
      sampler.params = distributed.local_copy(trainer.policy_params())
      rollout.config = loop_lib.RolloutConfig.from_config(
          dict(c.rollout, seed=c.seed * 100003 + it))
      trajs = distributed.run_shared(  # Each host its share; all get all.
          lambda pairs: _scored(rollout.run_pairs(pairs), pairs),
          [(t, k) for t in batch_tasks for k in range(groups.group_size)],
          to_text=Trajectory.to_json, from_text=Trajectory.from_json)
      with distributed.one_writer(f"iteration {it} rollouts") as writing:
        if writing:
          write_jsonl(str(work / "rollouts" / f"iter_{it:06d}.jsonl"), trajs)
      rows, adv, stats = grpo.select_rows(trajs, groups)
      batch = None if not len(rows) else grpo.make_batch(trajs, rows, adv,
                              mini_batch_size=c.train.mini_batch_size or 1,
                              max_len=c.get("max_seq_len") or None)
      stats["iteration"] = float(it)
      if len(rows):
        trainer.update(batch, extra=stats)
      else:  # Every group filtered out: nothing to learn from.
        trainer.skip(stats)
      logging.info("iteration %d: reward %.3f void %.3f rows %d", it,
                   stats["reward"], stats["void_rate"], len(rows))
    ok = True
  finally:
    trainer.close(save=ok)
  if c.train.export_hf:
    trainer.export_hf(tokenizer=tok)
  with distributed.one_writer(f"{work} report") as writing:
    if writing:
      (work / "done.json").write_text(
          json.dumps({"iterations": c.num_iterations}))
      logging.info("reward curve (report.md):\n%s", report.write(work))


def _scored(trajs, pairs):
  checkers.score_trajectories(trajs, [t for t, _ in pairs])
  return trajs
