"""A generic host loop: state (resumed if possible), steps, metrics, saves.

SWiRL stage 2, its SFT baseline and SimpleTIR all end in the same loop; they
differ in how batches are made. Offline jobs hand `train` a batch source;
online ones (SimpleTIR samples with the current policy between updates) use
`Trainer` directly:

  mesh, (cfg, params, tok) = load_policy(config.train, config.model)
  trainer = Trainer(config.train, workdir, cfg, params=params, mesh=mesh)
  while trainer.step < config.train.num_steps:
    batch = make_rollouts(trainer.policy_params())
    trainer.update(batch)
  trainer.close()
"""

import functools
import itertools
import pathlib
from typing import Callable, Iterable, Iterator, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from swirl_jax import config_blocks
from swirl_jax import dispatch
from swirl_jax import distributed
from swirl_jax import sharding as shd
from swirl_jax.models import loading
from swirl_jax.models.config import ModelConfig
from swirl_jax.training import checkpoint as ckpt_lib
from swirl_jax.training import defaults
from swirl_jax.training import lora
from swirl_jax.training import metrics as metrics_lib
from swirl_jax.training import optimizer
from swirl_jax.training import state as state_lib
from swirl_jax.training import step as step_lib

Batch = dict
BatchSource = Callable[[int], Iterator[Batch]] | Iterable[Batch]


# The block lives with the other defaults, light for config files.
default_config = config_blocks.train_config


class Trainer:
  """Owns the state, the jitted step, checkpoints and the metric writer."""

  def __init__(self, config, workdir: str, model_cfg: ModelConfig, *,
               params=None, mesh: Mesh | None = None,
               rules=shd.DEFAULT_RULES,
               records: Sequence[metrics_lib.RecordFile] = ()):
    """`records`: the job's own record files under `workdir` (beside
    metrics.jsonl), rewound with it to the restored state's iteration."""
    c = self.config = config
    self.workdir, self.model_cfg = pathlib.Path(workdir), model_cfg
    if mesh is None:
      mesh = shd.make_mesh(defaults.resolve_mesh(
          c.mesh, defaults.num_params(model_cfg)))
    self.mesh = mesh
    self.lora_cfg = c.lora if lora.enabled(c.get("lora")) else None
    self.tx, self.schedule = optimizer.make_optimizer(c.optim, c.num_steps)
    self.ckpt = ckpt_lib.Checkpointer(
        str(self.workdir), every=c.checkpoint_every,
        keep=c.keep_checkpoints, async_save=c.async_checkpoints)
    self.state, self.shardings = self._restore_or_create(params, rules)
    self.step_fn = step_lib.TrainStep(model_cfg, c, self.tx, self.schedule,
                                      self.mesh, self.shardings, rules)
    self.writer = metrics_lib.MetricWriter(
        str(self.workdir), total_steps=c.num_steps, initial_step=self.step,
        done=self.data_pos, records=records, tensorboard=c.tensorboard,
        progress=c.progress)
    # `before_save(data_pos)`, when set, runs before each checkpoint is
    # taken: what a resume from it needs besides the state goes to disk
    # first (e.g. rollouts sampled ahead of the update).
    self.before_save: Callable[[int], None] | None = None
    # `after_save(data_pos)`, when set, runs once a save at `data_pos` is
    # on disk (checked after each update, never waited for): no resume
    # starts before it, so what only earlier positions need can go.
    self.after_save: Callable[[int], None] | None = None
    self._released: int | None = None  # The last position given to it.

  def _restore_or_create(self, params, rules):
    c, cfg = self.config, self.model_cfg
    abstract, shardings = state_lib.state_shardings(
        cfg, self.tx, self.mesh, self.lora_cfg, rules)
    if self.ckpt.latest_step() is not None:
      frozen = None
      if self.lora_cfg is not None:  # The base is not in the checkpoint.
        frozen = (state_lib.initial_params(cfg, self.mesh, c.seed, rules)
                  if params is None else jax.device_put(params,
                                                        shardings.frozen))
      restored = self.ckpt.restore(
          ckpt_lib.abstract_state(abstract, shardings), frozen=frozen)
      if restored is not None:
        return restored[0], shardings
    state, _ = state_lib.create(cfg, self.tx, self.mesh, seed=c.seed,
                                params=params, lora_cfg=self.lora_cfg,
                                rules=rules)
    return state, shardings

  @property
  def step(self) -> int:
    return int(jax.device_get(self.state.step))

  @property
  def data_pos(self) -> int:
    return int(jax.device_get(self.state.data_pos))

  def update(self, batch: Batch, extra: dict[str, float] | None = None
             ) -> list[dict[str, float]]:
    """PPO epochs / mini-batches over one batch; returns host metrics.

    `extra` (e.g. rollout statistics) is logged with every step's metrics.
    """
    c = self.config
    first = self.step
    with dispatch.LOCK:  # A generator may sample beside it: `dispatch`.
      self.state, metrics = step_lib.ppo_update(
          self.step_fn, self.state, batch, epochs=c.ppo_epochs,
          mini_batch_size=c.mini_batch_size)
      self._advance_data()
    host = step_lib.iterate_metrics(metrics)
    for i, m in enumerate(host):
      self.writer.write(first + i + 1, {**(extra or {}), **m},
                        iteration=self.data_pos - 1)
    self._save()
    return host

  def _save(self, force: bool = False) -> None:
    """A checkpoint when due (forced: also the batches skipped since the
    latest, `Checkpointer.save`); `after_save` whenever a newer one is
    found on disk."""
    due = self.ckpt.due(self.step, force=force, data_pos=self.data_pos)
    if due:  # The save before it is on disk first (it had the time).
      self.ckpt.wait()
      self._release()
    if self.before_save is not None and due:
      self.before_save(self.data_pos)
    self.ckpt.save(self.state, force=force)
    self._release()

  def _release(self) -> None:
    """`after_save` with the position saved on disk, when it moved."""
    pos = self.ckpt.on_disk()
    if self.after_save is not None and pos is not None and \
        pos != self._released:
      self._released = pos
      self.after_save(pos)

  def skip(self, extra: dict[str, float] | None = None) -> None:
    """Consumes a batch without an update (e.g. every group was filtered):
    no optimizer step, so Adam's moments do not move the params. Saved
    with the next checkpoint, or by `close` (the position alone)."""
    self._advance_data()
    if extra:
      self.writer.write(self.step, {**extra, "skipped_batch": 1.0},
                        iteration=self.data_pos - 1)

  def _advance_data(self):
    with dispatch.LOCK:  # `+ 1` is a program on the mesh.
      self.state = self.state.replace(data_pos=jax.device_put(
          self.state.data_pos + 1, self.shardings.data_pos))

  def policy_params(self):
    """Model params for sampling (LoRA merged by `lora.merge`, one program
    for every call; a fresh copy then)."""
    return self.state.model_params(self.lora_cfg)

  def sampling_params(self):
    """What the sampler reads: `policy_params()` in the model's compute
    dtype. With fp32 master weights and bf16 compute (the accelerator
    default) that is a bf16 copy laid out as the params, made on device by
    one program compiled once: half the memory and the HBM traffic of
    decode. Where the dtypes agree, `policy_params()` itself (no copy)."""
    params = self.policy_params()
    dtype = jnp.dtype(self.model_cfg.dtype)
    if all(x.dtype == dtype for x in jax.tree.leaves(params)):
      return params
    return _cast_floats(params, dtype)

  def export_hf(self, path: str | None = None, tokenizer=None) -> str:
    path, state = str(path or self.workdir / "hf"), self.state
    # Its reads of the params (and LoRA's merge) are programs: queued by
    # the one dispatcher (`dispatch`), as validation may export mid-run.
    with dispatch.LOCK:
      if jax.process_count() > 1:  # Params whole on every host; 0 writes.
        state = state.replace(params=distributed.to_host(state.params),
                              frozen=distributed.to_host(state.frozen))
      with distributed.one_writer(f"export {path}") as writing:
        if writing:
          ckpt_lib.export_hf(state, self.model_cfg, path,
                             lora_cfg=self.lora_cfg, tokenizer=tokenizer)
    return path

  def close(self, save: bool = True) -> None:
    try:
      if save:
        self._save(force=True)
      self.ckpt.close()
    finally:  # Ends the progress bar's line even when a save fails.
      self.writer.close()


