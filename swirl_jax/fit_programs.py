"""The programs the `fit` job compiles, from abstract inputs on the mesh.

`Setup` reads a job config (model, training block, sampler sizes) the way
the jobs do, with its 'auto' fields resolved for the target backend;
`measure_all` lowers and compiles the train step, the sampler's prefill and
its decode loop from `jax.ShapeDtypeStruct`s carrying their shardings, so
nothing the size of a weight is ever allocated.
"""

import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from swirl_jax import sharding as shd
from swirl_jax.models import decoder, presets
from swirl_jax.sampling import decoding
from swirl_jax.training import defaults, lora, optimizer
from swirl_jax.training import state as state_lib
from swirl_jax.training import step as step_lib

TRAIN_BLOCKS = ("train", "rl_train", "sft_train")


class Setup:
  """Model config, mesh, optimizer and shapes of one job config."""

  def __init__(self, config, backend: str):
    f = config.fit
    name = f.train_block or next(
        (b for b in TRAIN_BLOCKS if b in config), None)
    if name is None or name not in config:
      raise ValueError(f"fit: no training block {f.train_block or TRAIN_BLOCKS}"
                       " in the config (set fit.train_block)")
    self.block = config[name]
    model = ml_copy(config.model)
    n = defaults.preset_params(model)
    defaults.resolve_model_block(model, n, backend)
    self.model_cfg = presets.get_preset(
        model.preset, dtype=model.dtype, param_dtype=model.param_dtype,
        remat=model.remat)
    impl = f.attention_impl
    if impl == "target":
      capped = backend == "gpu" and self.model_cfg.attn_logit_softcap
      impl = "xla_blocks" if capped else "splash"
    self.model_cfg = self.model_cfg.replace(attention_impl=impl)
    self.num_params = n
    self.mesh = shd.make_mesh(defaults.resolve_mesh(
        self.block.get("mesh", "auto"), n))
    self.tx, self.schedule = optimizer.make_optimizer(
        self.block.optim, self.block.num_steps)
    self.lora_cfg = self.block.lora if lora.enabled(
        self.block.get("lora")) else None
    sampler = config.get("sampler") or {}
    self.cache_len = int(sampler.get("max_cache_len", 4096))
    self.cache_dtype = sampler.get("cache_dtype")
    self.rows = int(f.train_rows or self.block.get("mini_batch_size") or 8)
    stage2 = config.get("stage2") or {}
    self.seq_len = int(f.seq_len or config.get("max_seq_len")
                       or stage2.get("max_len") or self.cache_len)
    dp = _row_shards(self.mesh, 1 << 30)
    self.sampler_rows = dp * math.ceil(int(f.sampler_rows) / dp)
    self.prompt_len = min(int(f.prompt_len), self.cache_len)
    self.decode_steps = int(f.decode_steps)
    self.preset = model.preset
    self.micro_batches = None  # Set by measure_all.

  def cfg_at(self, layers: int):
    c = self.model_cfg
    types = c.layer_types[:layers] if c.layer_types else None
    return c.replace(num_layers=layers, layer_types=types)

  def describe(self) -> dict:
    c = self.model_cfg
    return dict(model=self.preset, params_b=round(self.num_params / 1e9, 2),
                num_layers=c.num_layers, mesh=dict(self.mesh.shape),
                remat=c.remat, dtype=c.dtype, param_dtype=c.param_dtype,
                attention_impl=c.attention_impl, train_rows=self.rows,
                seq_len=self.seq_len, micro_batches=self.micro_batches,
                sampler_rows=self.sampler_rows, cache_len=self.cache_len)

  def knobs(self, train_over: bool, sampler_over: bool) -> list[str]:
    """What to turn, most effective first, for each part over the limit."""
    c, out = self.model_cfg, []
    fsdp = self.mesh.shape.get("fsdp", 1)
    if (train_over or sampler_over) and fsdp < self.mesh.size:
      out.append("train.mesh: FSDP over all devices ([('data', 1), "
                 "('fsdp', -1), ('tensor', 1)]; 'auto' does so from 1B "
                 "params)")
    if train_over:
      if c.remat != "full":
        out.append("model.remat='full' (keeps one layer's activations)")
      rows = self.rows // _row_shards(self.mesh, self.rows)
      if rows // (self.micro_batches or 1) > 1:
        out.append(f"train.micro_batches up (now {self.micro_batches}) or "
                   "train.tokens_per_device down")
      if c.param_dtype == "float32":
        out.append("model.param_dtype='bfloat16' (halves params, grads "
                   "and Adam state)")
      out.append(f"fit.devices up (more chips: the state divides over "
                 f"them), or train.lora.rank > 0")
    if sampler_over:
      out.append(f"fewer rows per generate call (now {self.sampler_rows}) "
                 f"or sampler.max_cache_len down (now {self.cache_len})")
    return out


def ml_copy(block):
  return type(block)(block.to_dict())


