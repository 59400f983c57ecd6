r"""Greedy decoding speed of swirl_jax's sampler against `transformers`.

SmolLM2-135M-Instruct (the bundled GGUF), float32, batch 16, prompts of 64
tokens, 128 new tokens, greedy, EOS off so every row writes all 128. Both
sides are timed on a whole `generate` (prefill + decode) after a warm-up
call that compiles. The peer is `transformers` `generate` on PyTorch, on the
same weights exported with `hf_io.export_hf_dir`, on 2 threads. Also times
`extend` with a 64-token observation after 256 and after 2,048 tokens of
context: earlier context is not recomputed (that would cost ~33x the
projections), so what grows is attention over the longer cache alone;
`extend_flop_ratio` is the ratio of the two extends' FLOPs, the floor the
measured `extend_ratio` would reach were attention as fast a FLOP as the
projections.
Also reports two ceilings: the tokens/s if every matmul ran at the rate
this machine's XLA gives one matmul of its shape repeated on the same
weights (`ceiling_tok_s`, the weights in cache), and if generation cost
only the model's own matmuls, all its weights read from memory once a
decode step as decoding reads them (`chain_ceiling_tok_s`); `of_ceiling`
and `of_chain_ceiling` are ours over each.

  python benchmarks/sampler.py [--batch=16] [--repeats=3]
      [--tunix-python=/path/to/python]

`extend` runs on the page pool, as the rollout engine appends a tool's
observation (`Device.append`).

`--tunix-python` adds Tunix's sampler as a second peer, run in that
interpreter on a randomly initialised Llama 3 model of the same shape.
Prints a summary, then one JSON line.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np

from swirl_jax import paths
from swirl_jax.models import decoder, gguf_io, hf_io
from swirl_jax.sampling import sampler as sampler_lib
from swirl_jax.sampling.device import PlainRow

import common  # pylint: disable=g-bad-import-order


def matmul_rate(m: int, k: int = 576, n: int = 6144, repeats: int = 10):
  """Best FLOP/s of an [m, k] x [k, n] float32 matmul (one layer's worth of
  SmolLM2 weights), the product decoding `m` rows is made of."""
  a = jax.random.normal(jax.random.key(0), (m, k))
  b = jax.random.normal(jax.random.key(1), (k, n))
  f = jax.jit(jnp.dot)
  seconds = common.best_seconds(lambda: f(a, b).block_until_ready(), repeats)
  return 2 * m * k * n / seconds


def ceiling_tok_s(cfg, params, batch: int, prompt_len: int,
                  new_tokens: int) -> dict:
  """Tokens/s if every matmul ran at the rate measured for its shape here:
  prefill at the rate of `batch * prompt_len` rows, each decode step at
  that of `batch` rows; 2 FLOP per weight per token (attention left out)."""
  layers = sum(x.size for x in jax.tree.leaves(params["layers"]))
  head = cfg.vocab_size * cfg.hidden_size  # Prefill: last positions only.
  prefill_rate = matmul_rate(min(batch * prompt_len, 1024))
  step_rate = matmul_rate(batch)
  seconds = (2 * (layers * prompt_len + head) * batch / prefill_rate
             + new_tokens * 2 * (layers + head) * batch / step_rate)
  return dict(matmul_gflop_s_prefill_rows=round(prefill_rate / 1e9, 1),
              matmul_gflop_s_decode_rows=round(step_rate / 1e9, 1),
              ceiling_tok_s=round(batch * new_tokens / seconds, 1))


def model_matrices(cfg, params) -> list:
  """The model's matmul weights as [in, out] matrices, one per layer and
  projection (each its own array, as a decode step reads them), then the
  output head's [D, V]."""
  D, mats = cfg.hidden_size, []
  for w in jax.tree.leaves(params["layers"]):  # Stacked: [L, ...].
    dims = w.shape[1:]
    if len(dims) < 2 or D not in (dims[0], dims[-1]):
      continue  # Norm scales, biases.
    fan_in = D if dims[0] == D else int(np.prod(dims[:-1]))
    mats += [w[i].reshape(fan_in, -1) for i in range(w.shape[0])]
  head = decoder.unembed_params(params, cfg)
  mats.append((head["embedding"].T if cfg.tie_embeddings
               else head["lm_head"]).reshape(D, -1))
  return [jax.block_until_ready(jnp.asarray(m)) for m in mats]


@jax.jit
def _matmul_chain(mats, xs):
  """Every matrix of `mats` applied to rows of its input width; outputs
  feed the inputs of their width, so none is dead code and no reduction
  of a product can be rewritten away."""
  xs = dict(xs)
  for m in mats:
    a, b = m.shape
    y = xs[a] @ m
    xs[b] = xs[b] + 1e-3 * y if b in xs else y
  return xs


def chain_seconds(mats, rows: int, repeats: int = 10) -> float:
  """Best seconds of one pass of the model's matmuls (`model_matrices`)
  over `rows` rows: nothing but those products, every weight read from
  memory once a pass, as a decode step reads them."""
  widths = sorted({m.shape[0] for m in mats})
  xs = {a: jax.random.normal(jax.random.key(a), (rows, a)) for a in widths}
  jax.block_until_ready(_matmul_chain(mats, xs))  # Compiles.
  return common.best_seconds(
      lambda: jax.block_until_ready(_matmul_chain(mats, xs)), repeats)


