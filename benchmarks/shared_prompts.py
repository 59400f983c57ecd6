r"""Shared prompt pages: a group's samples prefilling their prompt once and
sharing its pages, against each prefilling its own, in one run.

`--prompts` prompts of exactly `--prompt-tokens` tokens (SimpleTIR-shaped
task prompts, cut to that length), `--group` samples each, on the page
pool of the SimpleTIR CPU demo's "mini" policy shape (random weights, the
bundled vocabulary), `SamplerConfig.share_prompts` on and off:

- prefill: all rows' prompts appended (`PagedDevice.append`, waited for),
  the best of `--repeats`;
- pages held when the first decode chunk begins (its pages reserved);
- the rollout engine on the same groups, greedy and seeded (a replayed
  SimpleTIR shape: a sandboxed Python call, then an answer), with the
  trajectories compared token for token, and its prompt tokens computed.

Ratios are shared over not shared; with G samples a prompt, the floor is
1/G (a group's prefill once, its pages once) plus the fork and each
follower's own pages from the prompt's last on. Prints a summary, then one
JSON line.

  python benchmarks/shared_prompts.py [--prompts=4] [--group=8]
      [--prompt-tokens=512] [--repeats=3]
"""

import argparse
import dataclasses
import json
import os
import time
import zlib

import jax
import numpy as np

from swirl_jax import config_lib
from swirl_jax.models import loading
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import prompts as prompts_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.scripted import replaying
from swirl_jax.sampling.device import PlainRow
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.tasks import synthetic
from swirl_jax.tools import parsing, registry

import common  # pylint: disable=g-bad-import-order


def long_tasks(n: int, tokens: int, tok):
  """`n` arithmetic tasks whose SimpleTIR prompts reach `tokens` tokens:
  each question carries a worked table of sums before it."""
  out = []
  for t in synthetic.arithmetic_tasks(n, seed=0):
    rows, k = [], 0
    while True:
      task = dataclasses.replace(t, question="\n".join(rows + [t.question]))
      if len(prompts_lib.prompt_ids(tok, task, "simpletir")[1]) >= tokens:
        break
      rows.append(f"{k} + {len(t.id) + k} = {2 * k + len(t.id)}")
      k += 1
    out.append(task)
  return out


def _lengths(traj_id, turn):
  return 6 + zlib.crc32(f"{traj_id}/{turn}".encode()) % 24


def _action(traj_id, turn):
  del traj_id
  if turn == 0:
    return parsing.ParsedTurn("call", tool=parsing.PYTHON_TOOL,
                              argument="print(6 * 7)")
  return parsing.ParsedTurn("answer", answer="42")


def device_side(sampler, prompt_ids, group, decode_batch, repeats):
  """(prefill seconds, pages held at the first decode, prompt tokens
  computed) for `group` rows of each prompt."""
  n = len(prompt_ids) * group

  def run():
    dev = sampler.device(decode_batch, 8, 64)
    dev.open(n, n)
    rows = [PlainRow(i, list(prompt_ids[i // group]), 8) for i in range(n)]
    t0 = time.perf_counter()
    dev.append(rows, fresh=True)
    dev.block()
    took = time.perf_counter() - t0
    for r in rows:
      r.length = len(r.obs)
    dev.decode_start(rows, [], ())  # Every row's first chunk at once.
    dev.block()
    out = took, dev.counts["first_decode_pages"], dev.counts[
        "prefill_tokens"]
    dev.close()
    return out

  run()  # Compiles.
  runs = [run() for _ in range(repeats)]
  return min(r[0] for r in runs), runs[0][1], runs[0][2]


def engine_side(sampler, tok, tools, tasks, group, temperature):
  rc = turns.RolloutConfig(fmt="simpletir", max_turns=2, max_new_tokens=32,
                           temperature=temperature, seed=3)
  ec = engine_lib.EngineConfig(slots=len(tasks) * group, decode_batch=16)
  eng = replaying(engine_lib.RolloutEngine, _lengths, _action)(
      sampler, tok, tools, rc, ec)
  eng.stops = ()
  eng.run(tasks, samples_per_task=group)  # Compiles.
  trajs = eng.run(tasks, samples_per_task=group)
  return [t.token_sequence()[0].tolist() for t in trajs], eng.metrics


def main(argv=None):
  p = argparse.ArgumentParser()
  common.int_flags(p, sep="-", prompts=4, group=8, prompt_tokens=512,
                   repeats=3, decode_batch=16)
  a = p.parse_args(argv)
  cfg, params, tok = loading.load_policy(config_lib.model_config("mini", ""))
  tasks = long_tasks(a.prompts, a.prompt_tokens, tok)
  ids = [prompts_lib.prompt_ids(tok, t, "simpletir")[1][:a.prompt_tokens]
         for t in tasks]
  tools = registry.build_tools(("python",))
  res = dict(benchmark="shared_prompts", model="mini", prompts=a.prompts,
             group=a.group, prompt_tokens=a.prompt_tokens)
  dev, eng = {}, {}
  for share in (True, False):
    sampler = Sampler(params, cfg, tok, SamplerConfig(
        max_cache_len=1024, eos_ids=(), share_prompts=share))
    dev[share] = device_side(sampler, ids, a.group, a.decode_batch,
                             a.repeats)
    eng[share] = {t: engine_side(sampler, tok, tools, tasks, a.group, t)
                  for t in (0.0, 1.0)}
  bound = 1 / a.group + 0.1
  res.update(
      page_size=SamplerConfig().page_size,
      prefill_s_shared=round(dev[True][0], 4),
      prefill_s_alone=round(dev[False][0], 4),
      prefill_ratio=round(dev[True][0] / dev[False][0], 3),
      pages_first_decode_shared=int(dev[True][1]),
      pages_first_decode_alone=int(dev[False][1]),
      pages_ratio=round(dev[True][1] / dev[False][1], 3),
      prefill_tokens_shared=int(dev[True][2]),
      prefill_tokens_alone=int(dev[False][2]),
      bound=round(bound, 3),
      same_tokens_greedy=eng[True][0.0][0] == eng[False][0.0][0],
      same_tokens_seeded=eng[True][1.0][0] == eng[False][1.0][0],
      engine_prompt_tokens_shared=int(eng[True][1.0][1]["prefill_tokens"]),
      engine_prompt_tokens_alone=int(eng[False][1.0][1]["prefill_tokens"]),
      engine_wall_s_shared=round(eng[True][1.0][1]["wall_s"], 3),
      engine_wall_s_alone=round(eng[False][1.0][1]["wall_s"], 3),
      load_avg=round(os.getloadavg()[0], 2), backend=jax.default_backend())
  res["within_bound"] = (res["prefill_ratio"] <= bound
                         and res["pages_ratio"] <= bound)
  print(f"prefill {res['prefill_s_shared']:.3f}s shared, "
        f"{res['prefill_s_alone']:.3f}s not ({res['prefill_ratio']:.3f}); "
        f"pages at the first decode {res['pages_first_decode_shared']} "
        f"against {res['pages_first_decode_alone']} "
        f"({res['pages_ratio']:.3f}); bound {bound:.3f}; same tokens: "
        f"greedy {res['same_tokens_greedy']}, seeded "
        f"{res['same_tokens_seeded']}")
  print(json.dumps(res))


if __name__ == "__main__":
  main()
