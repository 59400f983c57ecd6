"""The one jitted, sharded training step, and the PPO loop around it.

Batch convention (host NumPy or placed arrays, all `[B, T]` arrays aligned
with `tokens`):
  tokens              int  [B, T]
  loss_mask           [B, T]  nonzero where token t was written by the
                      policy and is trained on (prompt, tool output and
                      padding are 0).
  advantages          [B] (one per row) or [B, T] (one per token t).
  behaviour_logprobs  [B, T]  log pi_old(tokens[t] | tokens[<t]), as the
                      sampler records it at the token's own index (column 0
                      is never used). Needed by 'clipped_surrogate' only.
  ref_logprobs        [B, T]  optional, same alignment; adds a k3 KL term.
  old_logprobs        [B, T]  optional: the trainer's own log-probs under
                      the params that sampled (training.probes); the PPO
                      ratio's denominator, and TIS (`loss.tis_cap`) weights
                      each token by min(exp(old - behaviour), cap).
  positions           [B, T]  optional (default: cumsum of the attention
                      mask).
  attention_mask      [B, T]  optional bool: real tokens (default all).

Shift: the step predicts token t from the prefix `< t`, i.e. from the hidden
state at t - 1. It takes `targets = tokens[:, 1:]` from `hidden[:, :-1]`
and shifts every token-aligned array the same way (`x[:, 1:]`), so a
column-0 entry never enters the loss.

One step = micro-batches (a `lax.scan` summing gradients) -> global-norm
clip -> AdamW. Each micro-batch loss is weighted by its share of the batch's
loss tokens (or loss rows, for per-row aggregation), so accumulating M
micro-batches gives the full-batch gradient. A non-finite loss or gradient
norm leaves params and optimizer state as they were and counts the step in
`state.skipped`.
"""

import functools
import math
from typing import Iterable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from swirl_jax import config_blocks, config_lib
from swirl_jax import dispatch
from swirl_jax import distributed
from swirl_jax import sharding as shd
from swirl_jax.models import decoder
from swirl_jax.models.config import ModelConfig
from swirl_jax.ops import logprobs as lp_ops
from swirl_jax.ops import losses
from swirl_jax.training import defaults
from swirl_jax.training import lora
from swirl_jax.training.optimizer import clip_by_global_norm
from swirl_jax.training.state import TrainState

LOSS_KINDS = ("clipped_surrogate", "stepwise_pg", "sft")
INT_KEYS = ("tokens", "positions")
BOOL_KEYS = ("attention_mask",)
# How micro-batch metrics combine: summed counts, maxima, per-row means;
# everything else is a mean over loss tokens.
_SUM_KEYS = ("num_loss_tokens", "num_loss_rows")
_MAX_KEYS = ("ratio_max", "mismatch_abs_max")
_ROW_KEYS = ("reward_mean", "action_logp")


# The block lives with the other defaults, light for config files.
default_loss_config = config_blocks.loss_config


def _agg(loss_cfg) -> str:
  if loss_cfg.agg:
    return loss_cfg.agg
  return "seq_mean_token_sum" if loss_cfg.kind == "stepwise_pg" \
      else "token_mean"


# ---------------------------------------------------------------- forward


def token_logprobs(params, cfg: ModelConfig, batch, *, chunk_size: int = 128,
                   with_entropy: bool = False):
  """`(logp, entropy)`, target-aligned `[B, T-1]`: entry t scores token t+1.

  Chunked over the sequence, so no `[B, T, V]` float32 logits exist.
  """
  tokens_BT = batch["tokens"]
  h_BTD, _ = decoder.hidden_states(params, cfg, tokens_BT,
                                   batch.get("positions"),
                                   batch.get("attention_mask"))
  unembed_fn = lambda sub, h: decoder.unembed_with(sub, cfg, h)
  return lp_ops.token_logprobs(decoder.unembed_params(params, cfg),
                               h_BTD[:, :-1], tokens_BT[:, 1:], unembed_fn,
                               chunk_size=chunk_size,
                               with_entropy=with_entropy)


def _shifted(batch, key):
  x = batch.get(key)
  return None if x is None else x[:, 1:]


