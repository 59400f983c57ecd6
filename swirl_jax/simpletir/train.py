"""SimpleTIR: online multi-turn GRPO with the Python sandbox.

Each iteration: sample prompts → G rollouts each through the rollout loop
(the sandbox runs every code block) → 1/0 rewards from the answer checker →
void flags → GRPO advantages (void rows keep their place in the group
statistics, out of the loss) → group filters → overlong rows masked → the
shared clipped-surrogate step over mini-batches of `mini_batch_prompts`
× G rows (verl counts a mini-batch in prompts). The iteration's stages are
swirl_jax/simpletir/stages.py's. The ratio's old log-probs are the
trainer's, recomputed under the params it updates before the update
(`old_logprobs='trainer'`, SimpleTIR's code; 'sampler' takes the
sampler's). Oversampling (`oversample`, swirl_jax/simpletir/oversample.py)
draws more prompts than `prompts_per_step` and keeps the groups up to the
`prompts_per_step`-th that passes the filters. Every `validation.every`
iterations (and before the first and after the last) the policy is
validated (avg@k / pass@k into metrics.jsonl) and exported to
<workdir>/hf; the training ends with that export too (`train.export_hf`),
which job `simpletir_eval` evaluates.

Bounded staleness (`staleness` k, swirl_jax/simpletir/pipeline.py): 0 is
the synchronous loop (iteration i samples with the policy after i
iterations, then trains). k >= 1 samples iteration i's rollouts with the
policy after max(0, i - k) iterations, in a thread, while the trainer
updates; which version samples which iteration is fixed in advance, so a
run is as reproducible as the synchronous one. The ratio then needs the
behaviour log-probs (the sampler's, of the version that sampled each
token): `old_logprobs='sampler'` clips against them (off-policy PPO);
'trainer' clips against the trainer's recomputed ones (the policy being
updated, the proximal policy of AReaL's decoupled loss) and weights each
token by TIS's truncated behaviour ratio min(pi_trainer / pi_sampler,
`loss.tis_cap`), so with k >= 1 it needs `loss.tis_cap` > 0. A row older
than k versions never enters the loss (`stale_rows`).

Diagnostics, logged with the iteration's metrics: the sampler-trainer
mismatch of the batch (the old log-probs' forward, or one of its own with
`old_logprobs='sampler'` and `log_mismatch`), token
probabilities and tool use of void vs other rollouts (`grpo.select_rows`),
and every `void_grad_every` iterations (0: off) the gradient norm of the
void rows alone and of the rows in the loss alone (one backward each).
"""

import json
import pathlib

from absl import logging

from swirl_jax import config_lib, distributed, viewer, warmstart
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.simpletir import evaluate
from swirl_jax.simpletir import grpo
from swirl_jax.simpletir import oversample
from swirl_jax.simpletir import report
from swirl_jax.simpletir import stages
from swirl_jax.tasks import datasets
from swirl_jax.tools import registry
from swirl_jax.training import metrics as metrics_lib
from swirl_jax.training import probes
from swirl_jax.training import trainer as trainer_lib


# One rollouts file per iteration; a resume rewinds it with metrics.jsonl.
ROLLOUTS = metrics_lib.RecordFile("rollouts/iter_*.jsonl", per_file=True)

OLD_LOGPROBS = ("trainer", "sampler")


def resolve(config):
  """A copy of `config` with `train.num_steps` (0) derived: one optimizer
  step per mini-batch of each iteration's rows (an upper bound: filtered
  batches take fewer), so `--config.` overrides never leave it stale."""
  c = config.copy_and_resolve_references()
  if c.old_logprobs not in OLD_LOGPROBS:
    raise config_lib.ConfigError(f"old_logprobs {c.old_logprobs!r}; valid: "
                                 f"{', '.join(OLD_LOGPROBS)}")
  if not (isinstance(c.staleness, int) and c.staleness >= 0):
    raise config_lib.ConfigError(f"staleness {c.staleness!r}: a count of "
                                 "policy versions, >= 0")
  if c.staleness and c.old_logprobs == "trainer" and \
      not c.train.loss.tis_cap > 0:
    raise config_lib.ConfigError(
        f"staleness={c.staleness} with old_logprobs='trainer' needs "
        "train.loss.tis_cap > 0 (the truncated behaviour ratio of the "
        "version that sampled), or old_logprobs='sampler'")
  if not c.train.num_steps:
    rows = c.prompts_per_step * c.grpo.group_size
    c.train.num_steps = c.num_iterations * max(
        1, rows // (c.train.mini_batch_size or rows))
  return c


def setup(c, workdir: str, make_sampler=None) -> stages.Loop:
  """The data, the policy (warm-started on CPU runs), the trainer (resumed
  where it stopped), the sampler and the engine of a training run."""
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
                                warmstart.task_count(c.warmstart))
    warmstart.run(c, workdir, demos, tools)
  mesh, (cfg, params, tok) = trainer_lib.load_policy(
      c.train, warmstart.model_config(c, workdir), seed=c.seed)
  trainer = trainer_lib.Trainer(c.train, workdir, cfg, params=params,
                                mesh=mesh, records=(ROLLOUTS,))
  del params  # The trainer's state holds the weights.
  make_sampler = make_sampler or (lambda p, m, t: Sampler(
      p, m, t, SamplerConfig.from_config(c.sampler)))
  sampler = make_sampler(trainer.sampling_params(), cfg, tok)
  drawn = max(c.prompts_per_step, min(len(tasks), oversample.prompts_drawn(
      c.prompts_per_step, c.oversample)))
  loop = stages.Loop(
      c, pathlib.Path(workdir), tasks, drawn, trainer, sampler,
      engine_lib.RolloutEngine(sampler, tok, tools, rollout_cfg, engine_cfg),
      groups, None, tok, tools)
  if loop.forward or c.void_grad_every:
    loop.probe = probes.Probe.for_trainer(
        trainer, old_logprobs=c.old_logprobs)
  return loop


def run(config, workdir: str, *, make_sampler=None) -> None:
  """The training job; `make_sampler(params, cfg, tok)` overrides the
  sampler (tests replay scripted turns through the real sandbox)."""
  c = resolve(config)
  loop = setup(c, workdir, make_sampler)
  gen, ok = stages.generator(loop), False
  try:
    for it in range(loop.trainer.data_pos, c.num_iterations):
      stages.iteration(loop, gen, it)
    if c.validation.every and loop.trainer.data_pos >= c.num_iterations:
      stages.validate(loop, gen, c.num_iterations)
    ok = True
  finally:
    try:
      loop.trainer.close(save=ok)
    finally:
      gen.close(finished=ok)
  if c.train.export_hf:
    loop.trainer.export_hf(tokenizer=loop.tok)
  with distributed.one_writer(f"{loop.work} report") as writing:
    if writing:
      (loop.work / "done.json").write_text(
          json.dumps({"iterations": c.num_iterations}))
      logging.info("reward curve (report.md):\n%s", report.write(loop.work))
  # The rollout viewer (rollouts.html), once the run's files are written.
  viewer.write_for_run(loop.work, tokenizer=loop.tok,
                       references=viewer.references(loop.tasks))
