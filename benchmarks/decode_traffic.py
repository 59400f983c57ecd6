r"""Bytes a decode step moves, from the compiled programs' cost analysis:
the page pool against the slot cache it replaced.

The Qwen2.5-0.5B shape (24 layers, bf16 weights and cache), 64 rows of
1,024 tokens of context, compiled on the CPU from abstract inputs: nothing
is allocated or timed, so any machine gives the same figures. XLA's cost
analysis ('bytes accessed') counts a while loop's body once, so a decode
chunk is measured in its parts, each compiled alone: what it runs every
step, and what it runs once a chunk.

  pages, xla        (the CPU path) a step: `decoding.decode_step` with
                    `chunk_model`, reading each layer's gathered prefix
                    and the chunk's own buffers; once a chunk: the gather
                    of the prefix pages (`chunk_prefix`) and the store of
                    the chunk's tokens into their pages (`store_chunk`).
  pages, xla_pages  (a kernel's memory: nothing held) a step: `pages_model`,
                    the token written into its page, each layer's pages
                    gathered; nothing once a chunk.
  slots             (today's, from --before's checkout, run in its own
                    interpreter) a step: its `decoding._step` over the
                    rows' gathered copy, a cache bucket of the context and
                    the chunk (1,536 slots); once a chunk: the copy of the
                    rows out of the cache and back (`slots._gather`,
                    `slots._scatter`).

A step at a chunk of C steps moves step + once-a-chunk / C bytes (C: the
engine's 8, and 64). The floor: every matmul's weights (the layers and the
unembedding) plus the rows' live K/V, each read once. XLA:CPU counts the
whole of an operand an op scatters into or gathers from within a fusion,
so the stores and gathers once a chunk count the whole pool (here the
rows' pages alone, as a full pool would be). Prints one JSON line.

  python benchmarks/decode_traffic.py [--before=/work/main] [--rows=64]
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

CHUNKS = (8, 64)


def model(preset: str):
  return presets.get_preset(preset, dtype="bfloat16",
                            param_dtype="bfloat16")


def floor_bytes(cfg, rows: int, context: int) -> int:
  """Weights of every matmul (layers, unembedding) and the live K/V."""
  layers = sum(x.size for x in jax.tree.leaves(
      decoder.abstract_params(cfg)["layers"]))
  weights = (layers + cfg.vocab_size * cfg.hidden_size) * 2
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
  page = SamplerConfig().page_size
  params = decoding.abstract_params(cfg, split=True)
  out = {}
  for chunk in CHUNKS:
    n = paged.pages_for(context, page)
    width = n + paged.pages_for(chunk, page)
    pool = jax.eval_shape(lambda: paged.init(cfg, rows * width, page))
    table = paged.Rows(_sds((rows, width), "int32"), _sds((rows,), "int32"))
    prefix = jax.eval_shape(
        lambda p, t: decoding.chunk_prefix(cfg, p, t, chunk), pool, table)
    bufs = jax.eval_shape(lambda: decoding.chunk_buffers(cfg, rows, chunk))
    seeds, stop, carry = step_args(cfg, rows, chunk, bufs)

    def step(params, prefix, start, seeds, stop, carry):
      m = decoding.chunk_model(params, cfg, prefix, start, jnp.bfloat16)
      return decoding.decode_step(params, cfg, _sampling(seeds), stop, m,
                                  carry)

    each = bytes_of(step, params, prefix, table.start_B, seeds, stop, carry,
                    donate=(5,))
    once = (bytes_of(lambda p, t: decoding.chunk_prefix(cfg, p, t, chunk),
                     pool, table)
            + bytes_of(lambda p, t, b, n: decoding.store_chunk(p, t, b, n),
                       pool, table, bufs, _sds((rows,), "int32"),
                       donate=(0,)))
    seeds, stop, carry = step_args(cfg, rows, chunk, pool)

    def page_step(params, table, seeds, stop, carry):
      m = decoding.pages_model(params, cfg, table, "xla_pages")
      return decoding.decode_step(params, cfg, _sampling(seeds), stop, m,
                                  carry)

    direct = bytes_of(page_step, params, table, seeds, stop, carry,
                      donate=(4,))
    out[chunk] = dict(xla=each + once / chunk, xla_step=each,
                      xla_once_a_chunk=once, xla_pages=direct)
  return out


_TODAY = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    from swirl_jax.models import decoder, presets
    from swirl_jax.sampling import decoding, slots
    from swirl_jax.sampling.sampler import SamplerConfig
    from swirl_jax.shapes import bucket
    preset, rows, context, chunks = sys.argv[1], int(sys.argv[2]), \\
        int(sys.argv[3]), json.loads(sys.argv[4])
    cfg = presets.get_preset(preset, dtype="bfloat16",
                             param_dtype="bfloat16")
    sds = lambda shape, dt: jax.ShapeDtypeStruct(shape, jnp.dtype(dt))
    def cost(fn, *args, donate=()):
      c = jax.jit(fn, donate_argnums=donate).lower(*args).compile(
          ).cost_analysis()
      return float((c[0] if isinstance(c, (list, tuple)) else c)[
          "bytes accessed"])
    params = decoding.abstract_params(cfg, split=True)
    sc = SamplerConfig()
    S = sc.max_cache_len + 1
    out = {}
    for chunk in chunks:
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
      each = cost(step, params, sds((R,), "uint32"), stop, carry,
                  donate=(3,))
      once = (cost(lambda c, r: slots._gather(c, r, read), whole, i32(R))
              + cost(lambda c, s, r: slots._scatter(c, s, r), whole, sub,
                     i32(R), donate=(0,)))
      out[chunk] = dict(slots=each + once / chunk, slots_step=each,
                        slots_once_a_chunk=once, read_slots=read)
    print(json.dumps(out))
""")


