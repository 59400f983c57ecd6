"""Train-step throughput and memory: SmolLM2-135M, clipped surrogate.

  python benchmarks/train_step.py [--batch=8 --length=512 --remat=dots
                                   --chunk=128 --micro_batches=4 --steps=2
                                   --attn_query_block=128 --dtype=float32
                                   --allocator=tcmalloc]

Reports tokens/s; model FLOP/s (6 * params * tokens + attention, for the
forward and backward passes; attention counted whole, and causal-half in
a second figure) as a fraction of a peak measured in the same run (a
large `jnp.dot` of the same dtype on the same device, timed before,
between and after the steps, the best counts); the step's
compiled memory (`memory_analysis`) and the process's peak RSS; and the
compiled memory of chunked vs naive token log-probs (their gradient) at
B=4, T=1024, V=49,152. The last line printed is one JSON object.
"""

import argparse
import ctypes.util
import functools
import json
import os
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from swirl_jax import paths
from swirl_jax import sharding as shd
from swirl_jax.models import gguf_io
from swirl_jax.models import presets
from swirl_jax.ops import logprobs as lp_ops
from swirl_jax.training import optimizer
from swirl_jax.training import state as state_lib
from swirl_jax.training import step as step_lib
from swirl_jax.training import trainer

import common  # pylint: disable=g-bad-import-order

GIB = 1 << 30


