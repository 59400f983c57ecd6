"""The rollout engine against the lock-step oracle (tests/lockstep.py):
same tokens, log-probs and masks under greedy and seeded sampling, tools
running beside decode, a fixed set of compiled programs (counted from
JAX's compile events), attention over the live prefix."""

import dataclasses
import zlib

import numpy as np
import pytest

from swirl_jax.models import loading
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.rollout.scripted import replaying
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.tasks import synthetic
from swirl_jax.tasks.records import Task
from swirl_jax.tools import parsing, registry

import compile_events
import decode_golden
from lockstep import LockStep
import small_tokenizer
import testutil

SMALL = engine_lib.EngineConfig(slots=4, decode_batch=2, chunk_steps=4,
                                tool_workers=4, check_invariants=True)


@pytest.fixture(scope="module")
def tiny():
  """The random tiny policy on the tests' small vocabulary."""
  cfg, params, tok = loading.load_policy(decode_golden.small_policy("tiny"))
  sampler = Sampler(params, cfg, tok, SamplerConfig(
      max_cache_len=1024, **decode_golden.ROW_BUCKETS))
  return cfg, params, tok, sampler


@pytest.fixture(scope="module")
def calc_tools():
  return registry.build_tools(("calculator",))


def _h(traj_id, turn, n):
  return zlib.crc32(f"{traj_id}/{turn}".encode()) % n


def _lengths(traj_id, turn):
  return 3 + _h(traj_id, turn, 23)  # Rows out of step with each other.


def _calc_action(traj_id, turn):
  """Calls the calculator for 1-3 turns, then answers."""
  if turn < 1 + _h(traj_id, -1, 3):
    return parsing.ParsedTurn("call", tool="calculator",
                              argument=f"{turn} + {len(traj_id)}")
  return parsing.ParsedTurn("answer", answer="7")


def _pair(tiny, tools, rc, engine=SMALL, action=_calc_action, stops=None):
  _, _, tok, sampler = tiny
  ref = replaying(LockStep, _lengths, action)(
      sampler, tok, tools, rc)
  eng = replaying(engine_lib.RolloutEngine, _lengths, action)(
      sampler, tok, tools, rc, engine)
  if stops is not None:
    ref.stops = eng.stops = stops
  return ref, eng


def _same(a, b):
  assert [t.id for t in a] == [t.id for t in b]
  for x, y in zip(a, b):
    assert len(x.turns) == len(y.turns)
    for s, t in zip(x.turns, y.turns):
      assert s.action_ids == t.action_ids
      assert s.text == t.text and s.stop_reason == t.stop_reason
      assert s.observation_ids == t.observation_ids
      np.testing.assert_allclose(s.action_logprobs, t.action_logprobs,
                                 atol=2e-5)
    assert x.meta == y.meta and x.final_answer == y.final_answer
    tx, mx, _ = x.token_sequence()
    ty, my, _ = y.token_sequence()
    np.testing.assert_array_equal(tx, ty)
    np.testing.assert_array_equal(mx, my)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_equals_lockstep(tiny, calc_tools, temperature):
  """6 rows in 4 cache rows, 2 decoded at a time: rows are prefilled into
  freed rows, stop at different lengths, call the calculator 1-3 times;
  frequent stop strings make false stops that continue the turn. Greedy,
  the rollout is also tests/test_pages.py's golden one (the slot cache's,
  decode_golden.engine_run('tiny', 0.0)): the same tokens, observations,
  stop reasons and log-probs, no row preempted, every page back. Seeded,
  a task's two samples share its prompt's pages and sample as rows that
  share nothing."""
  rc = turns.RolloutConfig(fmt="swirl", max_turns=4, max_new_tokens=64,
                           temperature=temperature, seed=5)
  ref, eng = _pair(tiny, calc_tools, rc, stops=("\n\n\n", "e"))
  tasks = synthetic.arithmetic_tasks(3, seed=2)
  a = ref.run(tasks, samples_per_task=2)
  b = eng.run(tasks, samples_per_task=2)
  _same(a, b)
  if temperature == 0.0:
    decode_golden.assert_same_trajs(
        decode_golden.trajs_json(b),
        decode_golden.ENGINE_GOLDEN["engine_tiny_0.0"])
    assert "preempted" not in eng.metrics
    assert eng.device.free() == (4, 4 * 16)
  else:  # A task's samples share its prompt's pages; rows that do not
    # sample the same.
    assert eng.metrics["forked_rows"] > 0 and eng.device.held() == 0
    cfg, params, tok, _ = tiny
    alone = Sampler(params, cfg, tok, SamplerConfig(
        max_cache_len=1024, share_prompts=False, **decode_golden.ROW_BUCKETS))
    _same(b, _pair((cfg, params, tok, alone), calc_tools, rc,
                   stops=("\n\n\n", "e"))[1].run(tasks, samples_per_task=2))
  assert any(len(t.turns) > 2 for t in b)
  assert eng.metrics["false_stops"] > 0
  assert all(t.final_answer == "7" for t in b)
  m = eng.metrics
  assert m["tool_calls"] == sum(len(t.turns) - 1 for t in b)
  assert m["tokens"] == sum(len(t.action_ids) for tr in b for t in tr.turns)
  assert 0 < m["slot_utilisation"] <= 1 and 0 < m["longest_row_share"] <= 1
  assert m["tokens_per_s"] > 0 and m["tool_wait_s"] > 0