def policy_loss(params, cfg: ModelConfig, loss_cfg, batch):
  """`(loss, metrics)` of one (micro-)batch for `loss_cfg.kind`."""
  logp_BT, ent_BT = token_logprobs(params, cfg, batch,
                                   chunk_size=int(loss_cfg.chunk_size),
                                   with_entropy=bool(loss_cfg.with_entropy))
  mask_BT = batch["loss_mask"][:, 1:]
  agg, kind = _agg(loss_cfg), loss_cfg.kind
  ref_BT = _shifted(batch, "ref_logprobs")
  kl = dict(ref_logp_BT=ref_BT, kl_coef=float(loss_cfg.kl_coef))
  tis = dict(old_logp_BT=_shifted(batch, "old_logprobs"),
             tis_cap=float(loss_cfg.get("tis_cap", 0.0)))
  if kind == "sft":
    return losses.sft_loss(logp_BT, mask_BT, agg=agg, entropy_BT=ent_BT)
  adv = batch["advantages"]
  adv = adv[:, 1:] if adv.ndim == 2 else adv
  if kind == "stepwise_pg":
    if adv.ndim != 1:
      raise ValueError("loss 'stepwise_pg' takes one advantage per row [B]")
    return losses.stepwise_pg_loss(
        logp_BT, mask_BT, adv, agg=agg, entropy_BT=ent_BT,
        sampler_logp_BT=_shifted(batch, "behaviour_logprobs"), **kl, **tis)
  if kind == "clipped_surrogate":
    c = float(loss_cfg.dual_clip_c)
    return losses.clipped_surrogate_loss(
        logp_BT, batch["behaviour_logprobs"][:, 1:], adv, mask_BT,
        eps_low=float(loss_cfg.eps_low), eps_high=float(loss_cfg.eps_high),
        dual_clip_c=c if c > 0 else None, agg=agg, entropy_BT=ent_BT, **kl,
        **tis)
  raise ValueError(f"loss.kind {kind!r}; valid: {LOSS_KINDS}")


# ------------------------------------------------------- gradient accumulation


def _counts(loss_mask_BT):
  """(loss tokens, loss rows) after the shift, as float32."""
  m_BT = loss_mask_BT[:, 1:] != 0
  return (jnp.sum(m_BT).astype(jnp.float32),
          jnp.sum(jnp.any(m_BT, axis=-1)).astype(jnp.float32))


