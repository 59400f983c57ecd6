r"""Train-step MFU and decode speed against the chip's roofline, on one device.

Random-weight models through the project's own train step (`TrainStep`,
`state.create`; clipped surrogate, AdamW, fp32 master weights, bf16
compute) and sampler (`Sampler`'s page pool as `generate` drives it: bf16
weights and cache, greedy, EOS off so every row writes every token):

  --models      presets trained (batch x length) and decoded (decode_batch
                rows, prompt_len + new_tokens), default Qwen2.5-0.5B and
                SmolLM2-135M shapes.
  --big_model   Qwen2.5-7B by default ('' skips): decode with all its 28
                layers at each of --big_rows (64, 256) x --big_contexts
                (512, 4,096 tokens of random cache contents), 128 new
                tokens; and its width trained at --big_train_layers
                layers, remat 'full', 8 x 2,048 tokens.

The 7B-width train depth, 6 layers: `--plan_hbm_gib=78` compiles the step
from abstract inputs at 2 and 4 layers (nothing allocated) and
extrapolates. On the CPU (XLA:CPU's buffer assignment, block attention)
it gave a peak of 40.3 GiB at 2 layers and 4.9 GiB a layer more, so 8
layers reach 69.6 GiB, the most within 90% of 78 GiB; 6 (59.8 GiB) leave
room for a GPU's own layout. Without remat a layer keeps ~24 GiB of
activations at 16k tokens: only one layer would fit.
A big decode case the device cannot hold is skipped with what it needs
(`decode_memory`): the weights, the rows' pages and their logits. On a GPU
the decode reads the pages in place (the Pallas kernel), so 256 rows x
4,224 tokens of the 7B (62 GB of K/V) need ~78 GB, within an 80 GB card's
95% (accelerator_gpu.sh); the slot cache, which decoded on a gathered copy
of its rows' cache, needed ~140 GB and was skipped. (Compiled for the CPU
the same program shows far more: XLA:CPU writes a bf16 pool by converting
it to f32 and back.)

  python benchmarks/accelerator.py [--models=qwen2_5_0_5b,smollm2_135m]
      [--attention_impl=auto] [--batch=8 --length=2048 --remat=none]
      [--decode_batch=64 --prompt_len=256 --new_tokens=256]
      [--big_model=qwen2_5_7b --big_rows=64,256 --big_contexts=512,4096]
      [--big_train_layers=6] [--small] [--plan_hbm_gib=78]

`benchmarks/accelerator_gpu.sh` runs it three times and profiles decode.

Conventions:
  train FLOPs per step = 6 * N * tokens + attention, where N counts the
    weights of every matmul (all layer params plus the V x D unembedding;
    the embedding lookup is no matmul) and attention is
    12 * layers * heads * head_dim * T^2 * B / 2 (QK^T and PV, forward and
    backward, the causal half: MaxText's convention); remat's recomputed
    forward is not counted. `mfu` divides by the datasheet peak bf16
    FLOP/s of the chip (swirl_jax/chips.py), `mfu_vs_matmul` by the rate
    of a big bf16 matmul measured in this run; `mfu_full_attention`
    counts all T^2 scores (PaLM's convention).
  decode roofline = bytes read per decode step (all bf16 weights but the
    embedding table, plus the live KV cache: each row's filled slots) over
    HBM bandwidth, summed over the steps; `decode_vs_roofline` against the
    datasheet bandwidth, `decode_vs_copy_roofline` against a device copy's
    bandwidth measured in this run. Decode time excludes the prefill.
On a CPU it runs 2-layer (the big train step 1-layer), small-vocabulary
stand-ins at small sizes and says so (`"backend": "cpu", "small": true`);
there is no datasheet peak then, only the measured ceilings. The last line
printed is one JSON object.
"""

import argparse
import contextlib
import functools
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import ml_collections
import numpy as np

from swirl_jax import chips
from swirl_jax import fit_programs
from swirl_jax import sharding as shd
from swirl_jax.models import attention, decoder, paged, presets
from swirl_jax.models.config import ModelConfig
from swirl_jax.sampling import sampler as sampler_lib
from swirl_jax.sampling.device import Draw, PlainRow
from swirl_jax.training import optimizer
from swirl_jax.training import state as state_lib
from swirl_jax.training import step as step_lib

import common  # pylint: disable=g-bad-import-order

GIB = 1 << 30
# CPU stand-ins: the presets' widths, 2 layers, a small vocabulary.
SMALL = dict(num_layers=2, vocab_size=4096)
SMALL_SIZES = dict(batch=2, length=128, decode_batch=4, prompt_len=32,
                   new_tokens=32, steps=2, matmul_n=1024, copy_mib=64,
                   big_rows="4", big_contexts="32,64", big_new_tokens=16,
                   big_train_layers=1, big_batch=2, big_length=128)
