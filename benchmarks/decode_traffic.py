r"""Bytes a decode step moves, from the compiled programs' cost analysis:
the page pool against the slot cache it replaced.

The Qwen2.5-0.5B shape (24 layers), 64 rows of 1,024 tokens of context, in
bf16 (weights and cache, as on an accelerator) and in float32, compiled on
the CPU from abstract inputs: nothing is allocated or timed, so any machine
gives the same figures. XLA's cost
analysis ('bytes accessed') counts a while loop's body once, so a decode
chunk is measured in its parts, each compiled alone: what it runs every
step, and what it runs once a chunk.

  pages, xla        (the CPU path) a step: `decoding.decode_step` with
                    `chunk_model`, reading each layer's view (its prefix,
                    gathered, and the chunk's slots); once a chunk: the
                    gather of the prefix pages into the views
                    (`chunk_views`) and the store of the chunk's tokens
                    into their pages (`store_chunk`).
  pages, xla_pages  (a kernel's memory: nothing held) a step: `pages_model`,
                    the token written into its page, each layer's pages
                    gathered; nothing once a chunk.
  slots             (today's, from --before's checkout, run in its own
                    interpreter) a step: its `decoding._step` over the
                    rows' gathered copy, a cache bucket of the context and
                    the chunk (1,536 slots); once a chunk: the copy of the
                    rows out of the cache and back (`slots._gather`,
                    `slots._scatter`).

A step at a chunk of C steps moves step + once-a-chunk / C bytes; the
parts are compiled at the engine's chunk of 8 steps, and amortised over 8
and over 64. The floor: every matmul's weights (the layers and the
unembedding) plus the rows' live K/V, each read once. What a step moves
beyond the floor that is not K/V is the same on both sides: sampling
passes over the [rows, vocab] logits, and, on the CPU, the embedding
lookup counted as the whole table (XLA:CPU counts the whole of an operand
a fusion gathers from or scatters into). In bf16 XLA:CPU also converts
what its matmuls read (weights, K/V) to float32 first, each conversion
counted: float32 shows the programs' own traffic. So each side is
measured twice, at --context and at a context of one page: the difference
is what a step moves for the context, against the live K/V it adds, read
once (`kv_vs_live`), and the figure at one page, less its floor, is what
a step moves that is not K/V (`not_kv_gb`). The stores and gathers once a
chunk count the whole pool (here exactly the rows' pages), though a store
writes a chunk's tokens alone. Prints one JSON line.

  python benchmarks/decode_traffic.py [--before=OLDER_CHECKOUT] [--rows=64]
      [--context=1024] [--preset=qwen2_5_0_5b]
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import textwrap

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp

from swirl_jax.models import decoder, paged, presets
from swirl_jax.sampling import decoding
from swirl_jax.sampling.sampler import SamplerConfig

CHUNK = 8  # The engine's.
AMORTISED = (8, 64)
DTYPES = ("bfloat16", "float32")


def model(preset: str, dtype: str):
  return presets.get_preset(preset, dtype=dtype, param_dtype=dtype)


def floor_bytes(cfg, rows: int, context: int) -> int:
  """Weights of every matmul (layers, unembedding) and the live K/V."""
  layers = sum(x.size for x in jax.tree.leaves(
      decoder.abstract_params(cfg)["layers"]))
  item = jnp.dtype(cfg.dtype).itemsize
  weights = (layers + cfg.vocab_size * cfg.hidden_size) * item
  return weights + rows * context * paged.kv_bytes_per_token(cfg)


def _sds(shape, dtype):
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def bytes_of(fn, *args, donate=()) -> float:
  cost = jax.jit(fn, donate_argnums=donate).lower(*args).compile(
  ).cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["bytes accessed"])


def step_args(cfg, rows: int, chunk: int, kv):
  """Abstract (seeds, stop spec, carry) of one decode step."""
  R, V = rows, cfg.vocab_size
  i32 = lambda *s: _sds(s, "int32")
  stop = decoding.StopSpec(i32(R), i32(8), _sds((16, V), "int16"))
  carry = (i32(), kv, _sds((R, V), "float32"), i32(R), _sds((R,), bool),
           i32(R), i32(R, chunk), _sds((R, chunk), "float32"), i32(R), i32(R))
  return _sds((R,), "uint32"), stop, carry


def _sampling(seeds):
  n = seeds.shape[0]
  keys = jax.vmap(jax.random.key)(seeds)
  return decoding.SamplingParams(keys, jnp.ones(n), jnp.zeros(n, jnp.int32),
                                 jnp.ones(n))


def pages_figures(cfg, rows: int, context: int) -> dict:
  """Bytes of a step at a chunk of `CHUNK`: the xla path's step and once
  a chunk, and the xla_pages path's step."""
  page, chunk = SamplerConfig().page_size, CHUNK
  params = decoding.abstract_params(cfg, split=True)
  n = paged.pages_for(context, page)
  width = n + paged.pages_for(chunk, page)
  pool = jax.eval_shape(lambda: paged.init(cfg, rows * width, page))
  table = paged.Rows(_sds((rows, width), "int32"), _sds((rows,), "int32"))
  views_of = lambda p, t: decoding.chunk_views(cfg, p, t, chunk)
  views = jax.eval_shape(views_of, pool, table)
  seeds, stop, carry = step_args(cfg, rows, chunk, views)

  def step(params, start, seeds, stop, carry):
    m = decoding.chunk_model(params, cfg, start, chunk, jnp.dtype(cfg.dtype))
    return decoding.decode_step(params, cfg, _sampling(seeds), stop, m,
                                carry)

  each = bytes_of(step, params, table.start_B, seeds, stop, carry,
                  donate=(4,))
  once = (bytes_of(views_of, pool, table)
          + bytes_of(lambda p, t, v, n: decoding.store_chunk(p, t, v, n,
                                                             chunk),
                     pool, table, views, _sds((rows,), "int32"),
                     donate=(0,)))
  seeds, stop, carry = step_args(cfg, rows, chunk, pool)

  def page_step(params, table, seeds, stop, carry):
    m = decoding.pages_model(params, cfg, table, "xla_pages")
    return decoding.decode_step(params, cfg, _sampling(seeds), stop, m,
                                carry)

  direct = bytes_of(page_step, params, table, seeds, stop, carry,
                    donate=(4,))
  return dict(xla_step=each, xla_once_a_chunk=once, xla_pages_step=direct)