def test_logprobs_equal_teacher_forcing(tiny, calc_tools):
  cfg, params, _, _ = tiny
  rc = turns.RolloutConfig(fmt="swirl", max_turns=3, max_new_tokens=32,
                           temperature=1.0, top_k=50, top_p=0.95)
  _, eng = _pair(tiny, calc_tools, rc)
  trajs = eng.run(synthetic.arithmetic_tasks(2, seed=4), samples_per_task=2)
  assert testutil.teacher_forced_gap(cfg, params, trajs, rc) <= 2e-4
  for traj in trajs:  # Masks: the model's tokens only.
    tokens, mask, logps = traj.token_sequence()
    assert tokens[mask == 1].tolist() == [i for t in traj.turns
                                          for i in t.action_ids]
    assert np.all(logps[mask == 0] == 0)


def test_fixed_programs_and_live_prefix(tiny, calc_tools):
  """Programs are keyed by bucketed shapes alone: two rollouts of other
  tasks and seeds use a small fixed set, compile each shape at most once
  (a second rollout compiles none the first used) and attention reads a
  bucket of the live context, never the whole cache. Which shapes a
  rollout meets depends on when tools answer, and other tests in the
  process share the programs: a rollout compiles at most its new shapes."""
  rc = turns.RolloutConfig(fmt="swirl", max_turns=3, max_new_tokens=32,
                           temperature=1.0)
  _, eng = _pair(tiny, calc_tools, rc)
  with compile_events.counting() as first_compiles:
    eng.run(synthetic.arithmetic_tasks(4, seed=6))
  first = set(eng.shapes)
  eng.config = turns.RolloutConfig(fmt="swirl", max_turns=3,
                                   max_new_tokens=32, seed=9)
  with compile_events.counting() as second_compiles:
    eng.run(synthetic.arithmetic_tasks(4, seed=7))
  second = set(eng.shapes)
  programs = lambda c: sum(compile_events.cache_programs(c).values())
  assert programs(first_compiles) <= len(first) + 1  # And the pool.
  assert programs(second_compiles) <= len(second - first)
  assert len(first | second) <= 8, first | second
  longest = max(k[-1] for k in first | second)  # Prefix pages read.
  assert longest * eng.device.page <= 384 < eng.device.limit


def test_precompiled_programs_are_all_a_rollout_calls(tiny, calc_tools):
  """With `precompile`, the first rollout compiles the whole fixed set
  (appends: row buckets x piece buckets x prefixes; decode: row buckets x
  prefixes but none; the fork) before it starts, and no rollout compiles
  more; a prompt longer than a piece is appended in pieces, with the same
  tokens as the lock-step oracle's."""
  cfg, params, tok, _ = tiny
  sampler = Sampler(params, cfg, tok, SamplerConfig(max_cache_len=512))
  rc = turns.RolloutConfig(fmt="swirl", max_turns=3, max_new_tokens=32,
                           temperature=1.0, seed=3)
  ec = engine_lib.EngineConfig(slots=3, decode_batch=2, chunk_steps=4,
                               append_tokens=32, precompile=True,
                               check_invariants=True)
  ref, eng = _pair((cfg, params, tok, sampler), calc_tools, rc, engine=ec)
  tasks = synthetic.arithmetic_tasks(3, seed=8)
  with compile_events.counting() as compiles:
    got = eng.run(tasks)
  _same(ref.run(tasks), got)
  dev = eng.device
  # 1 or 2 rows: pieces of 16 or 32 tokens, each at the prefixes (pages of
  # 64 tokens) a program of that many new tokens may read; decode at a
  # chunk's prefixes but none. (The pool's `init` may be compiled already.)
  assert dev.pieces() == [16, 32]
  prefixes = {T: dev.prefixes(T) for T in (16, 32, 4)}
  assert prefixes == {T: [0, 4, 6, 8] for T in (16, 32, 4)}
  compiles.pop("jit(init)", None)
  assert compile_events.cache_programs(compiles) == {
      "jit(fork)": 1,
      "jit(append)": 2 * (len(prefixes[16]) + len(prefixes[32])),
      "jit(decode)": (len(prefixes[4]) - 1) * 2}
  assert max(k[2] for k in eng.shapes if k[0] == "append") == 32
  assert min(len(t.prompt_ids) for t in got) > 32
  eng.config = dataclasses.replace(rc, seed=11)
  with compile_events.counting() as compiles:
    eng.run(synthetic.arithmetic_tasks(3, seed=9))
  assert not compile_events.cache_programs(compiles)