# The big train step's depth on one 80 GB device: see the docstring.
BIG_TRAIN_LAYERS = 6
TARGETS = dict(mfu_big_train=">= 0.40", mfu_qwen2_5_0_5b=">= 0.35",
               decode_vs_roofline_big_64_rows=">= 0.60",
               decode_vs_roofline_qwen2_5_0_5b=">= 0.40")


def _timed(fn, reps: int) -> float:
  """Seconds per call: `reps` calls queued back to back, then one wait."""
  jax.block_until_ready(fn())
  t = time.perf_counter()
  out = [fn() for _ in range(reps)]
  jax.block_until_ready(out)
  return (time.perf_counter() - t) / reps


def matmul_ceiling(n: int, reps: int = 10) -> float:
  """FLOP/s of an n^3 bf16 matmul with fp32 accumulation, best of 3."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
  f = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32
                                   ).astype(jnp.bfloat16))
  return max(2 * n**3 / _timed(lambda: f(a, b), reps) for _ in range(3))


def copy_bandwidth(mib: int, reps: int = 10) -> float:
  """Bytes/s of `x + 1` over a bf16 array (each byte read once, written
  once), best of 3."""
  x = jnp.zeros((mib << 19,), jnp.bfloat16)
  f = jax.jit(lambda x: x + jnp.bfloat16(1))
  return max(2 * x.nbytes / _timed(lambda: f(x), reps) for _ in range(3))


def matmul_params(cfg: ModelConfig) -> int:
  """N of the 6 N convention: layer params plus the unembedding."""
  layers = sum(x.size for x in jax.tree.leaves(
      decoder.abstract_params(cfg)["layers"]))
  return layers + cfg.vocab_size * cfg.hidden_size


def train_flops(cfg: ModelConfig, b: int, t: int, causal: bool = True):
  return common.train_flops(cfg, matmul_params(cfg), b, t, causal)


def _train_parts():
  """(mesh of one device, step config, optimizer, schedule)."""
  mesh = shd.make_mesh([("data", 1), ("fsdp", 1), ("tensor", 1)],
                       jax.devices()[:1])
  config = ml_collections.ConfigDict(dict(
      micro_batches=1, optim=optimizer.default_config(),
      loss=step_lib.default_loss_config()))
  tx, schedule = optimizer.make_optimizer(config.optim, 100)
  return mesh, config, tx, schedule


def train_memory(cfg: ModelConfig, batch: int, length: int) -> dict:
  """Per-device GiB (args, temp, peak) of the compiled train step, from
  an abstract state: nothing the size of a weight is allocated."""
  mesh, config, tx, schedule = _train_parts()
  abstract, shardings = state_lib.state_shardings(cfg, tx, mesh)
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(
      a.shape, a.dtype, sharding=s), abstract, shardings)
  step = step_lib.TrainStep(cfg, config, tx, schedule, mesh, shardings)
  fake = common.fake_batch(batch, length, cfg.vocab_size)
  return fit_programs.memory(step.lower(state, fake).compile())


def bench_train(cfg: ModelConfig, batch: int, length: int,
                steps: int) -> dict:
  """Seconds per step and the step's compiled memory."""
  mesh, config, tx, schedule = _train_parts()
  state, shardings = state_lib.create(cfg, tx, mesh)
  step = step_lib.TrainStep(cfg, config, tx, schedule, mesh, shardings)
  placed = step.place(common.fake_batch(batch, length, cfg.vocab_size))
  run = common.time_train_step(step, state, placed, steps)
  return dict(step_s=float(np.median(run.times)), compile_s=run.compile_s,
              loss=float(run.metrics["loss"]),
              temp_gib=run.memory.temp_size_in_bytes / GIB,
              args_gib=run.memory.argument_size_in_bytes / GIB)


def train_figures(cfg: ModelConfig, b: int, t: int, chip, ceilings,
                  steps: int) -> dict:
  """The train step's speed against the measured and datasheet peaks."""
  tr = bench_train(cfg, b, t, steps)
  rate = train_flops(cfg, b, t) / tr["step_s"]
  out = dict(
      train_shape=[b, t], train_layers=cfg.num_layers,
      train_tokens_s=round(b * t / tr["step_s"], 1),
      train_step_s=round(tr["step_s"], 4),
      train_tflop_s=round(rate / 1e12, 2),
      mfu_vs_matmul=round(rate / ceilings["matmul"], 3),
      train_compile_s=round(tr["compile_s"], 1),
      train_temp_gib=round(tr["temp_gib"], 2),
      train_args_gib=round(tr["args_gib"], 2), loss=round(tr["loss"], 4))
  if chip is not None:
    full = train_flops(cfg, b, t, causal=False)
    out.update(mfu=round(rate / chip.peak_bf16_flops, 3),
               mfu_full_attention=round(
                   full / tr["step_s"] / chip.peak_bf16_flops, 3))
  return out