def today_figures(before: str, preset: str, rows: int, context: int):
  """The slot cache's figures, in an interpreter importing `before`."""
  env = dict(os.environ, PYTHONPATH=before, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run(
      [sys.executable, "-c", _TODAY, preset, str(rows), str(context),
       json.dumps(list(CHUNKS))], cwd=before, env=env, capture_output=True,
      text=True, timeout=3600)
  if proc.returncode:
    raise RuntimeError(f"the slot cache's side failed:\n{proc.stderr[-3000:]}")
  return {int(k): v for k, v in json.loads(
      proc.stdout.strip().splitlines()[-1]).items()}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--before", default="",
                 help="a checkout with the slot cache (e.g. /work/main); "
                      "'' leaves today's figures out")
  p.add_argument("--preset", default="qwen2_5_0_5b")
  p.add_argument("--rows", type=int, default=64)
  p.add_argument("--context", type=int, default=1024)
  a = p.parse_args()
  cfg = model(a.preset)
  floor = floor_bytes(cfg, a.rows, a.context)
  ours = pages_figures(cfg, a.rows, a.context)
  today = (today_figures(a.before, a.preset, a.rows, a.context)
           if a.before else {})
  gb = lambda x: round(x / 1e9, 3)
  res = dict(benchmark="decode_traffic", preset=a.preset, rows=a.rows,
             context=a.context, dtype="bfloat16",
             floor_gb=gb(floor), live_kv_gb=gb(
                 a.rows * a.context * paged.kv_bytes_per_token(cfg)))
  for chunk in CHUNKS:
    o = ours[chunk]
    res[f"chunk_{chunk}"] = dict(
        {k: gb(v) for k, v in o.items()},
        xla_vs_floor=round(o["xla"] / floor, 3),
        xla_pages_vs_floor=round(o["xla_pages"] / floor, 3))
    if chunk in today:
      t = today[chunk]
      res[f"chunk_{chunk}"].update(
          {k: gb(v) if k != "read_slots" else v for k, v in t.items()},
          slots_vs_floor=round(t["slots"] / floor, 3),
          xla_vs_slots=round(o["xla"] / t["slots"], 3))
  for chunk in CHUNKS:
    r = res[f"chunk_{chunk}"]
    print(f"chunk of {chunk}: pages (xla) {r['xla']} GB a step, "
          f"{r['xla_vs_floor']}x the floor of {res['floor_gb']} GB; "
          f"xla_pages {r['xla_pages']} GB"
          + (f"; slots {r['slots']} GB, {r['slots_vs_floor']}x"
             if "slots" in r else ""))
  print(json.dumps(res))


if __name__ == "__main__":
  main()