def test_tools_run_while_others_decode(tiny):
  """Sandbox calls that take a while: the other rows keep decoding, and
  the trajectories equal the lock-step oracle's."""
  tools = registry.build_tools(("python",))

  def action(traj_id, turn):
    if turn == 0:
      slow = _h(traj_id, 0, 2) == 0
      code = ("import time; time.sleep(0.4)\n" if slow else "") + \
          "print(6 * 7)"
      return parsing.ParsedTurn("call", tool="python", argument=code)
    return parsing.ParsedTurn("answer", answer="42")

  rc = turns.RolloutConfig(fmt="simpletir", max_turns=3,
                           max_new_tokens=40, temperature=0.0)
  ref, eng = _pair(tiny, tools, rc, action=action,
                   engine=engine_lib.EngineConfig(slots=4, decode_batch=4,
                                                  chunk_steps=4,
                                                  check_invariants=True))
  tasks = [Task(f"m{i}", "6*7?", ("42",), "math") for i in range(4)]
  a, b = ref.run(tasks), eng.run(tasks)
  _same(a, b)
  assert all("Code execution result: 42" in t.turns[0].observation
             for t in b)
  assert eng.metrics["decode_chunks_beside_tools"] > 0


def test_rows_out_of_room_end_cleanly(tiny, calc_tools):
  """An observation that leaves no room in the row's context ends the row
  ('context_full'), as in the oracle, never past the cache; a prompt that
  does not fit is a clear error."""
  cfg, params, tok, _ = tiny
  sampler = Sampler(params, cfg, tok, SamplerConfig(
      max_cache_len=320, **decode_golden.ROW_BUCKETS))
  rc = turns.RolloutConfig(fmt="swirl", max_turns=8, max_new_tokens=40,
                           temperature=0.0)
  always_call = lambda i, k: parsing.ParsedTurn("call", tool="calculator",
                                                argument="1 + 1")
  eng = replaying(engine_lib.RolloutEngine, lambda i, k: 40 + k, always_call)(
      sampler, tok, calc_tools, rc, SMALL)
  trajs = eng.run(synthetic.arithmetic_tasks(3, seed=1))
  for t in trajs:
    assert t.meta.get("context_full") and not t.meta.get("turn_cap")
    kept = t.token_sequence()[0].size - len(t.turns[-1].observation_ids)
    assert kept <= 320
  small = Sampler(params, cfg, tok, SamplerConfig(max_cache_len=64))
  with pytest.raises(ValueError, match="max_cache_len"):
    engine_lib.RolloutEngine(small, tok, calc_tools, rc, SMALL).run(
        synthetic.arithmetic_tasks(1, seed=1))


_TENSOR_PARALLEL_SCRIPT = """
import json, os
os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=4 "
                           "--xla_backend_optimization_level=0")
import jax
jax.config.update("jax_default_matmul_precision", "highest")
from swirl_jax import config_lib
from swirl_jax.models import loading
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.tasks import synthetic
from swirl_jax.tools import registry
m = config_lib.model_config("tiny", "")
m.tokenizer = "{tokenizer}"  # The tests' small vocabulary: 768, even.
cfg, params, tok = loading.load_policy(m)
tools = registry.build_tools(("calculator",))
tasks = synthetic.arithmetic_tasks(3, seed=2)
out = {}
for temperature in (0.0, 1.0):
  rc = turns.RolloutConfig(fmt="swirl", max_turns=3, max_new_tokens=24,
                           temperature=temperature, seed=5)
  for name, tp, dp in (("one", 1, 1), ("tp", 2, 1), ("dp", 2, 2)):
    sampler = Sampler(params, cfg, tok, SamplerConfig(
        max_cache_len=512, tensor_parallel=tp, data_parallel=dp,
        batch_buckets={row_buckets}))
    m = sampler.mesh
    eng = engine_lib.RolloutEngine(
        sampler, tok, tools, rc, engine_lib.EngineConfig(
            slots=4, decode_batch=2, chunk_steps=4, tool_workers=2))
    trajs = eng.run(tasks, samples_per_task=2)
    out[f"{name}_{temperature}"] = [
        [[t.action_ids, t.action_logprobs] for t in tr.turns] for tr in trajs]
    # Its own path: 3 rows (over the data groups on the dp mesh).
    g = sampler.generate([[1, 2, 3], [4, 5], [6]], max_new_tokens=8)
    out[f"generate_{name}"] = g.tokens
    if m is None:
      continue
    out[f"mesh_{name}"] = dict(m.shape)
    dev = eng.device
    if name == "dp":
      out["groups"] = [sorted(d.id for d in g.layout.mesh.devices.flat)
                       for g in dev.groups]
      out["group_programs"] = [sum(g.shapes.values()) > 0
                               for g in dev.groups]
      dev = dev.groups[1]
    dev.open(2, 2)
    k = dev._dev[0]["k"][0]  # [K, P, page, H]: KV heads over 'tensor'.
    out[f"k_shard_{name}"] = k.addressable_shards[0].data.shape[0] / k.shape[0]
    q = dev._params["layers"][0]["attn"]["q"]
    out[f"q_shard_{name}"] = q.addressable_shards[0].data.size / q.size
print(json.dumps(out))
"""


