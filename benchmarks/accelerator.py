r"""Train-step MFU and decode speed against the chip's roofline, on one device.

Random-weight models shaped like Qwen2.5-0.5B and SmolLM2-135M, through the
project's own train step (`TrainStep`, `state.create`; clipped surrogate,
AdamW, fp32 master weights, bf16 compute) and sampler (`Sampler`, bf16
weights and cache, greedy, EOS off so every row writes every token).

  python benchmarks/accelerator.py [--models=qwen2_5_0_5b,smollm2_135m]
      [--attention_impl=auto] [--batch=8 --length=2048 --remat=none]
      [--decode_batch=64 --prompt_len=256 --new_tokens=256] [--small]

Conventions:
  train FLOPs per step = 6 * N * tokens + attention, where N counts the
    weights of every matmul (all layer params plus the V x D unembedding;
    the embedding lookup is no matmul) and attention is
    12 * layers * heads * head_dim * T^2 * B / 2 (QK^T and PV, forward and
    backward, the causal half: MaxText's convention). `mfu` divides by the
    datasheet peak bf16 FLOP/s of the chip (swirl_jax/chips.py),
    `mfu_vs_matmul` by the rate of a big bf16 matmul measured in this run;
    `mfu_full_attention` counts all T^2 scores (PaLM's convention).
  decode roofline = bytes read per decode step (all bf16 weights but the
    embedding table, plus the live KV cache: each row's filled slots) over
    HBM bandwidth, summed over the steps; `decode_vs_roofline` against the
    datasheet bandwidth, `decode_vs_copy_roofline` against a device copy's
    bandwidth measured in this run. Decode time excludes the prefill.
On a CPU it runs 2-layer, small-vocabulary stand-ins at small sizes and
says so (`"backend": "cpu", "small": true`); there is no datasheet peak
then, only the measured ceilings. The last line printed is one JSON object.
"""

import argparse
import dataclasses
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
from swirl_jax import sharding as shd
from swirl_jax.models import attention, decoder, presets
from swirl_jax.models.config import ModelConfig
from swirl_jax.sampling import sampler as sampler_lib
from swirl_jax.sampling.device import Draw, SlotRow
from swirl_jax.training import optimizer
from swirl_jax.training import state as state_lib
from swirl_jax.training import step as step_lib

import common  # pylint: disable=g-bad-import-order

GIB = 1 << 30
# CPU stand-ins: the presets' widths, 2 layers, a small vocabulary.
SMALL = dict(num_layers=2, vocab_size=4096)
SMALL_SIZES = dict(batch=2, length=128, decode_batch=4, prompt_len=32,
                   new_tokens=32, steps=2, matmul_n=1024, copy_mib=64)


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


def bench_train(cfg: ModelConfig, args) -> dict:
  """Seconds per step and the step's compiled memory."""
  mesh = shd.make_mesh([("data", 1), ("fsdp", 1), ("tensor", 1)],
                       jax.devices()[:1])
  config = ml_collections.ConfigDict(dict(
      micro_batches=1, optim=optimizer.default_config(),
      loss=step_lib.default_loss_config()))
  tx, schedule = optimizer.make_optimizer(config.optim, 100)
  state, shardings = state_lib.create(cfg, tx, mesh)
  step = step_lib.TrainStep(cfg, config, tx, schedule, mesh, shardings)
  batch = step.place(common.fake_batch(args.batch, args.length,
                                       cfg.vocab_size))
  run = common.time_train_step(step, state, batch, args.steps)
  return dict(step_s=float(np.median(run.times)), compile_s=run.compile_s,
              loss=float(run.metrics["loss"]),
              temp_gib=run.memory.temp_size_in_bytes / GIB,
              args_gib=run.memory.argument_size_in_bytes / GIB)


def decode_bytes(cfg: ModelConfig, b: int, prompt: int, new: int) -> float:
  """Bytes read by `new` decode steps: bf16 weights (the embedding table
  only as the tied unembedding) and each step's live KV cache."""
  weights = matmul_params(cfg) * 2
  per_slot = b * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2
  slots = sum(prompt + i for i in range(new))  # Context at each step.
  return new * weights + per_slot * slots