def chain_ceiling_tok_s(cfg, params, batch: int, prompt_len: int,
                        new_tokens: int) -> dict:
  """Tokens/s if generation cost only the model's own matmuls, timed as
  one program (`chain_seconds`): a prefill pass over the prompts' rows and
  `new_tokens` decode passes of `batch` rows. Unlike `ceiling_tok_s`, whose
  rate comes from one [batch, 576] x [576, 6144] product repeated on the
  same weights (in cache), each pass streams all the weights, as decoding
  does. Also the weights' bytes a decode pass over its time."""
  mats = model_matrices(cfg, params)
  step = chain_seconds(mats, batch)
  prefill = chain_seconds(mats[:-1], batch * prompt_len, 3) + \
      chain_seconds(mats[-1:], batch, 3)
  weight_bytes = sum(m.nbytes for m in mats)
  return dict(chain_step_ms=round(1e3 * step, 2),
              chain_prefill_ms=round(1e3 * prefill, 1),
              chain_weight_gb_s=round(weight_bytes / step / 1e9, 1),
              chain_ceiling_tok_s=round(
                  batch * new_tokens / (prefill + new_tokens * step), 1))


def ours_runner(cfg, params, prompts, new_tokens):
  """A `generate` callable for swirl_jax's sampler (compiled on first use)."""
  sampler = sampler_lib.Sampler(params, cfg, config=sampler_lib.SamplerConfig(
      eos_ids=()))
  out = {}

  def run():
    out["tokens"] = sampler.generate(prompts, max_new_tokens=new_tokens).tokens
  return run, out, sampler