def test_tensor_parallel_engine_equals_one_device():
  """Decode tensor parallel (weights and KV heads over 'tensor', every row
  of a group on each of its devices), and with 2 data groups of 2 (rows
  over 'data'; the engine's rows spread over one pool per group): the
  same trajectories as one device, token for token, greedy and seeded;
  log-probs to float rounding."""
  import fresh_process  # pylint: disable=g-import-not-at-top
  out = fresh_process.last_json(_TENSOR_PARALLEL_SCRIPT.replace(
      "{tokenizer}", str(small_tokenizer.PATH)).replace(
          "{row_buckets}", repr(decode_golden.ROW_BUCKETS["batch_buckets"])))
  assert out["mesh_tp"] == {"data": 1, "tensor": 2}
  assert out["mesh_dp"] == {"data": 2, "tensor": 2}
  assert out["groups"] == [[0, 1], [2, 3]]
  assert out["group_programs"] == [True, True]  # Both groups decoded.
  for name in ("tp", "dp"):
    assert out[f"k_shard_{name}"] == out[f"q_shard_{name}"] == 0.5
    assert out[f"generate_{name}"] == out["generate_one"]
  for temperature in (0.0, 1.0):
    one = out[f"one_{temperature}"]
    for name in ("tp", "dp"):
      other = out[f"{name}_{temperature}"]
      assert [[ids for ids, _ in tr] for tr in other] == \
          [[ids for ids, _ in tr] for tr in one]
      for a, b in zip(other, one):
        for (_, lp_a), (_, lp_b) in zip(a, b):
          np.testing.assert_allclose(lp_a, lp_b, atol=2e-5)


def test_policy_swaps_between_chunks_and_stamps_turns(tiny, calc_tools):
  """A policy feed whose version changes after the first device step (4
  rows prefilled, 2 of them decoded one chunk): the device decodes with
  the new params from the next program call on. Rows admitted after the
  swap sample exactly as a run on the new params alone; each trajectory
  is stamped with the oldest version that sampled it, and where its turns
  saw both, each turn with its own. A constant feed samples as no feed."""
  sampler = tiny[3]
  other = loading.load_policy(decode_golden.small_policy("tiny"), seed=7)[1]
  a, b = sampler.params, sampler.local_params(other)
  rc = turns.RolloutConfig(fmt="swirl", max_turns=3, max_new_tokens=32,
                           temperature=1.0, seed=3)
  _, eng = _pair(tiny, calc_tools, rc)
  pairs = [(t, k) for t in synthetic.arithmetic_tasks(3, seed=2)
           for k in range(2)]  # 6 rows, 4 cache rows.
  plain = eng.run_pairs(pairs)
  same = eng.run_pairs(pairs, policy=engine_lib.Policy(0, a))
  for x, y in zip(plain, same):
    assert x.token_sequence()[0].tolist() == y.token_sequence()[0].tolist()
    assert y.meta.pop("policy_version") == 0 and x.meta == y.meta
  sampler.params = other
  try:
    on_b = eng.run_pairs(pairs)
  finally:
    sampler.params = a
  calls = []

  def feed():
    calls.append(1)
    return engine_lib.Policy(*((0, a) if len(calls) == 1 else (1, b)))

  swapped = eng.run_pairs(pairs, policy=feed)
  assert eng.metrics["policy_swaps"] == 1
  assert [t.meta["policy_version"] for t in swapped] == [0, 0, 1, 1, 1, 1]
  _same(swapped[4:], [dataclasses.replace(t, meta=dict(
      t.meta, policy_version=1)) for t in on_b[4:]])
  first = swapped[0].turns[0].action_ids
  assert first[:SMALL.chunk_steps] == \
      plain[0].turns[0].action_ids[:SMALL.chunk_steps]  # Before the swap.
  spans = [t.meta["turn_versions"] for t in swapped if "turn_versions"
           in t.meta]
  assert spans and all(v[0] == 0 and set(v[1:]) == {1} for v in spans)
