"""SimpleTIR: online multi-turn GRPO with the Python sandbox.

Each iteration: sample prompts → G rollouts each through the rollout loop
(the sandbox runs every code block) → 1/0 rewards from the answer checker →
void flags → GRPO advantages (void rows keep their place in the group
statistics, out of the loss) → group filters → overlong rows masked → the
shared clipped-surrogate step over mini-batches of `mini_batch_prompts`
× G rows (verl counts a mini-batch in prompts). The ratio's old log-probs
are the trainer's, recomputed under the params that sampled before the
update (`old_logprobs='trainer'`, SimpleTIR's code; 'sampler' takes the
sampler's). Oversampling (`oversample`, swirl_jax/simpletir/oversample.py)
draws more prompts than `prompts_per_step` and trains on at most that many
passing groups. Every `validation.every` iterations (and before the first
and after the last) the policy is validated (avg@k / pass@k into
metrics.jsonl) and exported to <workdir>/hf; the training ends with that
export too (`train.export_hf`), which job `simpletir_eval` evaluates.

Diagnostics, logged with the iteration's metrics: the sampler-trainer
mismatch of the batch (the old log-probs' forward, or one of its own with
`old_logprobs='sampler'` and `log_mismatch`), token
probabilities and tool use of void vs other rollouts (`grpo.select_rows`),
and every `void_grad_every` iterations (0: off) the gradient norm of the
void rows alone and of the rows in the loss alone (one backward each).
"""

import json
import pathlib

import jax
import numpy as np
from absl import logging

from swirl_jax import config_lib, distributed, warmstart
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.records import write_jsonl
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.simpletir import evaluate
from swirl_jax.simpletir import grpo
from swirl_jax.simpletir import oversample
from swirl_jax.simpletir import report
from swirl_jax.tasks import checkers
from swirl_jax.tasks import datasets
from swirl_jax.tools import registry
from swirl_jax.training import metrics as metrics_lib
from swirl_jax.training import probes
from swirl_jax.training import trainer as trainer_lib


# One rollouts file per iteration; a resume rewinds it with metrics.jsonl.
ROLLOUTS = metrics_lib.RecordFile("rollouts/iter_*.jsonl", per_file=True)


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


OLD_LOGPROBS = ("trainer", "sampler")