@functools.partial(jax.jit, static_argnums=1)
def _cast_floats(tree, dtype):
  return jax.tree.map(lambda x: x.astype(dtype)
                      if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def load_policy(config, model_block, *, seed: int = 0,
                rules=shd.DEFAULT_RULES):
  """`(mesh, (cfg, params, tokenizer))`: the policy `model_block` describes,
  each leaf loaded straight into its shard on the mesh a trainer with
  `config` uses (never a whole copy on one device). Hand both on:
  `Trainer(config, workdir, cfg, params=params, mesh=mesh)`; load a frozen
  reference model the same way, with that mesh."""
  mesh = shd.make_mesh(defaults.resolve_mesh(
      config.mesh, defaults.preset_params(model_block)))
  return mesh, loading.load_policy(model_block, mesh=mesh, rules=rules,
                                   seed=seed)


def train(config, workdir: str, model_cfg: ModelConfig, batches: BatchSource,
          *, params=None, mesh: Mesh | None = None, tokenizer=None,
          rules=shd.DEFAULT_RULES) -> state_lib.TrainState:
  """Runs `config.num_steps` steps (resuming from `workdir`); final state.

  Args:
    batches: `fn(data_pos) -> iterator` starting at that batch (preferred:
      resumes without re-reading), or an iterable, of which the first
      `data_pos` batches are skipped on resume.
  """
  trainer = Trainer(config, workdir, model_cfg, params=params, mesh=mesh,
                    rules=rules)
  ok = False
  try:
    pos = trainer.data_pos
    source = (batches(pos) if callable(batches)
              else itertools.islice(iter(batches), pos, None))
    for batch in source:
      if trainer.step >= config.num_steps:
        break
      trainer.update(batch)
    ok = True
  finally:
    trainer.close(save=ok)  # After a failure the state may be donated.
  if config.export_hf:
    trainer.export_hf(tokenizer=tokenizer)
  return trainer.state
