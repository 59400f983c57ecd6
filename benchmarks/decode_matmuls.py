r"""Would fusing the projections speed up decoding? One decode step's
matmuls for SmolLM2-135M's shapes (30 layers, float32), batch 16, random
weights, three ways in one run:

  split   seven matmuls a layer, as the decoder runs them (q, k, v, o,
          gate, up, down)
  fused   four: q/k/v as one [576, 960] weight, gate/up as one [576, 3072]
  ceiling the same FLOPs at the rate of one [16, 576] x [576, 6144] matmul,
          the shape `benchmarks/sampler.py` takes its `ceiling_tok_s` from

Each is timed as the best of `--repeats` calls, the two layouts
alternating, so a busy moment hits both.

  python benchmarks/decode_matmuls.py [--batch=16] [--repeats=30] [--rounds=3]

Prints a line per round, then one JSON line.
"""

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp

import sampler as sampler_bench  # pylint: disable=g-bad-import-order

D, N, K, H, F, L = 576, 9, 3, 64, 1536, 30  # SmolLM2-135M.


def _weights(fused: bool):
  keys = iter(jax.random.split(jax.random.key(0), 7 * L))
  r = lambda *s: jax.random.normal(next(keys), s) * 0.02
  layers = []
  for _ in range(L):
    p = dict(q=r(D, N * H), k=r(D, K * H), v=r(D, K * H), o=r(N * H, D),
             gate=r(D, F), up=r(D, F), down=r(F, D))
    if fused:
      p = dict(qkv=jnp.concatenate([p.pop("q"), p.pop("k"), p.pop("v")], 1),
               gate_up=jnp.concatenate([p.pop("gate"), p.pop("up")], 1), **p)
    layers.append(p)
  return layers


def _step(layers, x):
  """The projections of one decode step (attention itself left out: a
  stand-in mixes q with k and v so none is dead code)."""
  for p in layers:
    if "qkv" in p:
      y = x @ p["qkv"]
      q, k, v = y[:, :N * H], y[:, N * H:(N + K) * H], y[:, (N + K) * H:]
    else:
      q, k, v = x @ p["q"], x @ p["k"], x @ p["v"]
    x = x + (q + jnp.tile(k + v, (1, N // K))) @ p["o"]
    if "gate_up" in p:
      gu = x @ p["gate_up"]
      gate, up = gu[:, :F], gu[:, F:]
    else:
      gate, up = x @ p["gate"], x @ p["up"]
    x = x + (jax.nn.silu(gate) * up) @ p["down"]
  return x


def _best_ms(fn, args, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn(*args).block_until_ready()
    times.append(time.perf_counter() - start)
  return 1e3 * min(times)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--repeats", type=int, default=30)
  ap.add_argument("--rounds", type=int, default=3)
  args = ap.parse_args()
  x = jax.random.normal(jax.random.key(1), (args.batch, D))
  step = jax.jit(_step)
  runs = {name: (_weights(name == "fused"), x) for name in ("split", "fused")}
  for a in runs.values():
    step(*a).block_until_ready()  # Compile.
  best = {name: float("inf") for name in runs}
  for i in range(args.rounds):
    for name, a in runs.items():
      ms = _best_ms(step, a, args.repeats)
      best[name] = min(best[name], ms)
      print(f"round {i}: {name} {ms:.2f} ms")
  flops = 2 * args.batch * L * (D * (N + 2 * K) * H + N * H * D + 3 * D * F)
  ceiling_ms = 1e3 * flops / sampler_bench.matmul_rate(args.batch)
  print(json.dumps(dict(
      benchmark="decode_matmuls", batch=args.batch,
      split_ms=round(best["split"], 2), fused_ms=round(best["fused"], 2),
      fused_speedup=round(best["split"] / best["fused"], 3),
      ceiling_ms=round(ceiling_ms, 2),
      split_of_ceiling=round(ceiling_ms / best["split"], 3),
      fused_of_ceiling=round(ceiling_ms / best["fused"], 3),
      backend=jax.default_backend())))


if __name__ == "__main__":
  main()