def kv_bytes_per_slot(cfg: ModelConfig) -> int:
  """Bytes of one row's K and V at one position, all layers, bf16."""
  return cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2


def decode_bytes(cfg: ModelConfig, b: int, prompt: int, new: int) -> float:
  """Bytes read by `new` decode steps: bf16 weights (the embedding table
  only as the tied unembedding) and each step's live KV cache."""
  weights = matmul_params(cfg) * 2
  slots = sum(prompt + i for i in range(new))  # Context at each step.
  return new * weights + b * kv_bytes_per_slot(cfg) * slots


def decode_memory(cfg: ModelConfig, rows: int, context: int) -> float:
  """Bytes a decode needs at least on a GPU or TPU: the bf16 weights, the
  rows' pages (`context` tokens each, in pages of `SamplerConfig`'s size),
  read in place by the Pallas kernel, and the carried fp32 logits (as
  read, updated and written back)."""
  weights = sum(x.size for x in jax.tree.leaves(
      decoder.abstract_params(cfg))) * 2
  page = sampler_lib.SamplerConfig().page_size
  kv = rows * paged.pages_for(context, page) * page * kv_bytes_per_slot(cfg)
  return weights + kv + 3 * (rows + 1) * cfg.vocab_size * 4


@functools.partial(jax.jit, donate_argnums=(0,))
def _random_pool(dev, key):
  """A pool's state (pages, logits, stop states) with random pages and
  logits."""
  pool, logits, stop = dev
  keys = iter(jax.random.split(key, 2 * len(pool["k"]) + 1))
  rand = lambda x: jax.random.normal(next(keys), x.shape, x.dtype)
  return (dict(k=tuple(map(rand, pool["k"])), v=tuple(map(rand, pool["v"]))),
          rand(logits), stop)


def _filled(dev, rows, length: int, key) -> None:
  """Seats `rows` on `dev` as if each held `length` tokens of random
  context (their pages hold random keys and values): a decode at a long
  context without compiling the prefill's programs (whose time is not
  measured anyway)."""
  if not dev.reserve(rows, [length] * len(rows)):
    raise RuntimeError(f"{len(rows)} rows of {length} tokens do not fit "
                       "the pool")
  for r in rows:
    r.seat.tokens = [0] * length
  # pylint: disable-next=protected-access
  dev._dev = _random_pool(dev._dev, key)


def bench_decode(cfg: ModelConfig, rows: int, prompt_len: int,
                 new_tokens: int, reps: int, fill: bool = False,
                 profile_dir: str | None = None) -> dict:
  """Seconds of `new_tokens` decode steps over `rows` rows, one chunk on
  the sampler's page pool (its device, as `Sampler.generate` drives it).
  The context is a prefill of random prompts, or with `fill` random cache
  contents (`_filled`). `profile_dir`: the last chunk runs inside a
  `jax.profiler` trace (with a Perfetto JSON) written there."""
  cfg = cfg.replace(param_dtype="bfloat16")
  params = decoder.init_params(cfg, jax.random.key(0))
  sampler = sampler_lib.Sampler(params, cfg, config=sampler_lib.SamplerConfig(
      eos_ids=(), length_buckets=(prompt_len,)))
  del params  # The sampler holds its own (split) copy.
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, cfg.vocab_size, (rows, prompt_len)).tolist()
  dev = sampler.device(rows, new_tokens, prompt_len,
                       limit=prompt_len + new_tokens)
  times = []
  for _ in range(1 + reps):  # The first call compiles.
    dev.open(rows, rows)
    rows_ = [PlainRow(i, p, new_tokens) for i, p in enumerate(prompts)]
    if fill:
      _filled(dev, rows_, prompt_len, jax.random.key(1))
    else:
      dev.append(rows_, fresh=True)
    for r in rows_:
      r.length = len(r.obs)
    dev.block()
    trace = (jax.profiler.trace(profile_dir, create_perfetto_trace=True)
             if profile_dir and len(times) == reps
             else contextlib.nullcontext())
    with trace:
      t = time.perf_counter()
      out, _ = dev.decode(rows_, [Draw(0)] * rows, ())
      times.append(time.perf_counter() - t)
    dev.close()
  n = sum(len(t) for t, _, _ in out)
  if n != rows * new_tokens:
    raise RuntimeError(f"decode wrote {n} tokens, expected "
                       f"{rows * new_tokens}")
  return dict(decode_s=min(times[1:]), last_s=times[-1], tokens=n)