def matmul_peak(dtype, n: int = 2048, reps: int = 5) -> float:
  """Best FLOP/s of an n x n x n `jnp.dot` on the default device."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  f = jax.jit(jnp.dot)
  f(a, a).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t = time.perf_counter()
    f(a, a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * n**3 / best


def load_model(dtype: str, remat: str, **overrides):
  overrides = dict(dtype=dtype, remat=remat, **overrides)
  try:
    cfg, params = gguf_io.load_gguf(paths.smollm2_gguf_path(),
                                    param_dtype="float32", **overrides)
    return cfg, params, "gguf"
  except FileNotFoundError:  # Same shapes, random weights.
    cfg = presets.get_preset("smollm2_135m", **overrides)
    return cfg, None, "random"


def bench_step(args) -> dict:
  cfg, params, source = load_model(args.dtype, args.remat,
                                   attn_query_block=args.attn_query_block)
  mesh = shd.make_mesh([("data", -1), ("fsdp", 1), ("tensor", 1)])
  config = trainer.default_config()
  config.loss.chunk_size = args.chunk
  config.micro_batches = args.micro_batches
  tx, schedule = optimizer.make_optimizer(config.optim, 100)
  state, shardings = state_lib.create(cfg, tx, mesh, params=params)
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  step = step_lib.TrainStep(cfg, config, tx, schedule, mesh, shardings)
  batch = common.fake_batch(args.batch, args.length, cfg.vocab_size)

  # The peak is measured before, between and after the steps and the best
  # is kept: a transient slowdown of a shared machine then lowers the
  # step's figure, never the peak it is compared with.
  peaks = [matmul_peak(jnp.dtype(args.dtype))]
  run = common.time_train_step(
      step, state, batch, args.steps,
      after_step=lambda: peaks.append(matmul_peak(jnp.dtype(args.dtype))))
  times, mem, m = run.times, run.memory, run.metrics
  step_s = float(np.median(times))
  flops = common.train_flops(cfg, n_params, args.batch, args.length, False)
  causal_flops = common.train_flops(cfg, n_params, args.batch, args.length,
                                    True)
  peak = max(peaks)
  return dict(
      weights=source, n_params=int(n_params), batch=args.batch,
      length=args.length, remat=args.remat, chunk=args.chunk,
      attn_query_block=args.attn_query_block,
      micro_batches=args.micro_batches,
      dtype=args.dtype, device=str(jax.devices()[0].platform),
      compile_s=round(run.compile_s, 1), step_s=round(step_s, 3),
      step_times_s=[round(x, 3) for x in times],
      tokens_per_s=round(args.batch * args.length / step_s, 1),
      model_tflop_per_step=round(flops / 1e12, 3),
      achieved_gflop_s=round(flops / step_s / 1e9, 1),
      matmul_peak_gflop_s=round(peak / 1e9, 1),
      matmul_peaks_gflop_s=[round(x / 1e9, 1) for x in peaks],
      fraction_of_peak=round(flops / step_s / peak, 3),
      fraction_of_peak_causal_attention=round(causal_flops / step_s / peak,
                                              3),
      step_temp_gib=round(mem.temp_size_in_bytes / GIB, 3),
      step_args_gib=round(mem.argument_size_in_bytes / GIB, 3),
      step_peak_gib=round((mem.temp_size_in_bytes + mem.argument_size_in_bytes
                           + mem.output_size_in_bytes
                           - mem.alias_size_in_bytes) / GIB, 3),
      loss=float(m["loss"]), grad_norm=float(m["grad_norm"]))


def logprob_memory(b=4, t=1024, v=49152, d=576, chunk=128) -> dict:
  """Compiled temp memory of d(sum logp)/d(hidden, W): chunked vs naive."""
  h = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
  w = jax.ShapeDtypeStruct((d, v), jnp.float32)
  tg = jax.ShapeDtypeStruct((b, t), jnp.int32)
  unembed = lambda w, h: h @ w

  def temp(fn):
    loss = lambda w, h, tg: jnp.sum(fn(w, h, tg, unembed)[0])
    c = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(w, h, tg).compile()
    return c.memory_analysis().temp_size_in_bytes

  chunked = temp(functools.partial(lp_ops.token_logprobs, chunk_size=chunk))
  naive = temp(lp_ops.token_logprobs_naive)
  return dict(logprob_chunked_temp_gib=round(chunked / GIB, 3),
              logprob_naive_temp_gib=round(naive / GIB, 3),
              logprob_chunked_over_naive=round(chunked / naive, 3))


def use_tcmalloc(allocator: str) -> str:
  """Re-runs this script under tcmalloc when asked and installed.

  XLA's CPU runtime allocates the step's temporaries (GiBs) afresh on each
  call; glibc returns blocks that large to the OS and the next step faults
  its pages in again, while tcmalloc keeps them. Here that took 5-15% off
  a step (`apt-get install libtcmalloc-minimal4`). Returns the allocator
  in use.
  """
  if "tcmalloc" in os.environ.get("LD_PRELOAD", ""):
    return "tcmalloc"
  lib = ctypes.util.find_library("tcmalloc_minimal")
  if allocator == "system" or lib is None:
    return "system"
  preload = " ".join(filter(None, [lib, os.environ.get("LD_PRELOAD")]))
  sys.stdout.flush()
  os.execve(sys.executable, [sys.executable, *sys.argv],
            dict(os.environ, LD_PRELOAD=preload))


def main():
  p = argparse.ArgumentParser()
  common.int_flags(p, batch=8, length=512)
  # 'none' needs ~15 GiB here; 'dots' recomputes only attention.
  p.add_argument("--remat", default="dots")
  common.int_flags(
      p, chunk=128,
      # Gradient accumulation: on this 2-core CPU a micro-batch of 2 rows
      # ran fastest per token (8 rows at once: 1.5x slower per token; the
      # working set outgrows the caches).
      micro_batches=4, attn_query_block=128, steps=2)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--skip_logprobs", action="store_true")
  p.add_argument("--allocator", choices=("tcmalloc", "system"),
                 default="tcmalloc")
  args = p.parse_args()
  allocator = use_tcmalloc(args.allocator)
  out = dict(allocator=allocator, **bench_step(args))
  if not args.skip_logprobs:
    out.update(logprob_memory())
  out["process_peak_rss_gib"] = round(
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, 3)
  out["targets"] = dict(fraction_of_peak=">= 0.65", step_peak_gib="<= 10",
                        logprob_chunked_over_naive="<= 0.25")
  print(json.dumps(out))


if __name__ == "__main__":
  main()
