"""One SimpleTIR iteration as stages (`iteration`), which `train.run` runs.

Each stage is a function of what the one before gives, with one code
path for one host and many (one host is the many-host case with one):

  collect   in the generator (`pipeline.Generator`, a thread with
            staleness >= 1): this host's block of the (task, sample)
            pairs rolled out with the policy version it is given, each
            trajectory scored once by its checker; no exchange between
            hosts. -> this host's trajectories
  score     one exchange of every host's rows' figures (`grpo.figures`),
            and the groups the iteration keeps (`oversample.kept_groups`,
            the same on any host count). -> kept trajectories, `Rows`
  select    GRPO advantages, the void / overlong / group filters, the
            version check, the rollout statistics (`grpo.select_rows`).
            -> this host's rows in the loss, advantages, stats
  record    the kept trajectories to rollouts/iter_<i>.jsonl. Before the
            update: a checkpoint is never taken past a missing file.
  batch     the global batch of each host's rows in the loss (none: the
            iteration is logged without an update).
  logprobs  the trainer's log-probs of the batch (the ratio's old ones,
            TIS's) and the sampler-trainer mismatch, kept on the devices.
  update    the optimizer steps, their records (each with its iteration)
            and a checkpoint; then the new policy version published to
            the generator.

Every stage but collect runs in the main thread: every exchange between
hosts is there, in the same order on every host.
"""

import dataclasses
import pathlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from swirl_jax import dispatch
from swirl_jax import distributed
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout.records import Trajectory, write_jsonl
from swirl_jax.simpletir import evaluate, grpo, oversample, pipeline
from swirl_jax.training import probes
from swirl_jax.training import trainer as trainer_lib


@dataclasses.dataclass
class Loop:
  """What the stages share: the resolved config, the workdir, the
  training tasks, the trainer, the sampler and the generator's engine."""
  c: ml_collections.ConfigDict
  work: pathlib.Path
  tasks: list
  drawn: int  # Prompts an iteration draws.
  trainer: trainer_lib.Trainer
  sampler: Any
  engine: engine_lib.RolloutEngine  # The generator's.
  groups: grpo.GroupConfig
  probe: probes.Probe | None
  tok: Any
  tools: dict
  _validation: engine_lib.RolloutEngine | None = None

  @property
  def forward(self) -> bool:
    """Whether the batch gets the trainer's log-probs: the ratio's old
    ones, the mismatch metrics, or TIS's (`loss.tis_cap` > 0)."""
    c = self.c
    return (c.old_logprobs == "trainer" or c.log_mismatch
            or c.train.loss.tis_cap > 0)

  def validation_engine(self) -> engine_lib.RolloutEngine:
    """An engine of its own with the validation's sampling (built once;
    its cache is allocated only while it runs)."""
    if self._validation is None:
      self._validation = engine_lib.RolloutEngine(
          self.sampler, self.tok, self.tools,
          evaluate.rollout_config(self.c, self.c.validation),
          self.engine.engine)
    return self._validation


def prompt_batch(tasks, per_step: int, seed: int, it: int) -> list:
  """Iteration `it`'s prompts: a seeded shuffle of the tasks, epoch by
  epoch."""
  epoch, off = divmod(it * per_step, len(tasks))
  order = np.random.default_rng(seed + epoch).permutation(len(tasks))
  return [tasks[order[(off + k) % len(tasks)]] for k in range(per_step)]


def generator(loop: Loop) -> pipeline.Generator:
  """The generator of the loop's iterations from the trainer's position on
  (`collect` each; with staleness its queue in <workdir>/queue), with the
  trainer's current policy published and checkpoints waiting for it."""
  c, t = loop.c, loop.trainer
  queue = None
  if c.staleness:
    queue = pipeline.Queue(loop.work / "queue", queue_manifest(c))
  gen = pipeline.Generator(
      lambda it, policy: collect(loop, it, policy), staleness=c.staleness,
      start=t.data_pos, stop=c.num_iterations, queue=queue)
  t.before_save, t.after_save = gen.saved, gen.prune
  gen.publish(policy(loop))
  return gen


# Fields that decide nothing a queue holds: where the data is read from,
# how far the run goes (`train.num_steps`, resolved from it, stays in),
# validation and the other jobs' blocks, diagnostics, and how the trainer
# saves and logs.
UNSAMPLED = ("job", "num_iterations", "data.data_dir", "validation", "eval",
             "fit", "void_grad_every", "log_mismatch",
             "train.checkpoint_every", "train.keep_checkpoints",
             "train.async_checkpoints", "train.export_hf",
             "train.tensorboard", "train.progress")