def decode_figures(cfg: ModelConfig, rows: int, prompt: int, new: int,
                   chip, ceilings, reps: int, fill: bool = False) -> dict:
  """Decode speed against the copy and datasheet HBM rooflines."""
  dec = bench_decode(cfg, rows, prompt, new, reps, fill)
  tok_s = dec["tokens"] / dec["decode_s"]
  nbytes = decode_bytes(cfg, rows, prompt, new)
  roof_s = lambda bw: dec["tokens"] / (nbytes / bw)
  out = dict(
      decode_shape=[rows, prompt, new], decode_tokens_s=round(tok_s, 1),
      decode_step_ms=round(1e3 * dec["decode_s"] / new, 3),
      decode_gib_per_step=round(nbytes / new / GIB, 3),
      decode_vs_copy_roofline=round(tok_s / roof_s(ceilings["copy"]), 3))
  if chip is not None:
    out.update(decode_roofline_tokens_s=round(roof_s(chip.hbm_bytes_s), 1),
               decode_vs_roofline=round(tok_s / roof_s(chip.hbm_bytes_s), 3))
  return out


def model_config(name: str, args, **overrides) -> ModelConfig:
  base = dict(dtype="bfloat16", param_dtype="float32", remat=args.remat,
              attention_impl=args.attention_impl)
  if args.small:
    base.update(SMALL)
  return presets.get_preset(name, **{**base, **overrides})


def bench_model(name: str, args, chip, ceilings) -> dict:
  """Train and decode of one preset at the flags' shapes."""
  cfg = model_config(name, args)
  out = dict(model=name, matmul_params_m=round(matmul_params(cfg) / 1e6, 1))
  out.update(train_figures(cfg, args.batch, args.length, chip, ceilings,
                           args.steps))
  out.update(decode_figures(cfg, args.decode_batch, args.prompt_len,
                            args.new_tokens, chip, ceilings, args.steps))
  print(json.dumps(out), flush=True)
  return out


def _ints(text: str) -> list[int]:
  return [int(x) for x in text.split(",") if x]


def bench_big_decode(args, chip, ceilings) -> list[dict]:
  """The big model whole (all its layers, bf16) at each rows x context;
  a case the device cannot hold (`decode_memory`) is skipped, saying
  what it needs."""
  cfg = model_config(args.big_model, args)
  limit = fit_programs.device_memory_limit()
  out = []
  for rows in _ints(args.big_rows):
    for context in _ints(args.big_contexts):
      need = decode_memory(cfg, rows, context + args.big_new_tokens)
      case = dict(model=args.big_model, layers=cfg.num_layers,
                  need_gib=round(need / GIB, 1))
      if limit and need > limit:
        case.update(decode_shape=[rows, context, args.big_new_tokens],
                    skipped=f"needs ~{need / GIB:.0f} GiB, the device "
                            f"gives {limit / GIB:.0f} GiB")
      else:
        case.update(_unless_oom(lambda: decode_figures(
            cfg, rows, context, args.big_new_tokens, chip, ceilings,
            args.steps, fill=True)))
      print(json.dumps(case), flush=True)
      out.append(case)
  return out


def bench_big_train(args, chip, ceilings) -> dict:
  """The big model's width at `big_train_layers` layers."""
  cfg = model_config(args.big_model, args, num_layers=args.big_train_layers,
                     remat=args.big_remat)
  out = dict(model=args.big_model,
             matmul_params_m=round(matmul_params(cfg) / 1e6, 1),
             remat=args.big_remat)
  out.update(_unless_oom(lambda: train_figures(
      cfg, args.big_batch, args.big_length, chip, ceilings, args.steps)))
  print(json.dumps(out), flush=True)
  return out


def _unless_oom(fn) -> dict:
  """`fn()`, or where the device ran out of memory what it said: the
  other cases still run."""
  try:
    return fn()
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    return dict(out_of_memory=str(e).splitlines()[0][:300])


