"""The programs the `fit` job compiles, from abstract inputs on the mesh.

`Setup` reads a job config (model, training block, sampler, engine and
rollout blocks) through the jobs' own config dataclasses, with its 'auto'
fields resolved for the target backend; `measure_all` lowers and compiles
the train step on the trainer's mesh, and the page pool's programs the
jobs run (`Sampler.generate`'s prefill and decode, the rollout engine's
append and decode chunk) on one host's decode mesh, from the abstract
arguments their device gives (`Device.lowerable`: `jax.ShapeDtypeStruct`s
carrying their shardings), so nothing the size of a weight is ever
allocated and a change to a program changes what is measured. Compiled
on XLA:CPU, a bf16 sampler program's temporaries are its float32
compile's (`measure_all` says why).

`capacity` says how many rows a data group keeps in flight within the
chip's memory, for a distribution of context lengths: with today's page
pool (each row holds the pages of its context) against contiguous slots
(each row holds `sampler.max_cache_len` + 1 slots, what the cache was
before pages).

`check_devices` is the same measurement against the real devices, run
before a training job loads its weights (see swirl_jax/jobs.py). One
module: the fit job, `capacity` and the pre-run check read the same
`Setup` and `measure`, so each change to what is measured changes all
three at once.
"""

import logging
import math

import jax
import jax.numpy as jnp
import numpy as np

from swirl_jax import config_blocks, jsonl
from swirl_jax import sharding as shd
from swirl_jax.models import paged, presets
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.records import Trajectory
from swirl_jax.sampling import sampler as sampler_lib
from swirl_jax.shapes import bucket
from swirl_jax.tools import parsing
from swirl_jax.training import defaults, lora, optimizer
from swirl_jax.training import state as state_lib
from swirl_jax.training import step as step_lib

TRAIN_BLOCKS = ("train", "rl_train", "sft_train")
GIB = 1 << 30


# The block lives with the other defaults, light for config files.
default_config = config_blocks.fit_config


class Setup:
  """Model config, mesh, optimizer and shapes of one job config."""

  def __init__(self, config, backend: str, host_devices: int):
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
    paged_impl = f.get("paged_attention_impl", "target")
    if paged_impl == "target":
      paged_impl = "xla_pages" if backend in ("gpu", "tpu") else "auto"
    self.model_cfg = self.model_cfg.replace(attention_impl=impl,
                                            paged_attention_impl=paged_impl)
    self.num_params = n
    self.mesh = shd.make_mesh(defaults.resolve_mesh(
        self.block.get("mesh", "auto"), n))
    self.tx, self.schedule = optimizer.make_optimizer(
        self.block.optim, self.block.num_steps)
    self.lora_cfg = self.block.lora if lora.enabled(
        self.block.get("lora")) else None
    self.sampler = sampler_lib.SamplerConfig.from_config(
        config.get("sampler") or {})
    self.cache_len = self.sampler.max_cache_len
    self.rows = int(f.train_rows or self.block.get("mini_batch_size") or 8)
    stage2 = config.get("stage2") or {}
    self.seq_len = int(f.seq_len or config.get("max_seq_len")
                       or stage2.get("max_len") or self.cache_len)
    # The sampler decodes on one host's devices (`sampler.decode_layout`):
    # data groups of tensor-parallel devices.
    self.host_devices = host_devices
    self.data_parallel, self.tensor_parallel = sampler_lib.decode_layout(
        host_devices, self.model_cfg, self.sampler.tensor_parallel,
        self.sampler.data_parallel)
    self.engine = engine_lib.EngineConfig.from_config(
        config.get("engine") or {})
    self.stops = tuple(parsing.stop_strings(turns.RolloutConfig.from_config(
        config.get("rollout") or {}).fmt))
    # `generate` runs in SWiRL's stage 2 (rows: `sampler.max_rows` a
    # call); rollouts go through the engine.
    self.sampler_rows = (self.sampler.max_rows or int(f.sampler_rows)) \
        if "stage2" in config else 0
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
                sampler_rows=self.sampler_rows, cache_len=self.cache_len,
                tensor_parallel=self.tensor_parallel,
                data_parallel=self.data_parallel,
                engine_slots=self.engine.slots,
                paged_attention_impl=c.paged_attention_impl)

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
      if self.tensor_parallel * self.data_parallel < self.host_devices:
        out.append(f"sampler.tensor_parallel and data_parallel up (now "
                   f"{self.tensor_parallel} and {self.data_parallel}; 0 = "
                   f"from the host's {self.host_devices} devices)")
      pool = self.engine.pages or "slots x a full row"
      out.append(f"engine.pages (now {pool}) or engine.slots (now "
                 f"{self.engine.slots}) down (the capacity lines say what "
                 "holds the rows), fewer rows per generate call (now "
                 f"{self.sampler_rows}) or sampler.max_cache_len down (now "
                 f"{self.cache_len})")
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
    compiled = _compile(step.jitted(setup.rows, setup.seq_len).lower(
        state, batch))
  return memory_fn(compiled), dict(args=_per_device_gib(state), temp=0.0,
                                   peak=_per_device_gib(state))