def queue_manifest(c: ml_collections.ConfigDict,
                   process_count: int | None = None) -> dict[str, Any]:
  """What decides the rollouts a queue holds (`pipeline.Queue`): the
  resolved config's fields, flat (`train.optim.lr`), less `UNSAMPLED`
  (the rest do, through the rollouts or the policy versions that sample
  them: when in doubt a field stays in, so a changed one is refused
  rather than mixed in), and the host count."""
  flat = {"process_count": (jax.process_count() if process_count is None
                            else process_count)}

  def walk(prefix: str, d: dict) -> None:
    for key, value in d.items():
      name = f"{prefix}{key}"
      if any(name == u or name.startswith(u + ".") for u in UNSAMPLED):
        continue
      if isinstance(value, dict) and value:
        walk(name + ".", value)
      else:
        flat[name] = value
  walk("", c.to_dict())
  return flat


def policy(loop: Loop) -> engine_lib.Policy:
  """The trainer's current policy as the sampler takes it (this host's
  copy on its decode mesh: a collective), versioned by the iterations it
  has trained. Sampled beside the updates (staleness), a copy of its own:
  the update donates the trainer's buffers."""
  with dispatch.LOCK:  # A generator may sample beside it (`dispatch`).
    params = loop.sampler.local_params(loop.trainer.sampling_params())
    if loop.c.staleness:
      params = jax.tree.map(jnp.copy, params)
  return engine_lib.Policy(loop.trainer.data_pos, params)


def collect(loop: Loop, it: int, feed: Callable[[], engine_lib.Policy]
            ) -> list[Trajectory]:
  """This host's scored trajectories of iteration `it`, sampled with
  `feed()` (`RolloutEngine.run_pairs`' policy: with staleness, each
  trajectory stamped with its version); no exchange."""
  c = loop.c
  loop.sampler.params = feed().params  # What the device opens with.
  loop.engine.config = dataclasses.replace(
      loop.engine.config, seed=distributed.mix_seed(c.seed, "rollout", it))
  return oversample.rollout(
      loop.engine, prompt_batch(loop.tasks, loop.drawn, c.seed, it),
      loop.groups, c.prompts_per_step,
      policy=feed if c.staleness else None)


def score(loop: Loop, trajs: list[Trajectory]
          ) -> tuple[list[Trajectory], grpo.Rows]:
  """(this host's trajectories of the kept groups, every host's kept
  rows): one exchange of the rows' figures."""
  rows = grpo.figures(trajs, loop.groups)
  keep = oversample.kept_groups(rows.rewards, loop.groups,
                                loop.c.prompts_per_step)
  return ([t for t, k in zip(trajs, keep[rows.mine]) if k],
          rows.subset(keep))