def bench_decode(cfg: ModelConfig, args) -> dict:
  """Seconds of `new_tokens` decode steps over `decode_batch` rows, on
  the sampler's slot cache (its device, as the engine drives it)."""
  cfg = cfg.replace(param_dtype="bfloat16")
  params = decoder.init_params(cfg, jax.random.key(0))
  sampler = sampler_lib.Sampler(params, cfg, config=sampler_lib.SamplerConfig(
      eos_ids=(), length_buckets=(args.prompt_len,)))
  rng = np.random.default_rng(0)
  prompts = rng.integers(3, cfg.vocab_size,
                         (args.decode_batch, args.prompt_len)).tolist()
  dev = sampler.device(args.decode_batch, args.new_tokens, args.prompt_len,
                       limit=args.prompt_len + args.new_tokens)
  times = []
  for _ in range(1 + args.steps):  # The first call compiles.
    dev.open(len(prompts), len(prompts))
    rows = [SlotRow(i, p, args.new_tokens) for i, p in enumerate(prompts)]
    dev.append(rows, fresh=True)
    for r in rows:
      r.length = len(r.obs)
    dev.block()
    t = time.perf_counter()
    out, _ = dev.decode(rows, [Draw(0)] * len(rows), ())
    times.append(time.perf_counter() - t)
    dev.close()
  n = sum(len(t) for t, _, _ in out)
  if n != args.decode_batch * args.new_tokens:
    raise RuntimeError(f"decode wrote {n} tokens, expected "
                       f"{args.decode_batch * args.new_tokens}")
  return dict(decode_s=min(times[1:]), tokens=n)


def bench_model(name: str, args, chip, ceilings) -> dict:
  overrides = dict(dtype="bfloat16", param_dtype="float32", remat=args.remat,
                   attention_impl=args.attention_impl)
  if args.small:
    overrides.update(SMALL)
  cfg = presets.get_preset(name, **overrides)
  tr = bench_train(cfg, args)
  flops = train_flops(cfg, args.batch, args.length)
  full = train_flops(cfg, args.batch, args.length, causal=False)
  rate = flops / tr["step_s"]
  dec = bench_decode(cfg, args)
  tok_s = dec["tokens"] / dec["decode_s"]
  nbytes = decode_bytes(cfg, args.decode_batch, args.prompt_len,
                        args.new_tokens)
  roof_s = lambda bw: dec["tokens"] / (nbytes / bw)
  out = dict(
      model=name, matmul_params_m=round(matmul_params(cfg) / 1e6, 1),
      train_tokens_s=round(args.batch * args.length / tr["step_s"], 1),
      train_step_s=round(tr["step_s"], 4),
      train_tflop_s=round(rate / 1e12, 2),
      mfu_vs_matmul=round(rate / ceilings["matmul"], 3),
      train_compile_s=round(tr["compile_s"], 1),
      train_temp_gib=round(tr["temp_gib"], 2),
      train_args_gib=round(tr["args_gib"], 2), loss=round(tr["loss"], 4),
      decode_tokens_s=round(tok_s, 1),
      decode_step_ms=round(1e3 * dec["decode_s"] / args.new_tokens, 3),
      decode_gib_per_step=round(nbytes / args.new_tokens / GIB, 3),
      decode_vs_copy_roofline=round(tok_s / roof_s(ceilings["copy"]), 3))
  if chip is not None:
    out.update(mfu=round(rate / chip.peak_bf16_flops, 3),
               mfu_full_attention=round(
                   full / tr["step_s"] / chip.peak_bf16_flops, 3),
               decode_roofline_tokens_s=round(roof_s(chip.hbm_bytes_s), 1),
               decode_vs_roofline=round(tok_s / roof_s(chip.hbm_bytes_s), 3))
  print(json.dumps(out), flush=True)
  return out


def parse_args():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--models", default="qwen2_5_0_5b,smollm2_135m")
  p.add_argument("--attention_impl", default="auto",
                 help="ModelConfig.attention_impl for both models")
  common.int_flags(p, batch=8, length=2048)
  p.add_argument("--remat", default="none")
  common.int_flags(p, steps=5, decode_batch=64, prompt_len=256,
                   new_tokens=256, matmul_n=8192, copy_mib=2048)
  p.add_argument("--small", action="store_true",
                 help="CPU sizes (always on when the backend is a CPU)")
  args = p.parse_args()
  if jax.default_backend() == "cpu":
    args.small = True
  if args.small:
    for k, v in SMALL_SIZES.items():
      if p.get_default(k) == getattr(args, k):
        setattr(args, k, v)
  return args


def main():
  args = parse_args()
  dev = jax.devices()[0]
  chip = chips.detect(dev.device_kind) if dev.platform != "cpu" else None
  ceilings = dict(matmul=matmul_ceiling(args.matmul_n),
                  copy=copy_bandwidth(args.copy_mib))
  result = dict(
      benchmark="accelerator", backend=jax.default_backend(),
      device_kind=dev.device_kind, chip=chip and chip.name,
      small=args.small, small_overrides=SMALL if args.small else None,
      attention_impl=args.attention_impl,
      attention_impl_resolved=attention.resolve(
          presets.get_preset(args.models.split(",")[0],
                             attention_impl=args.attention_impl),
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
  result["models"] = [bench_model(n, args, chip, ceilings)
                      for n in args.models.split(",")]
  result["wall_s"] = round(time.perf_counter() - t, 1)
  result["targets"] = dict(mfu=">= 0.40", decode_vs_roofline=">= 0.50")
  print(json.dumps(result))


if __name__ == "__main__":
  main()