def measure_sampler(setup: Setup, cfg, memory_fn) -> dict:
  """Per-device figures of the page pool's programs as the jobs run them,
  on one host's devices as the `Sampler` lays them out (weights and KV
  heads over 'tensor', rows over 'data' groups: one group measured, each
  runs the same): `generate`'s prefill and decode where the config runs
  it (SWiRL's stage 2: `sampler.max_rows` or else `fit.sampler_rows`
  rows, `fit.prompt_len` and `fit.decode_steps`), and the rollout
  engine's append and decode chunk (`engine.slots` rows, a pool of
  `engine.pages`), each reading a row's whole context. 'kv' holds what
  `capacity` needs: the engine pool's and row tables' GiB, and the bytes
  of a token's keys and values and of a row's table entry (its logits and
  stop state), a device each."""
  d, t = setup.data_parallel, setup.tensor_parallel
  sc = setup.sampler
  sampler = sampler_lib.Sampler(
      None, cfg, config=sc, token_bytes=[b""] * cfg.vocab_size,
      mesh=shd.make_mesh([("data", d), ("tensor", t)],
                         jax.devices()[:d * t]))
  e = setup.engine
  devices = {("append", "decode_chunk"): (sampler.device(
      e.decode_batch, e.chunk_steps, e.append_tokens), e.slots, e.pages)}
  if setup.sampler_rows:  # As `Sampler.generate` sizes its device.
    rows = bucket(-(-setup.sampler_rows // d), sc.batch_buckets)
    limit = min(bucket(setup.prompt_len + setup.decode_steps,
                       sc.cache_buckets), sc.max_cache_len)
    devices[("prefill", "decode")] = (sampler.device(
        rows, bucket(setup.decode_steps, sc.step_buckets),
        min(bucket(setup.prompt_len, sc.length_buckets), limit), limit),
                                      rows, 0)
  figs = {}
  for names, (device, rows, pages) in devices.items():
    programs = device.lowerable(rows, setup.stops, pages)
    for name, program in zip(names, ("append", "decode")):
      figs[name] = memory_fn(_compile(programs[program].lower()))
    if names[0] == "append":
      pool, *tables = programs["decode"].args[1]
      k = pool["k"][0]
      figs["kv"] = dict(
          pool=_per_device_gib(pool), tables=_per_device_gib(tables),
          token_bytes=_per_device_gib(pool) * GIB / (k.shape[1] * k.shape[2]),
          row_bytes=_per_device_gib(tables) * GIB / (rows + 1))
  return figs


def measure_all(setup: Setup, layers: int, memory_fn) -> dict:
  """Per-device GiB (args, temp, peak) of each program at `layers`."""
  cfg = setup.cfg_at(layers)
  train, state = measure_train(setup, cfg, memory_fn)
  sampler = measure_sampler(setup, cfg, memory_fn)
  if jax.default_backend() == "cpu" and jnp.dtype(cfg.dtype).itemsize < 4:
    # XLA:CPU converts what a bf16 matmul reads to float32 first, and the
    # decode loop's weights once for the whole loop: a float32 copy of
    # every weight and page that an accelerator never makes. The float32
    # program's temporaries hold every buffer of the bf16 one at its size
    # or more, and no such copy: an upper bound of the bf16 program's own.
    wide = measure_sampler(setup, cfg.replace(dtype="float32"), memory_fn)
    for name, fig in sampler.items():
      if name != "kv":
        fig.update(temp=wide[name]["temp"],
                   peak=fig["peak"] - fig["temp"] + wide[name]["temp"])
  return dict(train=train, state=state, **sampler)


def _compile(lowered):
  """Compiles for its memory figures alone. On the CPU (fake devices
  standing in for a chip) nothing compiled here runs, so at XLA's lowest
  backend optimisation level: that level is LLVM's, after buffer
  assignment, and leaves every figure as it is (the 7B report on 8 H100s
  is the same line for line at 0 and the default) in two thirds of the
  time. An accelerator's real devices compile as they will run."""
  if jax.default_backend() != "cpu":
    return lowered.compile()
  return lowered.compile({"xla_backend_optimization_level": 0})


def memory(compiled) -> dict:
  """Per-device GiB (args, temp, peak) of a compiled program."""
  m = compiled.memory_analysis()
  # XLA:CPU's peak_memory_in_bytes leaves the temporaries out: add them up.
  peak = (m.argument_size_in_bytes + m.temp_size_in_bytes
          + m.output_size_in_bytes - m.alias_size_in_bytes)
  return dict(args=m.argument_size_in_bytes / GIB,
              temp=m.temp_size_in_bytes / GIB, peak=peak / GIB)


def _extrapolate(at_n: dict, at_n1: dict, n: int, depth: int) -> dict:
  return {k: at_n[k] + (depth - n) * (at_n1[k] - at_n[k]) for k in at_n}


SAMPLER_PROGRAMS = ("prefill", "decode", "append", "decode_chunk")


def live_lengths(config, cache_len: int) -> tuple[list[int], str]:
  """(context lengths, where they come from) for `capacity`: each
  trajectory's whole context in `fit.rollouts` (a rollouts JSONL), or
  rows of `fit.mean_live_fraction` of the cache length."""
  f = config.fit
  path = f.get("rollouts", "")
  if path:
    trajs = jsonl.read(path, Trajectory.from_dict)
    if not trajs:
      raise ValueError(f"fit.rollouts={path}: no trajectories")
    lengths = [min(cache_len, len(t.token_sequence()[0])) for t in trajs]
    return lengths, f"{path} ({len(trajs)} trajectories' contexts)"
  frac = float(f.get("mean_live_fraction", 0.25))
  if not 0 < frac <= 1:
    raise ValueError(f"fit.mean_live_fraction={frac} must be in (0, 1]")
  mean = max(1, round(frac * cache_len))
  return [mean], f"rows of {mean} tokens ({frac:g} of the cache)"


def prompt_groups(config) -> tuple[int, list[int]]:
  """(rows a prompt, prompt lengths) for `capacity`'s shared pages: a
  GRPO group's samples (`grpo.group_size`, else 1), with the prompts of
  `fit.rollouts`, or else of `fit.prompt_len` tokens."""
  group = int(config.get("grpo", {}).get("group_size", 1))
  path = config.fit.get("rollouts", "")
  if path:
    return group, [len(t.prompt_ids) for t in
                   jsonl.read(path, Trajectory.from_dict)]
  return group, [int(config.fit.prompt_len)]


def capacity(setup: Setup, figs: dict, limit_gib: float,
             lengths, samples: int = 1, prompts=()) -> dict:
  """Rows in flight a data group holds within `limit_gib` a device, and
  the K/V they hold (GiB a device, and a group: `tensor_parallel` devices
  share each token's heads), for rows of context `lengths` (their mean
  row): contiguous slots (every row `cache_len` + 1 slots, the cache
  before pages) against pages (every row the pages of its context), and
  pages `shared` by `samples` rows of one prompt (of the `prompts` lengths:
  its full pages held once). What is not rows' K/V and tables is fixed:
  the train state, and the engine's largest program without its pool and
  tables (weights, temporaries)."""
  kv, page = figs["kv"], setup.sampler.page_size
  engine = max(figs[k]["peak"] for k in ("append", "decode_chunk"))
  fixed = figs["state"]["args"] + engine - kv["pool"] - kv["tables"]
  free = max(0.0, limit_gib - fixed) * GIB
  tok, row = kv["token_bytes"], kv["row_bytes"]
  mean_pages = float(np.mean([paged.pages_for(n, page) for n in lengths]))
  group = setup.tensor_parallel

  def held(row_tokens: float) -> dict:
    rows = int(free // (row_tokens * tok + row))
    gib = rows * row_tokens * tok / GIB
    return dict(rows=rows, kv_gib=round(gib, 2),
                kv_gib_group=round(gib * group, 2))

  slots, pages = held(setup.cache_len + 1), held(mean_pages * page)
  pages["pool_pages"] = int((free - pages["rows"] * row) // (page * tok))
  full = float(np.mean([n // page for n in prompts] or [0]))
  shared = held((mean_pages - min(full, mean_pages) * (samples - 1)
                 / samples) * page)
  shared.update(group=samples, prompt_pages=round(full, 2))
  return dict(mean_live_tokens=round(float(np.mean(lengths)), 1),
              page_size=page, mean_pages=round(mean_pages, 2),
              shared=shared,
              kv_bytes_per_token=int(tok), fixed_gib=round(fixed, 2),
              free_gib=round(free / GIB, 2), slots=slots, pages=pages,
              rows_ratio=round(pages["rows"] / max(slots["rows"], 1), 2))


def measure(config, backend: str,
            host_devices: int) -> tuple[Setup, dict]:
  """`(setup, figures)`: `measure_all` at the real depth, or with
  `fit.num_layers_override` = n (0 < n < depth) at n and n + 1 layers,
  extrapolated linearly to the real depth (scanned layers make memory
  linear in it). `host_devices`: devices a host has (the sampler's)."""
  setup = Setup(config, backend, host_devices)
  depth, n = setup.model_cfg.num_layers, int(config.fit.num_layers_override)
  if n <= 0 or n >= depth:
    return setup, measure_all(setup, depth, memory)
  at = [measure_all(setup, layers, memory) for layers in (n, n + 1)]
  return setup, {k: _extrapolate(at[0][k], at[1][k], n, depth)
                 for k in at[0]}


def peaks(figs: dict) -> tuple[float, float]:
  """(train step, sampler) per-device peak GiB; the sampler's adds the
  train state, which stays on the devices while rollouts run."""
  sampler = max(figs[k]["peak"] for k in SAMPLER_PROGRAMS if k in figs)
  return figs["train"]["peak"], figs["state"]["args"] + sampler


# ------------------------------------------------------ the pre-run check


class DoesNotFit(RuntimeError):
  """A training job's programs need more memory than its devices have."""


def device_memory_limit() -> int | None:
  """Bytes one device may allocate, as its backend reports it (None where
  it reports none, e.g. a CPU)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get("bytes_limit") or None


def _check_config(config, block: str, layers: int):
  """`config` with a fit block for `block` on the real devices: the
  config's own fit sizes if it has them, the model's attention_impl, and
  stand-ins of `layers` and `layers` + 1 layers (cheap to compile)."""
  c = ml_copy(config)
  fit = default_config()
  fit.update(dict((config.get("fit") or {}).items()))
  fit.train_block = block
  if fit.attention_impl == "target":
    fit.attention_impl = config.model.get("attention_impl", "auto")
  fit.num_layers_override = int(fit.num_layers_override) or layers
  c.fit = fit
  return c


def check_devices(config, blocks, layers: int = 2) -> None:
  """Compiles the train step of each of `blocks` in `config` (and the
  sampler, when the config has a `sampler` block) for the real devices and
  raises `DoesNotFit`, with the fit job's figures and knobs in one line,
  when a per-device peak exceeds what the device may allocate. A backend
  that reports no limit (a CPU) is skipped, with a log line."""
  limit = device_memory_limit()
  backend = jax.default_backend()
  if limit is None:
    logging.info("fit check skipped: the %s devices report no memory limit",
                 backend)
    return
  limit_gib = limit / GIB
  for block in (b for b in blocks if b in config):
    setup, figs = measure(_check_config(config, block, layers), backend,
                          jax.local_device_count())
    train, sampler = peaks(figs)
    sampler = sampler if "sampler" in config else 0.0
    logging.info("fit check %s: train peak %.4g GiB, sampler peak %.4g GiB, "
                 "device limit %.4g GiB", block, train, sampler, limit_gib)
    if train > limit_gib or sampler > limit_gib:
      knobs = setup.knobs(train > limit_gib, sampler > limit_gib)
      raise DoesNotFit(
          f"{block} does not fit {jax.device_count()} x {backend} "
          f"({limit_gib:.4g} GiB a device): train peak {train:.4g} GiB, "
          f"sampler peak (with the state) {sampler:.4g} GiB; "
          + "; ".join(f"knob: {k}" for k in knobs))