def select(loop: Loop, it: int, trajs: list[Trajectory], rows: grpo.Rows):
  """(this host's row indices in the loss, their advantages, the
  iteration's stats); with staleness, rows older than it allows leave the
  loss (`stale_rows`). Every `void_grad_every` iterations the split
  gradient norms (`split_grad_norms`) too."""
  c, g = loop.c, loop.groups
  sel, adv, stats = grpo.select_rows(rows, g, iteration=it,
                                     staleness=c.staleness or None)
  stats.update(iteration=float(it),
               groups_run=float(len(rows.table) // g.group_size))
  if c.void_grad_every and it % c.void_grad_every == 0:
    stats.update(split_grad_norms(
        loop.probe, loop.trainer.policy_params(), trajs, rows, sel, adv, g,
        max_len=c.max_seq_len or None))
  return sel, adv, stats


def split_grad_norms(probe, params, trajs, rows: grpo.Rows, sel, adv,
                     groups, *, max_len=None) -> dict[str, float]:
  """`grad_norm_void` (void rows, with the advantages the filter takes
  from them) and `grad_norm_kept` (the rows in the loss, `sel`), each
  alone."""
  out = {}
  void_sel, void_adv = grpo.void_rows(rows, groups)
  for name, r, a in (("void", void_sel, void_adv), ("kept", sel, adv)):
    if distributed.gather(np.int64([len(r)])).sum():  # Rows on any host.
      b = grpo.make_batch(trajs, r, a, mini_batch_size=1, max_len=max_len)
      out[f"grad_norm_{name}"] = probe.grad_norm(params, b)
  return out


def record(loop: Loop, it: int, trajs: list[Trajectory]) -> None:
  """The kept trajectories to rollouts/iter_<it>.jsonl, each host its own
  in host order (a resume rewinds the file with metrics.jsonl)."""
  path = str(loop.work / "rollouts" / f"iter_{it:06d}.jsonl")
  distributed.take_turns(lambda: write_jsonl(path, trajs),
                         f"iteration {it} rollouts")


def make_batch(loop: Loop, trajs, sel, adv) -> dict:
  c = loop.c
  return grpo.make_batch(trajs, sel, adv,
                         mini_batch_size=c.train.mini_batch_size or 1,
                         max_len=c.max_seq_len or None)


def logprobs(loop: Loop, batch: dict, stats: dict) -> None:
  """The trainer's log-probs of the batch under the policy it updates,
  kept on the devices: with old_logprobs='trainer' the ratio's old
  log-probs (`batch['old_logprobs']`), with TIS its trainer side, and the
  mismatch against the sampler's (`mismatch_*` in `stats`). One forward,
  a train micro-batch of rows at a time. Under staleness that policy is
  newer than the one that sampled: the recomputed log-probs are the
  proximal policy's (the clip), the sampler's the behaviour policy's
  (TIS's weights), and the mismatch holds the policy's change."""
  if not loop.forward:
    return
  t = loop.trainer
  params = t.policy_params()
  b, length = batch["tokens"].shape
  mb = t.config.mini_batch_size or b
  logp = loop.probe.logprobs(
      params, batch, max(1, mb // t.step_fn.micro_batches(mb, length)))
  stats.update(loop.probe.mismatch(params, batch, logp))
  if loop.c.old_logprobs == "trainer":
    batch["old_logprobs"] = logp


def update(loop: Loop, gen: pipeline.Generator, batch: dict | None,
           stats: dict) -> None:
  """The optimizer steps on `batch` (None: every group was filtered out;
  the iteration is logged without one), then the new version published."""
  t = loop.trainer
  if batch is None:
    t.skip(stats)
  else:
    t.update(batch, extra=stats)  # Not under the lock: its checkpoint
    # waits for the generator (`Generator.saved`); it queues under it.
    logging.info("iteration %d: reward %.3f void %.3f rows %d",
                 int(stats["iteration"]), stats["reward"],
                 stats["void_rate"], int(stats["rows_in_loss"]))
  gen.publish(policy(loop))


def validate(loop: Loop, gen: pipeline.Generator, it: int
             ) -> dict[str, float]:
  """The code's validation of the newest policy (after `it` iterations):
  `config.validation`, avg@k / pass@k logged as `val_<set>_avg@k` at the
  trainer's step, with `iteration` `it` (a resume rewinds it with the
  rest) and `val_iteration`; the policy exported to <workdir>/hf when it
  has trained but is not the final one. Nothing samples meanwhile."""
  c, v, t = loop.c, loop.c.validation, loop.trainer
  with gen.paused():
    loop.sampler.params = gen.latest().params
    results, _ = evaluate.evaluate(loop.validation_engine(), v.datasets,
                                   k=v.k, data_dir=c.data.data_dir or None,
                                   limit=v.limit)
  out = {"val_iteration": float(it)}
  for spec, r in results.items():
    for m in (f"avg@{v.k}", f"pass@{v.k}"):
      out[f"val_{spec.replace(':', '_')}_{m}"] = r[m]
  t.writer.write(t.step, out, iteration=it)
  logging.info("validation after %d iterations: %s", it, out)
  if 0 < it < c.num_iterations:
    t.export_hf(tokenizer=loop.tok)
  return out


def iteration(loop: Loop, gen: pipeline.Generator, it: int) -> None:
  """Iteration `it`: the validation when due, then the stages."""
  every = loop.c.validation.every
  if every and it % every == 0:
    validate(loop, gen, it)
  taken = gen.take(it)
  # The generator may sample beside these: their programs are queued by
  # the one dispatcher (`dispatch`), never while waiting for it.
  with dispatch.LOCK:
    trajs, rows = score(loop, taken)
    sel, adv, stats = select(loop, it, trajs, rows)
    record(loop, it, trajs)
    batch = None
    if stats["rows_in_loss"]:  # Every host's.
      batch = make_batch(loop, trajs, sel, adv)
      logprobs(loop, batch, stats)
  update(loop, gen, batch, stats)