def plan(args, n: int = 2, m: int = 4) -> dict:
  """The big model's train step compiled at `n` and `m` layers from
  abstract inputs (nothing allocated), extrapolated linearly (the layers
  are scanned): the deepest step within 90% of `plan_hbm_gib`."""
  at = [train_memory(model_config(args.big_model, args, num_layers=k,
                                  remat=args.big_remat),
                     args.big_batch, args.big_length) for k in (n, m)]
  per_layer = (at[1]["peak"] - at[0]["peak"]) / (m - n)
  depth = int((0.9 * args.plan_hbm_gib - at[0]["peak"]) // per_layer) + n
  return dict(benchmark="accelerator_plan", backend=jax.default_backend(),
              model=args.big_model, remat=args.big_remat,
              train_shape=[args.big_batch, args.big_length],
              attention_impl_resolved=attention.resolve(
                  model_config(args.big_model, args), args.big_length),
              gib_by_layers={k: {f: round(v, 2) for f, v in a.items()}
                             for k, a in zip((n, m), at)},
              peak_gib_per_layer=round(per_layer, 2),
              hbm_gib=args.plan_hbm_gib, layers_within_90pct=depth)


def parse_args():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--models", default="qwen2_5_0_5b,smollm2_135m",
                 help="presets trained and decoded at the shapes below; "
                      "'' for none")
  p.add_argument("--attention_impl", default="auto",
                 help="ModelConfig.attention_impl for every model")
  common.int_flags(p, batch=8, length=2048)
  p.add_argument("--remat", default="none")
  common.int_flags(p, steps=5, decode_batch=64, prompt_len=256,
                   new_tokens=256, matmul_n=8192, copy_mib=2048)
  p.add_argument("--big_model", default="qwen2_5_7b",
                 help="the big cases' preset; '' for none")
  p.add_argument("--big_rows", default="64,256")
  p.add_argument("--big_contexts", default="512,4096")
  common.int_flags(p, big_new_tokens=128, big_train_layers=BIG_TRAIN_LAYERS,
                   big_batch=8, big_length=2048)
  p.add_argument("--big_remat", default="full",
                 help="without it 16k tokens keep ~24 GiB a layer")
  common.int_flags(p, plan_hbm_gib=0)
  p.add_argument("--small", action="store_true",
                 help="CPU sizes (always on when the backend is a CPU)")
  args = p.parse_args()
  if jax.default_backend() == "cpu" and not args.plan_hbm_gib:
    args.small = True
  if args.small:
    for k, v in SMALL_SIZES.items():
      if p.get_default(k) == getattr(args, k):
        setattr(args, k, v)
  return args


def main():
  args = parse_args()
  if args.plan_hbm_gib:
    print(json.dumps(plan(args)))
    return
  dev = jax.devices()[0]
  chip = chips.detect(dev.device_kind) if dev.platform != "cpu" else None
  ceilings = dict(matmul=matmul_ceiling(args.matmul_n),
                  copy=copy_bandwidth(args.copy_mib))
  models = [n for n in args.models.split(",") if n]
  first = models[0] if models else args.big_model or "qwen2_5_0_5b"
  result = dict(
      benchmark="accelerator", backend=jax.default_backend(),
      device_kind=dev.device_kind, chip=chip and chip.name,
      small=args.small, small_overrides=SMALL if args.small else None,
      attention_impl=args.attention_impl,
      attention_impl_resolved=attention.resolve(
          presets.get_preset(first, attention_impl=args.attention_impl),
          args.length),
      remat=args.remat,
      train_shape=[args.batch, args.length],
      decode_shape=[args.decode_batch, args.prompt_len, args.new_tokens],
      measured_matmul_tflop_s=round(ceilings["matmul"] / 1e12, 2),
      measured_copy_gb_s=round(ceilings["copy"] / 1e9, 1),
      flops_convention="6*N*tokens + causal attention 6*L*heads*head_dim*"
                       "T^2*B; N = layer params + V*D unembedding",
      decode_convention="roofline = (bf16 weights + live KV cache) bytes "
                        "per step / HBM bytes/s; decode time excludes "
                        "prefill")
  if chip is not None:
    result.update(peak_bf16_tflop_s=chip.peak_bf16_flops / 1e12,
                  hbm_tb_s=chip.hbm_bytes_s / 1e12,
                  matmul_vs_peak=round(ceilings["matmul"]
                                       / chip.peak_bf16_flops, 3))
  t = time.perf_counter()
  result["models"] = [bench_model(n, args, chip, ceilings) for n in models]
  if args.big_model:
    result["big_decode"] = bench_big_decode(args, chip, ceilings)
    result["big_train"] = bench_big_train(args, chip, ceilings)
  result["wall_s"] = round(time.perf_counter() - t, 1)
  result["targets"] = TARGETS
  print(json.dumps(result))


if __name__ == "__main__":
  main()