def _split_micro(batch, m: int):
  """[B, ...] -> [M, B/M, ...] by stride, so each micro-batch keeps every
  device's share of rows (no data moves between devices)."""
  def split(x):
    b = x.shape[0]
    x = x.reshape(b // m, m, *x.shape[1:]).swapaxes(0, 1)
    return shd.constrain(x, (None, "batch") + (None,) * (x.ndim - 2))
  return jax.tree.map(split, batch)


def _combine(metrics_M, tok_w_M, row_w_M):
  """Micro-batch metrics [M] -> one value each."""
  out = {}
  for k, v_M in metrics_M.items():
    if k in _SUM_KEYS:
      out[k] = jnp.sum(v_M)
    elif k in _MAX_KEYS:
      out[k] = jnp.max(v_M)
    else:
      w_M = row_w_M if k in _ROW_KEYS else tok_w_M
      out[k] = jnp.sum(jnp.where(w_M > 0, v_M * w_M, 0.0))
  return out


def loss_and_grads(trainable, frozen, batch, *, cfg, loss_cfg, lora_cfg,
                   micro_batches: int):
  """`(loss, grads, metrics)` summed over micro-batches."""
  n_tok, n_row = _counts(batch["loss_mask"])
  per_row = _agg(loss_cfg) != "token_mean"

  def weighted_loss(train, micro):
    # LoRA: the adapters as a side path (no merged W, no W-sized grads).
    params = train if frozen is None else lora.side_params(frozen, train,
                                                           lora_cfg)
    loss, metrics = policy_loss(params, cfg, loss_cfg, micro)
    t, r = _counts(micro["loss_mask"])
    tok_w, row_w = t / jnp.maximum(n_tok, 1.0), r / jnp.maximum(n_row, 1.0)
    w = row_w if per_row else tok_w
    return loss * w, (metrics, tok_w, row_w)

  grad_fn = jax.value_and_grad(weighted_loss, has_aux=True)
  if micro_batches == 1:
    (loss, (metrics, _, _)), grads = grad_fn(trainable, batch)
    return loss, grads, metrics

  def body(grad_sum, micro):
    (loss, aux), grads = grad_fn(trainable, micro)
    return jax.tree.map(jnp.add, grad_sum, grads), (loss, aux)

  zeros = jax.tree.map(jnp.zeros_like, trainable)
  grads, (loss_M, (metrics_M, tok_w_M, row_w_M)) = jax.lax.scan(
      body, zeros, _split_micro(batch, micro_batches))
  metrics = _combine(metrics_M, tok_w_M, row_w_M)
  metrics["loss"] = jnp.sum(loss_M)
  return jnp.sum(loss_M), grads, metrics


# ---------------------------------------------------------------- the step


def train_step(state: TrainState, batch, *, cfg: ModelConfig, loss_cfg,
               lora_cfg, tx: optax.GradientTransformation, schedule,
               grad_clip: float, micro_batches: int):
  """`(state, metrics)`: one optimizer step over `batch` (pure; jit it)."""
  loss, grads, metrics = loss_and_grads(
      state.params, state.frozen, batch, cfg=cfg, loss_cfg=loss_cfg,
      lora_cfg=lora_cfg, micro_batches=micro_batches)
  grads, grad_norm = clip_by_global_norm(grads, grad_clip)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  # Select, never apply: a NaN update must not touch params or moments.
  keep = lambda new, old: jax.tree.map(
      lambda n, o: jnp.where(finite, n, o), new, old)
  skipped = state.skipped + (~finite).astype(jnp.int32)
  metrics.update(
      grad_norm=grad_norm,
      lr=jnp.asarray(schedule(state.step - state.skipped), jnp.float32),
      skipped=skipped.astype(jnp.float32),
      update_skipped=(~finite).astype(jnp.float32))
  new_state = state.replace(
      step=state.step + 1, params=keep(params, state.params),
      opt_state=keep(opt_state, state.opt_state),
      rng=jax.random.split(state.rng)[0], skipped=skipped)
  return new_state, metrics


class TrainStep:
  """`step(state, batch) -> (state, metrics)`, jitted once per batch size.

  State goes in and out with its own shardings and is donated; the batch
  is sharded over the batch mesh axes; metrics come back replicated.
  """

  def __init__(self, cfg: ModelConfig, config, tx, schedule, mesh: Mesh,
               shardings: TrainState, rules=shd.DEFAULT_RULES,
               compiler_options: dict | None = None):
    loss_cfg = default_loss_config().lock()  # A misspelt field fails here.
    loss_cfg.update(dict(config.get("loss", {}).items()))
    if loss_cfg.kind not in LOSS_KINDS:
      raise config_lib.ConfigError(
          f"loss.kind {loss_cfg.kind!r}; valid: {LOSS_KINDS}")
    self.config = config
    optim = config.get("optim", None)
    grad_clip = float(optim.get("grad_clip", 1.0)) if optim else 1.0
    self.mesh, self.rules, self.shardings = mesh, rules, shardings
    self._fn = functools.partial(
        train_step, cfg=cfg, loss_cfg=loss_cfg,
        lora_cfg=config.get("lora", None), tx=tx, schedule=schedule,
        grad_clip=grad_clip)
    self._jitted = per_batch_size(lambda batch_sharding, m: jax.jit(
        functools.partial(self._fn, micro_batches=m), donate_argnums=(0,),
        compiler_options=compiler_options,  # XLA options, e.g. for TPU.
        in_shardings=(shardings, batch_sharding),
        out_shardings=(shardings, NamedSharding(mesh, P()))), mesh, rules)

  def batch_sharding(self, batch_size: int) -> NamedSharding:
    return batch_sharding(self.mesh, batch_size, self.rules)

  def micro_batches(self, batch_size: int, length: int) -> int:
    """`config.micro_batches`, or (0) as the token budget asks for."""
    spec = self.batch_sharding(batch_size).spec
    axes = spec[0] if spec else None
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    shards = math.prod(self.mesh.shape[a] for a in axes)
    return defaults.micro_batches_for(self.config, batch_size, length, shards)

  def jitted(self, batch_size: int, length: int = 0):
    m = self.micro_batches(batch_size, length)
    if batch_size % m:
      raise ValueError(f"batch size {batch_size} is not a multiple of "
                       f"micro_batches={m}")
    return self._jitted(batch_size, m)

  def __call__(self, state: TrainState, batch):
    # Queued by the one dispatcher (placing too: it may reshard device
    # arrays): a generator may sample beside it.
    with dispatch.LOCK:
      batch = self.place(batch)
      with shd.use_mesh(self.mesh, self.rules):
        return self.jitted(*batch["tokens"].shape)(state, batch)

  def lower(self, state: TrainState, batch):
    """The lowered step (`.compile().memory_analysis()`, cost analysis)."""
    batch = self.place(batch)
    with shd.use_mesh(self.mesh, self.rules):
      return self.jitted(*batch["tokens"].shape).lower(state, batch)

  def place(self, batch):
    """Host arrays -> batch-sharded device arrays with canonical dtypes."""
    b = len(batch["tokens"])
    return place_batch(batch, self.batch_sharding(b))


def batch_sharding(mesh: Mesh, batch_size: int,
                   rules=shd.DEFAULT_RULES) -> NamedSharding:
  """One sharding for every batch leaf: rows over the batch axes."""
  spec = shd.logical_to_spec(("batch",), (batch_size,), mesh, rules)
  return NamedSharding(mesh, spec)


def per_batch_size(jit_for, mesh: Mesh, rules=shd.DEFAULT_RULES):
  """`get(batch_size, *args)`: `jit_for(the batch sharding, *args)`, built
  once per size and args (e.g. the micro-batch count).

  The batch's sharding depends on its size (rows split over the batch
  axes only when they divide), so each size gets its own jitted function;
  jit's own cache then holds one program per shape.
  """
  @functools.cache
  def get(batch_size: int, *args):
    return jit_for(batch_sharding(mesh, batch_size, rules), *args)
  return get


def _batch_dtype(key: str):
  return (jnp.int32 if key in INT_KEYS else bool if key in BOOL_KEYS
          else jnp.float32)


def place_batch(batch, sharding: NamedSharding):
  """Casts (ints int32, attention mask bool, rest float32) and places.
  Host arrays are the whole batch (on many hosts, the same on each);
  device arrays, global ones too (a batch of host-local rows:
  `batching.collate_over_hosts`), are laid out device to device."""
  def prep(k, x):
    dt = _batch_dtype(k)
    if isinstance(x, jax.Array):
      if x.dtype == dt and x.sharding == sharding:
        return x
      return jax.device_put(x.astype(dt), sharding)
    return shd.place(np.asarray(x).astype(dt), sharding)
  batch = {k: v for k, v in batch.items() if v is not None}
  host = {k: np.asarray(v).astype(_batch_dtype(k)) for k, v in batch.items()
          if not isinstance(v, jax.Array)}
  if jax.process_count() > 1 and host:  # Checked across hosts.
    host = distributed.place_rows(host, sharding)
  return {k: host[k] if k in host and jax.process_count() > 1
          else prep(k, v) for k, v in batch.items()}


# ---------------------------------------------------------- PPO mini-batches


def ppo_update(step: TrainStep, state: TrainState, batch, *, epochs: int = 1,
               mini_batch_size: int = 0) -> tuple[TrainState, list[dict]]:
  """Several epochs of mini-batch steps over one rollout batch.

  Each epoch visits the rows in a fresh order drawn from the state's key (so
  a resumed run shuffles as the first one did); one epoch with one
  mini-batch is a single step on the batch as given.
  """
  # Host arrays stay on the host; device ones (global ones of host-local
  # rows too) give their mini-batches on the devices.
  host = {k: v if isinstance(v, jax.Array) else np.asarray(v)
          for k, v in batch.items() if v is not None}
  b = len(host["tokens"])
  mb = mini_batch_size or b
  if b % mb:
    raise ValueError(f"rollout batch {b} is not a multiple of mini-batch {mb}")
  key = jax.device_get(state.rng)
  out = []
  for epoch in range(epochs):
    order = np.arange(b)
    if epochs > 1 or mb < b:
      order = np.asarray(jax.random.permutation(
          jax.random.fold_in(key, epoch), b))
    for i in range(0, b, mb):
      rows = order[i:i + mb]
      with dispatch.LOCK:  # Device rows are gathered by programs too.
        state, metrics = step(state, _take_rows(host, rows))
      out.append(metrics)
  return state, out


def _take_rows(batch: dict, rows: np.ndarray) -> dict:
  """`batch`'s `rows`: host arrays indexed on the host, device arrays in
  one program (an eager gather per array compiles and dispatches each on
  its own: seconds a mini-batch on two CPU hosts)."""
  dev = {k: v for k, v in batch.items() if isinstance(v, jax.Array)}
  out = {k: v[rows] for k, v in batch.items() if k not in dev}
  if dev:
    out.update(_gather_rows(dev, rows))
  return {k: out[k] for k in batch}


@jax.jit
def _gather_rows(tree, rows):
  return jax.tree.map(lambda v: v[rows], tree)


def make_logprob_fn(cfg: ModelConfig, mesh: Mesh, param_shardings, *,
                    chunk_size: int = 128, rules=shd.DEFAULT_RULES):
  """`fn(params, batch) -> logp [B, T]` aligned with tokens (column 0 is 0).

  For behaviour or reference log-probs computed after the fact (e.g. SWiRL
  scoring saved actions); same alignment the step expects.
  """
  def fn(params, batch):
    logp, _ = token_logprobs(params, cfg, batch, chunk_size=chunk_size)
    return jnp.pad(logp, ((0, 0), (1, 0)))

  jitted = per_batch_size(lambda sharding: jax.jit(
      fn, in_shardings=(param_shardings, sharding), out_shardings=sharding),
                          mesh, rules)

  def call(params, batch):
    b = len(batch["tokens"])
    # Placing may reshard device arrays: programs too, queued alike.
    with dispatch.LOCK, shd.use_mesh(mesh, rules):
      return jitted(b)(params, place_batch(batch,
                                           batch_sharding(mesh, b, rules)))
  return call


def iterate_metrics(metrics: Iterable[dict]) -> list[dict[str, float]]:
  """Device metric dicts -> host floats (one transfer for the lot)."""
  return [{k: float(v) for k, v in m.items()}
          for m in jax.device_get(list(metrics))]
