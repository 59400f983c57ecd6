"""Golden decode outputs: what the contiguous slot cache produced before
the page pool replaced it, kept in tests/data/decode_golden.json.

The cases run through the public paths (`Sampler.generate`,
`RolloutEngine.run`) on random-weight tiny / mini presets: token ids and
log-probs, greedy and seeded, several prompt shapes, a stop string, a
crossing of a cache bucket, a Gemma-2-like model (sliding window,
soft-caps) and multi-turn rollouts with the calculator. tests/test_pages.py
runs them on the page pool and compares with the file.

The file is a record of the old stack, written once (its provenance:
tests/data/decode_golden.md). Nothing here writes it: rewritten from the
current code, it would compare the page pool with itself.
"""

import json
import os
import pathlib
import sys
import zlib

sys.path.insert(0, os.path.dirname(__file__))

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

from swirl_jax import config_lib
from swirl_jax.models import decoder, loading, presets
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.scripted import replaying
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.tasks import synthetic
from swirl_jax.tools import parsing, registry

from lockstep import LockStep  # pylint: disable=g-bad-import-order
import small_tokenizer  # pylint: disable=g-bad-import-order

PATH = pathlib.Path(__file__).parent / "data" / "decode_golden.json"
GOLDEN = json.loads(PATH.read_text())
# The engine's cases on the tests' small vocabulary (768 entries), recorded
# by the same slot cache (tests/data/decode_golden.md).
ENGINE_GOLDEN = json.loads(
    (PATH.parent / "decode_golden_small.json").read_text())
ALPHABET = ["<", "/", "a", ">", "b", " ", "x", "\n"]


def _prompts(lengths, vocab, seed):
  rng = np.random.RandomState(seed)
  return [rng.randint(0, vocab, n).tolist() for n in lengths]


def _table(vocab, seed=0):
  rng = np.random.RandomState(seed)
  return ["".join(rng.choice(ALPHABET, rng.randint(1, 4))).encode()
          for _ in range(vocab)]


def _gen(res) -> dict:
  return dict(tokens=res.tokens, logprobs=[lp.tolist() for lp in res.logprobs],
              reasons=res.stop_reasons)


def generate_cases() -> dict:
  """`Sampler.generate` on tiny, mini and a Gemma-2-like tiny model."""
  out = {}
  gemma = presets.get_preset("tiny").replace(
      family="gemma2", sliding_window=4,
      layer_types=("sliding_attention", "full_attention"),
      attn_logit_softcap=5.0, final_logit_softcap=3.0)
  for name, cfg in (("tiny", presets.get_preset("tiny")),
                    ("mini", presets.get_preset("mini")),
                    ("gemma", gemma)):
    params = decoder.init_params(cfg, jax.random.key(1))
    table = _table(cfg.vocab_size)
    s = Sampler(params, cfg, config=SamplerConfig(max_cache_len=512,
                                                  eos_ids=()),
                token_bytes=table)
    prompts = _prompts([5, 17, 40, 3], cfg.vocab_size, seed=0)
    out[f"{name}_greedy"] = _gen(s.generate(prompts, max_new_tokens=30))
    out[f"{name}_seeded"] = _gen(s.generate(
        prompts, max_new_tokens=[30, 12, 25, 40], temperature=1.0,
        top_p=0.9, seed=3))
    # Crosses the first cache bucket (256) while decoding.
    long = _prompts([240, 100], cfg.vocab_size, seed=1)
    out[f"{name}_long"] = _gen(s.generate(long, max_new_tokens=40,
                                          temperature=0.8, seed=[7, 8]))
    if name == "tiny":
      free = s.generate(prompts[:2], max_new_tokens=30, temperature=1.2,
                        seed=5)
      text = b"".join(table[t] for t in free.tokens[0][:12]).decode()
      out["tiny_stop"] = _gen(s.generate(
          prompts[:2], max_new_tokens=30, temperature=1.2, seed=5,
          stop_strings=[text[-3:]]))
      out["tiny_stop"]["stop"] = text[-3:]
  return out


