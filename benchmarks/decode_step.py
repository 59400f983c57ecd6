r"""Where a decode step's time goes, with two parts against their
alternatives, in one run.

Projections: one decode step's matmuls for SmolLM2-135M's shapes (30
layers, float32), batch 16, random weights, two ways:

  split   seven matmuls a layer, as the decoder runs them (q, k, v, o,
          gate, up, down)
  fused   four: q/k/v as one [576, 960] weight, gate/up as one [576, 3072]

Truncation: top-k 50 then top-p 0.95 over 16 rows of 49,152 logits, as
`distribution.sample_tokens` draws them (from `lax.top_k` candidates)
against the same draw from a full sort of the vocabulary.

The whole step: SmolLM2-135M itself (the bundled GGUF) decoding one token
per row over 128, 256 and 1,024 tokens of context in the page pool (the
CPU path's step: prefixes gathered once a chunk), without and with the
output head (`step_S_ms`, `step_head_S_ms`); the slope over S is
attention.

Each is timed as the best of `--repeats` calls, the alternatives
alternating, so a busy moment hits both.

  python benchmarks/decode_step.py [--batch=16] [--repeats=30] [--rounds=3]

Prints a line per round, then one JSON line.
"""

import argparse
import functools
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp

from swirl_jax import paths  # pylint: disable=g-import-not-at-top
from swirl_jax.models import decoder, gguf_io, paged
from swirl_jax.sampling import decoding, distribution
from swirl_jax.sampling.sampler import SamplerConfig

import common  # pylint: disable=g-bad-import-order

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


def _draw(truncate):
  """`sample_tokens` with its truncation swapped for `truncate`."""
  def draw(logits, keys, t, k, p):
    saved, distribution._truncate = distribution._truncate, truncate
    try:
      return distribution.sample_tokens(logits, keys, t, k, p)
    finally:
      distribution._truncate = saved
  return jax.jit(draw)


def _model_steps(batch: int, repeats: int) -> dict:
  """ms of a cached one-token step, by context, without / with head: the
  CPU path's step (`decoding.chunk_model`: each layer's view of its rows'
  prefix, gathered from the pages once a chunk, read every step, the
  step's keys and values written into the view)."""
  cfg, params = gguf_io.load_gguf(paths.smollm2_gguf_path())
  params = jax.jit(decoder.split_layers)(params)
  tok = jnp.ones((batch,), jnp.int32)
  active = jnp.ones((batch,), bool)
  page, chunk = SamplerConfig().page_size, 8

  def step(head, p, views, start):
    model = decoding.chunk_model(p, cfg, start, chunk, jnp.float32)
    # Step 0 every call: the same view slot is rewritten.
    h, views = model(tok, start, active, jnp.zeros((), jnp.int32), views)
    if head:
      h = decoding._logits_at(p, cfg, h)  # pylint: disable=protected-access
      h = (jnp.argmax(h, -1), jax.nn.logsumexp(h, -1))
    return h, views

  out = {}
  for size in (128, 256, 1024):
    n = size // page + 1  # The prefix's pages, and room for the chunk.
    pool = paged.init(cfg, batch * n, page)
    rows = paged.Rows(jnp.arange(batch * n, dtype=jnp.int32).reshape(
        batch, n), jnp.full((batch,), size - 2, jnp.int32))
    views = jax.jit(lambda p, r: decoding.chunk_views(cfg, p, r, chunk))(
        pool, rows)
    for head in (False, True):
      fn = jax.jit(functools.partial(step, head), donate_argnums=1)
      state = {"views": jax.tree.map(jnp.copy, views)}

      def call():  # Each call takes the views the last one returned.
        h, state["views"] = fn(params, state["views"], rows.start_B)  # pylint: disable=cell-var-from-loop
        jax.block_until_ready(h)

      call()  # Compiles.
      name = f"step_head_{size}_ms" if head else f"step_{size}_ms"
      out[name] = round(1e3 * common.best_seconds(call, repeats), 2)
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--repeats", type=int, default=30)
  ap.add_argument("--rounds", type=int, default=3)
  args = ap.parse_args()
  x = jax.random.normal(jax.random.key(1), (args.batch, D))
  step = jax.jit(_step)
  b, v = args.batch, 49152
  draw_args = (jax.random.normal(jax.random.key(2), (b, v)) * 4,
               jax.random.split(jax.random.key(3), b), jnp.ones(b),
               jnp.full(b, 50, jnp.int32), jnp.full(b, 0.95))
  runs = {name: (step, (_weights(name == "fused"), x))
          for name in ("split", "fused")}
  runs["candidates"] = (_draw(distribution._truncate), draw_args)
  runs["sort"] = (_draw(distribution._truncate_sorted), draw_args)
  for fn, a in runs.values():
    jax.block_until_ready(fn(*a))  # Compile.
  best = {name: float("inf") for name in runs}
  for i in range(args.rounds):
    for name, (fn, a) in runs.items():
      ms = 1e3 * common.best_seconds(
          lambda: jax.block_until_ready(fn(*a)), args.repeats)  # pylint: disable=cell-var-from-loop
      best[name] = min(best[name], ms)
      print(f"round {i}: {name} {ms:.2f} ms")
  steps = _model_steps(args.batch, args.repeats)
  print(steps)
  print(json.dumps(dict(
      benchmark="decode_step", batch=args.batch,
      split_ms=round(best["split"], 2), fused_ms=round(best["fused"], 2),
      fused_speedup=round(best["split"] / best["fused"], 3),
      truncate_ms=round(best["candidates"], 2),
      peer="full-vocabulary sort", sort_ms=round(best["sort"], 2),
      truncate_speedup=round(best["sort"] / best["candidates"], 1),
      **steps, backend=jax.default_backend())))


if __name__ == "__main__":
  main()