_TODAY = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    from swirl_jax.models import decoder, presets
    from swirl_jax.sampling import decoding, slots
    from swirl_jax.sampling.sampler import SamplerConfig
    from swirl_jax.shapes import bucket
    preset, rows, context, chunk, dtype = sys.argv[1], int(sys.argv[2]), \\
        int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    cfg = presets.get_preset(preset, dtype=dtype, param_dtype=dtype)
    sds = lambda shape, dt: jax.ShapeDtypeStruct(shape, jnp.dtype(dt))
    def cost(fn, *args, donate=()):
      c = jax.jit(fn, donate_argnums=donate).lower(*args).compile(
          ).cost_analysis()
      return float((c[0] if isinstance(c, (list, tuple)) else c)[
          "bytes accessed"])
    params = decoding.abstract_params(cfg, split=True)
    sc = SamplerConfig()
    S = sc.max_cache_len + 1
    read = min(bucket(context + chunk, sc.cache_buckets), S)
    def blank(b, s):
      c = decoder.init_cache(cfg, b, s)
      c["index"] = jnp.zeros((b,), jnp.int32)
      return c
    sub = jax.eval_shape(lambda: blank(rows, read))
    whole = jax.eval_shape(lambda: blank(rows + 1, S))
    R, V = rows, cfg.vocab_size
    i32 = lambda *s: sds(s, "int32")
    stop = decoding.StopSpec(i32(R), i32(8), sds((16, V), "int16"))
    carry = (i32(), sub, sds((R, V), "float32"), i32(R), sds((R,), bool),
             i32(R), i32(R, chunk), sds((R, chunk), "float32"), i32(R),
             i32(R))
    def step(params, seeds, stop, carry):
      n = seeds.shape[0]
      sp = decoding.SamplingParams(jax.vmap(jax.random.key)(seeds),
                                   jnp.ones(n), jnp.zeros(n, jnp.int32),
                                   jnp.ones(n))
      return decoding._step(params, cfg, sp, stop, carry)
    each = cost(step, params, sds((R,), "uint32"), stop, carry, donate=(3,))
    once = (cost(lambda c, r: slots._gather(c, r, read), whole, i32(R))
            + cost(lambda c, s, r: slots._scatter(c, s, r), whole, sub,
                   i32(R), donate=(0,)))
    out = dict(slots_step=each, slots_once_a_chunk=once, read_slots=read)
    print(json.dumps(out))