def _row_shards(mesh, rows: int) -> int:
  spec = shd.logical_to_spec(("batch",), (rows,), mesh)
  axes = spec[0] if spec else None
  axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
  return math.prod(mesh.shape[a] for a in axes)


def _abstract(tree, shardings):
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      tree, shardings)


def _per_device_gib(abstract_tree) -> float:
  total = 0
  for a in jax.tree.leaves(abstract_tree):
    shape = a.sharding.shard_shape(a.shape)
    total += math.prod(shape) * jnp.dtype(a.dtype).itemsize
  return total / (1 << 30)


def train_batch(setup: Setup, step) -> dict:
  """Abstract batch of the training block's loss kind."""
  b, t = setup.rows, setup.seq_len
  s = step.batch_sharding(b)
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=s)
  batch = dict(tokens=jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=s),
               loss_mask=f32(b, t))
  kind = setup.block.loss.kind
  if kind != "sft":
    batch["advantages"] = f32(b)
  if kind == "clipped_surrogate":
    batch["behaviour_logprobs"] = f32(b, t)
  if float(setup.block.loss.get("kl_coef", 0.0)) > 0:
    batch["ref_logprobs"] = f32(b, t)
  return batch


def measure_train(setup: Setup, cfg, memory_fn) -> tuple[dict, dict]:
  abstract, shardings = state_lib.state_shardings(
      cfg, setup.tx, setup.mesh, setup.lora_cfg)
  state = _abstract(abstract, shardings)
  step = step_lib.TrainStep(cfg, setup.block, setup.tx, setup.schedule,
                            setup.mesh, shardings)
  setup.micro_batches = step.micro_batches(setup.rows, setup.seq_len)
  batch = train_batch(setup, step)
  with shd.use_mesh(setup.mesh):
    compiled = step.jitted(setup.rows, setup.seq_len).lower(
        state, batch).compile()
  return memory_fn(compiled), dict(args=_per_device_gib(state), temp=0.0,
                                   peak=_per_device_gib(state))


def _sampler_params(cfg, mesh):
  """Abstract weights in the compute dtype, layers split as the sampler
  holds them, sharded as the trainer's."""
  cfg = cfg.replace(param_dtype=cfg.dtype)
  params = _abstract(decoder.abstract_params(cfg),
                     state_lib.param_shardings(cfg, mesh))
  unstack = lambda x: jax.ShapeDtypeStruct(
      x.shape[1:], x.dtype,
      sharding=NamedSharding(mesh, P(*x.sharding.spec[1:])))
  layers = tuple(jax.tree.map(unstack, params["layers"])
                 for _ in range(cfg.num_layers))
  return dict(params, layers=layers)


def measure_sampler(setup: Setup, cfg, memory_fn) -> tuple[dict, dict]:
  mesh, B, S = setup.mesh, setup.sampler_rows, setup.cache_len
  params = _sampler_params(cfg, mesh)
  rows = lambda shape, dtype: jax.ShapeDtypeStruct(
      shape, dtype, sharding=shd.data_sharding(mesh, len(shape),
                                               shape=shape))
  rep = lambda shape, dtype: jax.ShapeDtypeStruct(
      shape, dtype, sharding=NamedSharding(mesh, P()))
  toks = rows((B, setup.prompt_len), jnp.int32)
  mask = rows((B, setup.prompt_len), jnp.bool_)
  prefill = jax.jit(lambda p, t, m: decoding.prefill(
      p, cfg, t, m, S, setup.cache_dtype))
  with shd.use_mesh(mesh):
    lowered = prefill.lower(params, toks, mask)
    compiled = lowered.compile()
    outs = jax.eval_shape(prefill, params, toks, mask)
  pre = memory_fn(compiled)
  cache, logits = _abstract(outs, compiled.output_shardings)
  keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), B))
  keys = jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=NamedSharding(
      mesh, P(toks.sharding.spec[0])))
  vec = lambda dtype: jax.ShapeDtypeStruct(
      (B,), dtype, sharding=keys.sharding)
  sp = decoding.SamplingParams(keys, vec(jnp.float32), vec(jnp.int32),
                               vec(jnp.float32))
  stop = decoding.StopSpec(vec(jnp.int32), rep((8,), jnp.int32),
                           rep((16, cfg.vocab_size), jnp.int16))
  decode = jax.jit(lambda p, c, lg, a, st, sp, so: decoding.decode(
      p, cfg, c, lg, a, st, sp, so, setup.decode_steps),
                   donate_argnums=(1, 2))
  with shd.use_mesh(mesh):
    compiled = decode.lower(params, cache, logits, vec(jnp.bool_),
                            vec(jnp.int32), sp, stop).compile()
  return pre, memory_fn(compiled)


def measure_all(setup: Setup, layers: int, memory_fn) -> dict:
  """Per-device GiB (args, temp, peak) of each program at `layers`."""
  cfg = setup.cfg_at(layers)
  train, state = measure_train(setup, cfg, memory_fn)
  prefill, decode = measure_sampler(setup, cfg, memory_fn)
  return dict(train=train, state=state, prefill=prefill, decode=decode)