def resolve(config):
  """A copy of `config` with `train.num_steps` (0) derived: one optimizer
  step per mini-batch of each iteration's rows (an upper bound: filtered
  batches take fewer), so `--config.` overrides never leave it stale."""
  c = config.copy_and_resolve_references()
  if c.old_logprobs not in OLD_LOGPROBS:
    raise config_lib.ConfigError(f"old_logprobs {c.old_logprobs!r}; valid: "
                                 f"{', '.join(OLD_LOGPROBS)}")
  if not c.train.num_steps:
    rows = c.prompts_per_step * c.grpo.group_size
    c.train.num_steps = c.num_iterations * max(
        1, rows // (c.train.mini_batch_size or rows))
  return c


def trainer_logprobs(probe, params, batch, rows: int) -> np.ndarray:
  """The trainer's log-probs [B, T] of the batch's tokens under `params`
  (the old policy's, before the update), `rows` rows a forward so no
  forward holds more than a train micro-batch's activations."""
  keys = ("tokens", "attention_mask", "positions")
  parts = []
  for lo in range(0, len(batch["tokens"]), rows):
    piece = {k: batch[k][lo:lo + rows] for k in keys
             if batch.get(k) is not None}
    parts.append(distributed.to_host(probe.logprobs(params, piece)))
  return np.concatenate(parts).astype(np.float32)


def _forward_rows(trainer, batch) -> int:
  """Rows of one train micro-batch for this batch's mini-batches."""
  b, t = batch["tokens"].shape
  mb = trainer.config.mini_batch_size or b
  return max(1, mb // trainer.step_fn.micro_batches(mb, t))


def validate(c, trainer, rollout, sampler, tok, it: int) -> dict[str, float]:
  """The code's validation: `config.validation` over the current policy,
  avg@k / pass@k logged as `val_<set>_avg@k` at the trainer's step (with
  `val_iteration`: the policy after `it` iterations); the policy exported
  to <workdir>/hf when it has trained but is not the final one."""
  v, saved = c.validation, rollout.config
  sampler.params = trainer.sampling_params()
  rollout.config = evaluate.rollout_config(c, v)
  try:
    results, _ = evaluate.evaluate(rollout, v.datasets, k=v.k,
                                   data_dir=c.data.data_dir or None,
                                   limit=v.limit)
  finally:
    rollout.config = saved
  out = {"val_iteration": float(it)}
  for spec, r in results.items():
    for m in (f"avg@{v.k}", f"pass@{v.k}"):
      out[f"val_{spec.replace(':', '_')}_{m}"] = r[m]
  trainer.writer.write(trainer.step, out)
  logging.info("validation after %d iterations: %s", it, out)
  if 0 < it < c.num_iterations:
    trainer.export_hf(tokenizer=tok)
  return out


def _rollouts(c, rollout, batch_tasks, groups):
  """This host's scored trajectories of the iteration. One host: at most
  `prompts_per_step` passing groups (oversample.keep_passing). Several:
  each host rolls out its block of every drawn group's pairs and keeps it
  (stopping at completed groups would need the hosts to agree on each
  group as it ends); `grpo.select_rows(want=)` keeps the surplus passing
  groups out of the loss."""
  if jax.process_count() == 1:  # Groups scored as they complete.
    trajs = oversample.rollout(rollout, batch_tasks, groups,
                               c.prompts_per_step)
    checkers.score_trajectories(trajs, batch_tasks)
    return oversample.keep_passing(trajs, groups, c.prompts_per_step)
  pairs = [(t, k) for t in batch_tasks for k in range(groups.group_size)]
  pairs = pairs[distributed.host_block(len(pairs))]
  return _scored(rollout.run_pairs(pairs), pairs)


def _placed_as(x: np.ndarray, ref):
  """`x` (whole on every host) placed as the global array `ref` is."""
  if isinstance(ref, jax.Array) and not ref.is_fully_addressable:
    return jax.make_array_from_callback(x.shape, ref.sharding,
                                        lambda index: x[index])
  return x


def run(config, workdir: str, *, make_sampler=None) -> None:
  """The training job; `make_sampler(params, cfg, tok)` overrides the
  sampler (tests replay scripted turns through the real sandbox)."""
  c = resolve(config)
  work = pathlib.Path(workdir)
  # Bad rollout or group settings fail here, before any data or model work.
  rollout_cfg = turns.RolloutConfig.from_config(c.rollout)
  engine_cfg = engine_lib.EngineConfig.from_config(c.engine)
  groups = grpo.GroupConfig.from_config(c.grpo)
  if c.validation.every:
    evaluate.check_specs(c.validation.datasets)
  data_dir = c.data.data_dir or None
  tasks = datasets.load_tasks(c.data.train, c.data.train_split, data_dir,
                              c.data.train_limit or None)
  tools = registry.from_config(c.tools, data_dir)
  if c.warmstart.enabled:  # CPU runs: a mini policy.
    demos = datasets.load_tasks(c.data.train, c.warmstart.split, data_dir,
                                c.warmstart.tasks)
    warmstart.run(c, workdir, demos, tools)
  mesh, (cfg, params, tok) = trainer_lib.load_policy(
      c.train, warmstart.model_config(c, workdir), seed=c.seed)
  trainer = trainer_lib.Trainer(c.train, workdir, cfg, params=params,
                                mesh=mesh, records=(ROLLOUTS,))
  del params  # The trainer's state holds the weights.
  make_sampler = make_sampler or (lambda p, m, t: Sampler(
      p, m, t, SamplerConfig.from_config(c.sampler)))
  sampler = make_sampler(trainer.sampling_params(), cfg, tok)
  rollout = engine_lib.RolloutEngine(sampler, tok, tools, rollout_cfg,
                                     engine_cfg)
  drawn = max(c.prompts_per_step, min(len(tasks), oversample.prompts_drawn(
      c.prompts_per_step, c.oversample)))
  start, every = trainer.data_pos, c.validation.every
  recompute = c.old_logprobs == "trainer"
  # TIS (loss.tis_cap > 0) weights by the trainer's log-probs too.
  forward = recompute or c.log_mismatch or c.train.loss.tis_cap > 0
  probe = (probes.Probe.for_trainer(trainer)
           if forward or c.void_grad_every else None)
  ok = False
  try:
    for it, batch_tasks in prompt_batches(tasks, drawn, c.seed, start):
      if it >= c.num_iterations:
        break
      if every and it % every == 0:
        validate(c, trainer, rollout, sampler, tok, it)
      sampler.params = trainer.sampling_params()
      rollout.config = turns.RolloutConfig.from_config(
          dict(c.rollout, seed=distributed.mix_seed(c.seed, "rollout", it)))
      trajs = _rollouts(c, rollout, batch_tasks, groups)
      path = str(work / "rollouts" / f"iter_{it:06d}.jsonl")
      distributed.take_turns(lambda: write_jsonl(path, trajs),  # pylint: disable=cell-var-from-loop
                             f"iteration {it} rollouts")
      rows, adv, stats = grpo.select_rows(
          trajs, groups, want=c.prompts_per_step
          if jax.process_count() > 1 else 0)
      n = int(stats["rows_in_loss"])  # Every host's.
      stats["iteration"] = float(it)
      stats["groups_run"] = float(distributed.gather(np.int64(
          [len(trajs)])).sum() // groups.group_size)
      params = trainer.policy_params()  # The ones that sampled.
      if c.void_grad_every and it % c.void_grad_every == 0:
        stats.update(split_grad_norms(probe, params, trajs, rows, adv, groups,
                                      max_len=c.max_seq_len or None))
      if not n:  # Every group filtered out: nothing to learn from.
        trainer.skip(stats)
        continue
      batch = grpo.make_batch(trajs, rows, adv,
                              mini_batch_size=c.train.mini_batch_size or 1,
                              max_len=c.max_seq_len or None)
      if forward:  # One forward: the old log-probs and the mismatch.
        logp = trainer_logprobs(probe, params, batch,
                                _forward_rows(trainer, batch))
        stats.update(probe.mismatch(params, batch, logp))
        if recompute:
          batch["old_logprobs"] = _placed_as(logp, batch["tokens"])
      trainer.update(batch, extra=stats)
      logging.info("iteration %d: reward %.3f void %.3f rows %d", it,
                   stats["reward"], stats["void_rate"], n)
    if every and trainer.data_pos >= c.num_iterations:
      validate(c, trainer, rollout, sampler, tok,
               c.num_iterations)
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