def _h(traj_id, turn, n):
  return zlib.crc32(f"{traj_id}/{turn}".encode()) % n


def _lengths(traj_id, turn):
  return 3 + _h(traj_id, turn, 23)


def _calc_action(traj_id, turn):
  if turn < 1 + _h(traj_id, -1, 3):
    return parsing.ParsedTurn("call", tool="calculator",
                              argument=f"{turn} + {len(traj_id)}")
  return parsing.ParsedTurn("answer", answer="7")


def trajs_json(trajs) -> list:
  return [[dict(action_ids=t.action_ids, logprobs=t.action_logprobs,
                observation_ids=t.observation_ids, reason=t.stop_reason)
           for t in tr.turns] for tr in trajs]


def assert_same_trajs(got, want):
  """Two `trajs_json` lists: the same tokens, observations and stop
  reasons, log-probs to float rounding."""
  assert [[t["action_ids"] for t in tr] for tr in got] == \
      [[t["action_ids"] for t in tr] for tr in want]
  assert [[t["observation_ids"] for t in tr] for tr in got] == \
      [[t["observation_ids"] for t in tr] for tr in want]
  for x, y in zip(got, want):
    for a, b in zip(x, y):
      assert a["reason"] == b["reason"]
      np.testing.assert_allclose(a["logprobs"], b["logprobs"], atol=2e-5)


def small_policy(preset: str):
  """The model block of a random `preset` on the tests' small vocabulary:
  SmolLM2's 49,152 entries made the output layer and sampling over it
  most of a random tiny policy's decode time."""
  m = config_lib.model_config(preset, "")
  m.tokenizer = str(small_tokenizer.PATH)
  return m


ENGINE = dict(slots=4, decode_batch=2, chunk_steps=4, tool_workers=4)
# Row buckets of the tests' engines: no 1-row bucket, so a decode batch of
# 2 appends and decodes 2 rows always and each shape compiles once, not
# for 1 row and again for 2 (test_engine.py and test_pages.py: about 80 s
# of CPU less). The product's default, every bucket, runs against the
# lock-step oracle in test_engine.py's precompile test.
ROW_BUCKETS = dict(batch_buckets=(2, 4, 8, 16, 32, 64, 128, 256, 512))


def engine_run(preset: str, temperature: float, engine_kw=None,
               sampler_kw=None, lockstep=False):
  """(trajectories, the runner, (cfg, params)) of one rollout of 6 rows
  (3 tasks x 2) through the engine (or the lock-step oracle), with false
  stops, on the tests' small vocabulary (`ENGINE_GOLDEN`'s). `engine_kw` /
  `sampler_kw` override `EngineConfig` / `SamplerConfig` fields (rows in
  `ROW_BUCKETS`)."""
  tools = registry.build_tools(("calculator",))
  cfg, params, tok = loading.load_policy(small_policy(preset))
  sampler = Sampler(params, cfg, tok, SamplerConfig(
      **dict(dict(max_cache_len=1024, **ROW_BUCKETS), **(sampler_kw or {}))))
  rc = turns.RolloutConfig(fmt="swirl", max_turns=4, max_new_tokens=64,
                           temperature=temperature, seed=5)
  if lockstep:
    runner = replaying(LockStep, _lengths, _calc_action)(
        sampler, tok, tools, rc)
  else:
    runner = replaying(engine_lib.RolloutEngine, _lengths, _calc_action)(
        sampler, tok, tools, rc, engine_lib.EngineConfig(
            **dict(ENGINE, **(engine_kw or {}))))
  runner.stops = ("\n\n\n", "e")
  trajs = runner.run(synthetic.arithmetic_tasks(3, seed=2),
                     samples_per_task=2)
  return trajs, runner, (cfg, params)
