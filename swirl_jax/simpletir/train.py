"""SimpleTIR: online multi-turn GRPO with the Python sandbox.

Each iteration: sample prompts → G rollouts each through the rollout loop
(the sandbox runs every code block) → 1/0 rewards from the answer checker →
void flags → GRPO advantages (void rows keep their place in the group
statistics, out of the loss) → group filters → overlong rows masked → the
shared clipped-surrogate step over mini-batches, using the sampler's
behaviour log-probs.

Diagnostics, logged with the iteration's metrics: the sampler-trainer
mismatch of the batch (one forward, `log_mismatch`, default on), token
probabilities and tool use of void vs other rollouts (`grpo.select_rows`),
and every `void_grad_every` iterations (0: off) the gradient norm of the
void rows alone and of the rows in the loss alone (one backward each).
"""

import json
import pathlib

import jax
import numpy as np
from absl import logging

from swirl_jax import distributed, warmstart
from swirl_jax.models import loading
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.records import write_jsonl
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.simpletir import grpo
from swirl_jax.simpletir import oversample
from swirl_jax.simpletir import report
from swirl_jax.tasks import checkers
from swirl_jax.tasks import datasets
from swirl_jax.tools import registry
from swirl_jax.training import probes
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


def split_grad_norms(probe, params, trajs, rows, adv, groups, *,
                     max_len=None) -> dict[str, float]:
  """`grad_norm_void` (void rows, with the advantages the filter takes
  from them) and `grad_norm_kept` (the rows in the loss), each alone."""
  out = {}
  void_rows, void_adv = grpo.void_rows(trajs, groups)
  for name, r, a in (("void", void_rows, void_adv), ("kept", rows, adv)):
    if distributed.gather(np.int64([len(r)])).sum():  # Rows on any host.
      b = grpo.make_batch(trajs, r, a, mini_batch_size=1, max_len=max_len)
      out[f"grad_norm_{name}"] = probe.grad_norm(params, b)
  return out


def resolve(config):
  """A copy of `config` with `train.num_steps` (0) derived: one optimizer
  step per mini-batch of each iteration's rows (an upper bound: filtered
  batches take fewer), so `--config.` overrides never leave it stale."""
  c = config.copy_and_resolve_references()
  if not c.train.num_steps:
    rows = c.prompts_per_step * c.grpo.group_size
    c.train.num_steps = c.num_iterations * max(
        1, rows // (c.train.mini_batch_size or rows))
  return c


def run(config, workdir: str, *, make_sampler=None) -> None:
  """The training job; `make_sampler(params, cfg, tok)` overrides the
  sampler (tests replay scripted turns through the real sandbox)."""
  c = resolve(config)
  work = pathlib.Path(workdir)
  # Bad rollout or group settings fail here, before any data or model work.
  rollout_cfg = turns.RolloutConfig.from_config(c.rollout)
  engine_cfg = engine_lib.EngineConfig.from_config(c.get("engine") or {})
  groups = grpo.GroupConfig.from_config(c.grpo)
  tasks = datasets.load_tasks(c.data.train, c.data.get("train_split"),
                              c.data.get("data_dir") or None,
                              c.data.get("train_limit") or None)
  tools = registry.from_config(c.tools, c.data.get("data_dir") or None)
  if c.get("warmstart") and c.warmstart.enabled:  # CPU runs: a mini policy.
    demos = datasets.load_tasks(c.data.train, c.warmstart.split,
                                c.data.get("data_dir") or None,
                                c.warmstart.tasks)
    warmstart.run(c, workdir, demos, tools)
  mesh, (cfg, params, tok) = trainer_lib.load_policy(
      c.train, warmstart.model_config(c, workdir), seed=c.seed)
  trainer = trainer_lib.Trainer(c.train, workdir, cfg, params=params,
                                mesh=mesh)
  del params  # The trainer's state holds the weights.
  make_sampler = make_sampler or (lambda p, m, t: Sampler(
      p, m, t, SamplerConfig.from_config(c.sampler)))
  sampler = make_sampler(trainer.sampling_params(), cfg, tok)
  rollout = engine_lib.RolloutEngine(sampler, tok, tools, rollout_cfg,
                                     engine_cfg)
  drawn = max(c.prompts_per_step, min(len(tasks), oversample.prompts_drawn(
      c.prompts_per_step, c.get("oversample", 1.0))))
  start = trainer.data_pos
  grad_every = int(c.get("void_grad_every", 0))
  # TIS (loss.tis_cap > 0) weights by the mismatch forward's log-probs.
  mismatch = c.get("log_mismatch", True) or c.train.loss.tis_cap > 0
  probe = (probes.Probe.for_trainer(trainer)
           if mismatch or grad_every else None)
  ok = False
  try:
    for it, batch_tasks in prompt_batches(tasks, drawn, c.seed, start):
      if it >= c.num_iterations:
        break
      sampler.params = trainer.sampling_params()
      rollout.config = turns.RolloutConfig.from_config(
          dict(c.rollout, seed=distributed.mix_seed(c.seed, "rollout", it)))
      if jax.process_count() == 1:  # Groups scored as they complete.
        trajs = oversample.rollout(rollout, batch_tasks, groups,
                                   c.prompts_per_step)
        checkers.score_trajectories(trajs, batch_tasks)
      else:  # Each host rolls out its block of the pairs and keeps it.
        # (Every drawn group runs: stopping at completed groups would need
        # the hosts to agree on each group as it ends.)
        pairs = [(t, k) for t in batch_tasks
                 for k in range(groups.group_size)]
        pairs = pairs[distributed.host_block(len(pairs))]
        trajs = _scored(rollout.run_pairs(pairs), pairs)
      path = str(work / "rollouts" / f"iter_{it:06d}.jsonl")
      distributed.take_turns(lambda: write_jsonl(path, trajs),  # pylint: disable=cell-var-from-loop
                             f"iteration {it} rollouts")
      rows, adv, stats = grpo.select_rows(trajs, groups)
      n = int(stats["rows_in_loss"])  # Every host's.
      batch = None if not n else grpo.make_batch(trajs, rows, adv,
                              mini_batch_size=c.train.mini_batch_size or 1,
                              max_len=c.get("max_seq_len") or None)
      stats["iteration"] = float(it)
      params = trainer.policy_params()  # The ones that sampled.
      if grad_every and it % grad_every == 0:
        stats.update(split_grad_norms(probe, params, trajs, rows, adv, groups,
                                      max_len=c.get("max_seq_len") or None))
      if n and mismatch:
        stats.update(probe.mismatch(params, batch))
      if n:
        trainer.update(batch, extra=stats)
      else:  # Every group filtered out: nothing to learn from.
        trainer.skip(stats)
      logging.info("iteration %d: reward %.3f void %.3f rows %d", it,
                   stats["reward"], stats["void_rate"], n)
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