""")


def today_figures(before: str, preset: str, rows: int, context: int,
                  dtype: str) -> dict:
  """The slot cache's figures, in an interpreter importing `before`."""
  env = dict(os.environ, PYTHONPATH=before, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run(
      [sys.executable, "-c", _TODAY, preset, str(rows), str(context),
       str(CHUNK), dtype], cwd=before, env=env, capture_output=True,
      text=True, timeout=3600)
  if proc.returncode:
    raise RuntimeError(f"the slot cache's side failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def per_step(parts: dict, name: str, chunk: int) -> float:
  """A step's bytes at a chunk of `chunk` steps."""
  return parts[f"{name}_step"] + parts.get(f"{name}_once_a_chunk", 0) / chunk


def side_by_side(preset: str, cfg, rows: int, context: int,
                 before: str) -> dict:
  """Every figure of one dtype: each side's parts at `context` and at one
  page of context, a step amortised over each of `AMORTISED` chunks, its
  ratio to the floor, and the ratio of what it moves for the context to
  the live K/V the context adds, and what it moves beyond the floor at
  one page of context, none of it K/V (in `preset`'s config `cfg`)."""
  page = SamplerConfig().page_size
  floor = floor_bytes(cfg, rows, context)
  floor_short = floor_bytes(cfg, rows, page)
  added = rows * (context - page) * paged.kv_bytes_per_token(cfg)
  parts = {c: pages_figures(cfg, rows, c) for c in (context, page)}
  names = ["xla", "xla_pages"]
  if before:
    for c in (context, page):
      parts[c].update(today_figures(before, preset, rows, c, cfg.dtype))
    names.append("slots")
  gb = lambda x: round(x / 1e9, 3)
  out = dict(floor_gb=gb(floor), live_kv_gb=gb(
      rows * context * paged.kv_bytes_per_token(cfg)),
             parts_gb={k: gb(v) if k != "read_slots" else v
                       for k, v in parts[context].items()})
  for chunk in AMORTISED:
    for name in names:
      b = per_step(parts[context], name, chunk)
      short = per_step(parts[page], name, chunk)
      out[f"{name}_gb_chunk_{chunk}"] = gb(b)
      out[f"{name}_vs_floor_chunk_{chunk}"] = round(b / floor, 3)
      out[f"{name}_kv_vs_live_chunk_{chunk}"] = round((b - short) / added, 3)
      # What a step moves beyond the floor at one page of context: not K/V.
      out[f"{name}_not_kv_gb_chunk_{chunk}"] = gb(short - floor_short)
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--before", default="",
                 help="a checkout with the slot cache (e.g. a worktree of "
                      "an older commit); '' leaves today's figures out")
  p.add_argument("--preset", default="qwen2_5_0_5b")
  p.add_argument("--rows", type=int, default=64)
  p.add_argument("--context", type=int, default=1024)
  p.add_argument("--dtypes", default=",".join(DTYPES))
  a = p.parse_args()
  res = dict(benchmark="decode_traffic", preset=a.preset, rows=a.rows,
             context=a.context, page_size=SamplerConfig().page_size,
             chunk_compiled=CHUNK)
  for dtype in a.dtypes.split(","):
    r = res[dtype] = side_by_side(a.preset, model(a.preset, dtype), a.rows,
                                  a.context, a.before)
    for chunk in AMORTISED:
      line = (f"{dtype}, chunk of {chunk}: pages (xla) "
              f"{r[f'xla_gb_chunk_{chunk}']} GB a step, "
              f"{r[f'xla_vs_floor_chunk_{chunk}']}x the floor of "
              f"{r['floor_gb']} GB, its context's K/V "
              f"{r[f'xla_kv_vs_live_chunk_{chunk}']}x the live K/V, "
              f"{r[f'xla_not_kv_gb_chunk_{chunk}']} GB beyond the floor "
              f"not K/V; "
              f"xla_pages {r[f'xla_pages_gb_chunk_{chunk}']} GB")
      if a.before:
        line += (f"; slots {r[f'slots_gb_chunk_{chunk}']} GB, "
                 f"{r[f'slots_vs_floor_chunk_{chunk}']}x, K/V "
                 f"{r[f'slots_kv_vs_live_chunk_{chunk}']}x")
      print(line, flush=True)
  print(json.dumps(res))


if __name__ == "__main__":
  main()