def transformers_runner(model_dir, prompts, new_tokens, threads):
  """A `generate` callable for transformers on PyTorch, same weights."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      model_dir, dtype=torch.float32, attn_implementation="sdpa")
  model.eval()
  model.generation_config.eos_token_id = None
  ids = torch.tensor(np.asarray(prompts))
  mask = torch.ones_like(ids)
  out = {}

  def run(n=new_tokens):
    with torch.no_grad():
      out["tokens"] = model.generate(
          input_ids=ids, attention_mask=mask, max_new_tokens=n,
          min_new_tokens=n, do_sample=False,
          pad_token_id=0)[:, ids.shape[1]:].numpy()
  return run, out


def bench_extend(sampler, context: int, obs_len: int, batch: int,
                 repeats: int) -> float:
  """Milliseconds for one append of `obs_len` tokens per row, to rows of
  the page pool that hold `context` tokens (the engine's observation)."""
  limit = context + obs_len
  dev = sampler.device(batch, 1, append_tokens=limit, limit=limit)
  times = []
  for i in range(repeats + 1):
    dev.open(batch, batch)
    rows = [PlainRow(j, list(range(200, 200 + context)))
            for j in range(batch)]
    dev.append(rows, fresh=True)
    for r in rows:
      r.length, r.obs = context, list(range(100, 100 + obs_len))
    dev.block()
    start = time.perf_counter()
    dev.append(rows, fresh=False)
    dev.block()
    if i:  # The first call compiles.
      times.append(time.perf_counter() - start)
    dev.close()
  return 1000 * min(times)


def extend_flops(cfg, params, context: int, obs_len: int) -> float:
  """FLOPs of one row's `extend`: 2 per weight per token, attention's QK
  and PV products over the context and the observation's causal prefix,
  and the last position's logits. The ratio at two contexts is the floor
  of `extend_ratio` were every FLOP as fast as every other."""
  layers = sum(x.size for x in jax.tree.leaves(params["layers"]))
  attn = 4 * cfg.num_heads * cfg.head_dim * cfg.num_layers
  keys = obs_len * context + obs_len * (obs_len + 1) // 2
  return (2 * layers * obs_len + attn * keys
          + 2 * cfg.vocab_size * cfg.hidden_size)


_TUNIX_SCRIPT = textwrap.dedent("""
    import dataclasses, json, sys, time
    import numpy as np
    from flax import nnx
    from tunix.generate import sampler as sampler_lib
    from tunix.models.llama3 import model as llama_lib
    batch, prompt_len, new_tokens, repeats = map(int, sys.argv[1:5])
    shape = dict(num_layers=30, vocab_size=49152, embed_dim=576,
                 hidden_dim=1536, num_heads=9, head_dim=64, num_kv_heads=3,
                 rope_theta=100000, norm_eps=1e-5, weight_tying=True)
    fields = {f.name for f in dataclasses.fields(llama_lib.ModelConfig)}
    cfg = llama_lib.ModelConfig(**{k: v for k, v in shape.items()
                                   if k in fields})
    model = llama_lib.Llama3(cfg, rngs=nnx.Rngs(0))

    class Tok:  # Ids as text, so both sides decode the same token ids.
      def encode(self, x, **kw): return [int(t) for t in x.split()]
      def decode(self, ids, **kw): return " ".join(map(str, ids))
      def bos_id(self): return 0  # Falsy: no BOS is prepended.
      def eos_id(self): return -1  # Never sampled: all steps run.
      def pad_id(self): return 0

    s = sampler_lib.Sampler(model, Tok(), sampler_lib.CacheConfig(
        cache_size=prompt_len + new_tokens, num_layers=30,
        num_kv_heads=3, head_dim=64))
    rng = np.random.RandomState(0)
    prompts = [" ".join(map(str, rng.randint(3, 49152, prompt_len)))
               for _ in range(batch)]
    run = lambda: s(prompts, max_generation_steps=new_tokens,
                    max_prompt_length=prompt_len, temperature=0.0)
    run()  # Compiles.
    best = 1e9
    for _ in range(repeats):
      t = time.perf_counter()
      run()
      best = min(best, time.perf_counter() - t)
    print(json.dumps({"tok_s": batch * new_tokens / best}))
""")


def bench_tunix(python: str, batch, prompt_len, new_tokens, repeats):
  """Tokens/s of Tunix's sampler, run in its own interpreter."""
  out = subprocess.run(
      [python, "-c", _TUNIX_SCRIPT, str(batch), str(prompt_len),
       str(new_tokens), str(repeats)], capture_output=True, text=True,
      timeout=3600, env=dict(os.environ, PYTHONPATH=""))
  if out.returncode:
    raise RuntimeError(f"tunix run failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])["tok_s"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  common.int_flags(parser, batch=16, prompt_len=64, new_tokens=128, repeats=3,
                   extend_batch=4, torch_threads=2)
  parser.add_argument("--tunix-python", dest="tunix_python", default=None,
                      help="an interpreter with tunix installed")
  args = parser.parse_args()

  cfg, params = gguf_io.load_gguf(paths.smollm2_gguf_path())
  rng = np.random.RandomState(0)
  prompts = rng.randint(3, cfg.vocab_size,
                        (args.batch, args.prompt_len)).tolist()
  run_ours, our_out, sampler = ours_runner(cfg, params, prompts,
                                          args.new_tokens)
  with tempfile.TemporaryDirectory() as d:
    hf_io.export_hf_dir(params, cfg, d)
    run_peer, peer_out = transformers_runner(d, prompts, args.new_tokens,
                                             args.torch_threads)
  run_ours()  # Compiles.
  run_peer(4)  # Warms up.
  # Alternate the two, best of each: the machine's load drifts.
  t_ours, t_peer = [], []
  for _ in range(args.repeats):
    t_ours.append(common.best_seconds(run_ours, 1))
    t_peer.append(common.best_seconds(run_peer, 1))
  n = args.batch * args.new_tokens
  ours, peer = n / min(t_ours), n / min(t_peer)
  print(f"swirl_jax: {ours:.1f} tokens/s")
  same = float(np.mean(np.asarray(our_out["tokens"]) == peer_out["tokens"]))
  print(f"transformers: {peer:.1f} tokens/s; ratio {ours / peer:.2f}; "
        f"same greedy tokens: {same:.3f}")
  ext = {n: bench_extend(sampler, n, 64, args.extend_batch, args.repeats)
         for n in (256, 2048)}
  print(f"extend 64 tokens x {args.extend_batch} rows: {ext[256]:.1f} ms "
        f"after 256, {ext[2048]:.1f} ms after 2048")
  result = {"benchmark": "sampler", "model": "smollm2_135m", "dtype":
            "float32", "batch": args.batch, "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "ours_tok_s": round(ours, 1), "peer": "transformers",
            "peer_tok_s": round(peer, 1), "ratio": round(ours / peer, 2),
            "torch_threads": args.torch_threads,
            "load_avg": round(os.getloadavg()[0], 2),
            "same_tokens": round(same, 4),
            "extend_batch": args.extend_batch,
            "extend_ms_256": round(ext[256], 1),
            "extend_ms_2048": round(ext[2048], 1),
            "extend_ratio": round(ext[2048] / ext[256], 2),
            "extend_flop_ratio": round(extend_flops(cfg, params, 2048, 64)
                                       / extend_flops(cfg, params, 256, 64),
                                       2)}
  result.update(ceiling_tok_s(cfg, params, args.batch, args.prompt_len,
                              args.new_tokens))
  result["ceiling_ratio"] = round(result["ceiling_tok_s"] / peer, 2)
  result.update(chain_ceiling_tok_s(cfg, params, args.batch,
                                    args.prompt_len, args.new_tokens))
  result["of_ceiling"] = round(ours / result["ceiling_tok_s"], 2)
  result["of_chain_ceiling"] = round(ours / result["chain_ceiling_tok_s"],
                                     2)
  if args.tunix_python:
    tunix = bench_tunix(args.tunix_python, args.batch, args.prompt_len,
                        args.new_tokens, args.repeats)
    result.update(tunix_tok_s=round(tunix, 1),
                  tunix_ratio=round(ours / tunix, 2))
  print(json.dumps(result))


if __name__ == "__main__":
  main()
