"""Sampler: greedy parity with `transformers`, appending to a row after a
stop (the engine's multi-turn path on the page pool), behaviour log-probs,
the sampling distribution, stop strings, errors, compile count (from JAX's
compile events), host round trips per decode chunk and a fake 8-device
mesh.

Most tests share one tiny random Qwen2 model and one Sampler whose buckets
are fixed, so the whole file compiles a handful of programs.
"""

import collections
import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
from jax._src.array import ArrayImpl
import numpy as np
import pytest
import scipy.stats
import torch
import transformers

import compile_events
import hf_models
from swirl_jax import sharding as shd
from swirl_jax.models import decoder, hf_io
from swirl_jax.training import lora
from swirl_jax.sampling import distribution, pages, stops
from swirl_jax.sampling.device import Device, Draw, PlainRow
from swirl_jax.sampling.sampler import Sampler, SamplerConfig

jax.config.update("jax_default_matmul_precision", "highest")

# One bucket per shape: every test on the shared sampler reuses its programs.
TINY_CONFIG = SamplerConfig(max_cache_len=128, batch_buckets=(4,),
                            length_buckets=(32, 64), cache_buckets=(128,),
                            step_buckets=(64,), eos_ids=())
ALPHABET = ["<", "/", "a", ">", "b", " ", "x", "\n"]


def _token_table(vocab, seed=0):
  """Tokens of 1-3 characters over a small alphabet: stop strings of a few
  characters cross token boundaries in many ways."""
  rng = np.random.RandomState(seed)
  return ["".join(rng.choice(ALPHABET, rng.randint(1, 4))).encode()
          for _ in range(vocab)]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
  path = tmp_path_factory.mktemp("qwen2")
  model = hf_models.save_greedy_model("qwen2", path)
  cfg, params = hf_io.load_hf_dir(path)
  table = _token_table(cfg.vocab_size)
  sampler = Sampler(params, cfg, config=TINY_CONFIG, token_bytes=table)
  return dict(model=model, cfg=cfg, params=params, table=table,
              sampler=sampler, path=path)


def _prompts(lengths, vocab=128, seed=0):
  rng = np.random.RandomState(seed)
  return [rng.randint(0, vocab, n).tolist() for n in lengths]


# --------------------------------------------------------- greedy parity


def test_greedy_matches_transformers_qwen2(qwen):
  prompts = _prompts([5, 12, 9])
  res = qwen["sampler"].generate(prompts, max_new_tokens=64)
  ref = hf_models.greedy(qwen["model"], prompts, 64)
  np.testing.assert_array_equal(np.asarray(res.tokens), ref)
  assert res.stop_reasons == ["length"] * 3
  assert max(len(set(t)) for t in res.tokens) > 10  # Not degenerate.


def test_greedy_matches_transformers_gemma2(tmp_path):
  # Window 8: the sliding layers drop most of the context.
  model = hf_models.save_greedy_model("gemma2", tmp_path, seed=1, std=0.05)
  cfg, params = hf_io.load_hf_dir(tmp_path)
  prompts = _prompts([5, 12, 9], seed=1)
  res = Sampler(params, cfg, config=TINY_CONFIG).generate(
      prompts, max_new_tokens=64)
  ref = hf_models.greedy(model, prompts, 64)
  np.testing.assert_array_equal(np.asarray(res.tokens), ref)
  assert max(len(set(t)) for t in res.tokens) > 10


def test_greedy_matches_transformers_smollm2(smollm2, tmp_path):
  """The real model on chat prompts (about a minute on two CPU cores)."""
  from swirl_jax.models.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  path, cfg, params = smollm2
  tok = Tokenizer.from_gguf(path)
  prompts = [tok.render_and_encode([{"role": "user", "content": q}])
             for q in ("What is 7 times 8?",
                       "Write a short poem about the sea and the sky.",
                       "Name three prime numbers.")]
  assert len({len(p) for p in prompts}) == 3
  config = SamplerConfig(batch_buckets=(4,), length_buckets=(64,),
                         cache_buckets=(128,), step_buckets=(64,),
                         eos_ids=())
  res = Sampler(params, cfg, tok, config).generate(prompts,
                                                    max_new_tokens=64)
  hf_io.export_hf_dir(params, cfg, tmp_path)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path, dtype=torch.float32, attn_implementation="eager")
  ref = hf_models.greedy(model, prompts, 64)
  np.testing.assert_array_equal(np.asarray(res.tokens), ref)
  assert res.texts[0] == tok.decode(res.tokens[0])


# ------------------------------------------------------------ multi-turn


def _opened(s, prompts, chunk_steps: int):
  """A device with each prompt appended to a row of its own (20 new tokens
  each), as the engine opens rows."""
  dev = s.device(len(prompts), chunk_steps, 32)
  dev.open(len(prompts), len(prompts))
  rows = [PlainRow(i, p, 20) for i, p in enumerate(prompts)]
  dev.append(rows, fresh=True)
  for r in rows:
    r.length = len(r.obs)
  return dev, rows


def _boundary_stop(tokens, table, at):
  """A 3-byte string ending inside token `at` and starting in an earlier
  token, and the index of the token that first completes it."""
  text = b"".join(table[t] for t in tokens[:at + 1])
  end = len(text) - len(table[tokens[at]]) + 1
  s = text[end - 3:end].decode()
  return s, stops.first_stop(tokens, table, [s])


def _decode(dev, rows, stop_strings=()):
  out, _ = dev.decode(rows, [Draw(0)] * len(rows), stop_strings)
  for r, (t, _, _) in zip(rows, out):
    r.length += len(t)
  return out


def test_append_after_a_stop_continues_like_prefilling_everything(qwen):
  """On the page pool: decode -> stop at a string -> append an
  observation -> decode gives the tokens of prefilling the whole
  concatenated context at once (the engine's multi-turn path)."""
  s, table = qwen["sampler"], qwen["table"]
  prompts = _prompts([7, 3, 11, 5], seed=2)
  free = s.generate(prompts, max_new_tokens=20)
  stop_str, first = _boundary_stop(free.tokens[0], table, 9)
  dev, rows = _opened(s, prompts, chunk_steps=20)
  turn1 = _decode(dev, rows, (stop_str,))
  assert turn1[0][2] == "stop"
  assert turn1[0][0] == free.tokens[0][:first + 1]
  assert dev.text(rows[0], turn1[0][0], "stop", (stop_str,)).endswith(
      stop_str)
  obs = [[5, 6, 7], [], [9] * 10, [1]]  # Row 1 adds nothing.
  more = [r for r, o in zip(rows, obs) if o]
  for r, o in zip(rows, obs):
    r.obs = o
  dev.append(more, fresh=False)
  for r in more:
    r.length += len(r.obs)
  turn2 = _decode(dev, rows)
  dev.close()
  whole = [p + t + o for p, (t, _, _), o in zip(prompts, turn1, obs)]
  assert [r.length - len(t) for r, (t, _, _) in zip(rows, turn2)] == [
      len(w) for w in whole]
  ref = s.generate(whole, max_new_tokens=20)
  assert [t for t, _, _ in turn2] == ref.tokens
  for (_, a, _), b in zip(turn2, ref.logprobs):
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_pages_end_at_the_last_returned_token(qwen):
  """A row's pages hold exactly its prompt and returned tokens: their keys
  and values are a fresh prefill's of the same tokens, and no other slot
  of the pool was written."""
  s = qwen["sampler"]
  assert isinstance(s.device(4, 16, 32), Device)
  prompts = _prompts([4, 9], seed=3)
  dev = s.device(4, 16, 32)
  dev.open(2, 2)
  rows = [PlainRow(i, p, b) for i, (p, b) in enumerate(zip(prompts,
                                                           [5, 12]))]
  dev.append(rows, fresh=True)
  for r in rows:
    r.length = len(r.obs)
  out = _decode(dev, rows)
  pool = jax.device_get(dev._dev[0])  # pylint: disable=protected-access
  page = dev.page
  whole = [p + t for p, (t, _, _) in zip(prompts, out)]
  fresh = s.device(4, 16, 32)
  fresh.open(2, 2)
  again = [PlainRow(i, w) for i, w in enumerate(whole)]
  fresh.append(again, fresh=True)
  ref = jax.device_get(fresh._dev[0])  # pylint: disable=protected-access
  written = np.zeros(pool["k"][0].shape[1:3], bool)  # [pages, slots].
  for r, a, (t, _, _), w in zip(rows, again, out, whole):
    assert len(t) == r.budget and r.seat.tokens == w
    assert len(r.seat.pages) == -(-len(w) // page)
    slot = np.arange(len(w))
    mine = np.asarray(r.seat.pages)[slot // page], slot % page
    theirs = np.asarray(a.seat.pages)[slot // page], slot % page
    written[mine] = True
    for x, y in zip(pool["k"] + pool["v"], ref["k"] + ref["v"]):
      np.testing.assert_allclose(x[:, mine[0], mine[1]],
                                 y[:, theirs[0], theirs[1]], atol=1e-5)
  for x in pool["k"] + pool["v"]:
    assert not np.any(x[:, ~written]), "a slot no row holds was written"
  dev.close()
  fresh.close()


# ------------------------------------------------------ behaviour log-probs


@pytest.fixture(scope="module")
def teacher(qwen):
  cfg = qwen["cfg"]
  fwd = jax.jit(lambda p, t: decoder.forward(p, cfg, t)[0])
  return lambda tokens: np.asarray(fwd(qwen["params"], jnp.asarray(
      [tokens + [0] * (96 - len(tokens))])))[0]


_sampling_logits_jit = jax.jit(distribution.sampling_logits)


def test_logprobs_equal_teacher_forcing(qwen, teacher):
  """Per-row greedy / temperature / top-k / top-p in one batch."""
  settings = dict(temperature=[0.0, 0.7, 1.3, 1.0], top_k=[0, 10, 0, 20],
                  top_p=[1.0, 1.0, 0.8, 0.9])
  prompts = _prompts([6, 13, 2, 9], seed=4)
  res = qwen["sampler"].generate(prompts, max_new_tokens=30, seed=11,
                                 **settings)
  for i, (p, t) in enumerate(zip(prompts, res.tokens)):
    logits = teacher(p + t)[len(p) - 1:len(p) + len(t) - 1]
    n = len(t)
    w = _sampling_logits_jit(
        jnp.asarray(logits), jnp.full(n, settings["temperature"][i]),
        jnp.full(n, settings["top_k"][i]), jnp.full(n, settings["top_p"][i]))
    ref = np.take_along_axis(np.asarray(jax.nn.log_softmax(w)),
                             np.asarray(t)[:, None], 1)[:, 0]
    np.testing.assert_allclose(res.logprobs[i], ref, atol=1e-4)
    assert np.isfinite(res.logprobs[i]).all()
  assert res.tokens[0] == qwen["sampler"].generate(
      prompts[:1], max_new_tokens=30).tokens[0]  # Row 0 is greedy.


# ----------------------------------------------------- sampling and seeds


def test_sampling_is_reproducible_and_per_row(qwen):
  s = qwen["sampler"]
  prompts = _prompts([5, 8], seed=5)
  kw = dict(max_new_tokens=24, temperature=1.0, top_p=0.95)
  a = s.generate(prompts, seed=3, **kw)
  b = s.generate(prompts, seed=3, **kw)
  c = s.generate(prompts, seed=4, **kw)
  assert a.tokens == b.tokens
  assert a.tokens != c.tokens
  # Per-row seeds: a row samples the same whatever else is in the batch.
  d = s.generate(prompts, seed=[10, 20], **kw)
  e = s.generate(prompts[1:], seed=[20], **kw)
  assert d.tokens[1] == e.tokens[0]


def _reference_probs(logits, temperature, top_k, top_p):
  """The truncated distribution, in float64, straight from its definition."""
  z = np.asarray(logits, np.float64) / temperature
  order = np.argsort(-z)
  k = len(z) if top_k <= 0 else top_k
  kept = order[:k]
  p = np.exp(z[kept] - z[kept].max())
  p /= p.sum()
  mass_before = np.cumsum(p) - p
  kept = kept[mass_before < top_p] if top_p < 1 else kept
  out = np.zeros(len(z))
  out[kept] = np.exp(z[kept] - z[kept].max())
  return out / out.sum()


_sample_jit = jax.jit(distribution.sample_tokens)


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 3, 1.0), (1.5, 0, 0.6),
    (0.8, 5, 0.7)])
def test_sampling_matches_the_truncated_distribution(temperature, top_k,
                                                     top_p):
  logits = np.array([2.0, 1.5, 0.3, -0.2, 1.1, -1.0, 0.7, 0.05], np.float32)
  n = 20000
  want = _reference_probs(logits, temperature, top_k, top_p)
  toks, lps = _sample_jit(jnp.broadcast_to(logits, (n, 8)),
                 jax.random.split(jax.random.key(0), n),
                 jnp.full(n, temperature), jnp.full(n, top_k, jnp.int32),
                 jnp.full(n, top_p))
  counts = np.bincount(np.asarray(toks), minlength=8)
  assert counts[want == 0].sum() == 0
  keep = want > 0
  _, pvalue = scipy.stats.chisquare(counts[keep], n * want[keep])
  assert pvalue > 1e-3, (counts, n * want)
  np.testing.assert_allclose(np.asarray(lps), np.log(want[np.asarray(toks)]),
                             atol=1e-5)


@pytest.mark.parametrize("top_k,top_p,exact", [
    ([3, 16, 0, 0], [1.0, 0.5, 0.3, 1.0], True),  # Fits the 16 candidates.
    ([3, 17, 0, 0], [1.0, 0.5, 0.3, 1.0], False),  # A top-k past them.
    ([3, 16, 0, 0], [1.0, 0.5, 0.999, 1.0], False)])  # An open nucleus.
def test_truncation_from_candidates_equals_the_full_sort(top_k, top_p,
                                                         exact):
  """Truncating from `lax.top_k` candidates gives the full sort's logits
  exactly, and says when it cannot (the full sort then answers)."""
  logits = jax.random.normal(jax.random.key(3), (4, 500)) * 3
  logits = logits.at[1, :40].set(logits[1, 0])  # Ties across the cut.
  k, p = jnp.asarray(top_k, jnp.int32), jnp.asarray(top_p)
  want = distribution._truncate_sorted(logits, k, p)
  got, ok = distribution._truncate_top(logits, k, p, 16)
  assert bool(ok) == exact
  if exact:
    np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(
      jax.jit(distribution._truncate, static_argnums=3)(logits, k, p, 16),
      want)
  assert (np.isfinite(want).sum(1) > 0).all()


def test_greedy_rows_take_the_argmax():
  logits = jnp.asarray([[0.1, 3.0, 0.2], [5.0, 1.0, 0.0]])
  toks, lps = _sample_jit(
      logits, jax.random.split(jax.random.key(0), 2), jnp.zeros(2),
      jnp.asarray([1, 0]), jnp.asarray([0.1, 1.0]))
  np.testing.assert_array_equal(toks, [1, 0])
  np.testing.assert_allclose(
      lps, np.asarray(jax.nn.log_softmax(logits))[[0, 1], [1, 0]], atol=1e-6)


# ----------------------------------------------------------- stop strings


def _run_table(table_QV, tokens):
  state = 0
  for n, t in enumerate(tokens):
    state = table_QV[state, t]
    if state < 0:
      return n
  return None


def test_stop_table_matches_a_text_search():
  rng = np.random.RandomState(0)
  stop_strings = ["</a>", "aba", "ab>", "```", "\n\n", "b"]
  for trial in range(30):
    tb = _token_table(64, seed=trial)
    tb[5] = b"x</a>b"  # A stop string inside one token.
    tb[6] = b"`"
    tb[7] = b"``"
    strings = list(rng.choice(stop_strings, rng.randint(1, 4), replace=False))
    table = stops.stop_table(tb, strings)
    for _ in range(20):
      toks = rng.randint(0, 64, 30).tolist()
      assert _run_table(table, toks) == stops.first_stop(toks, tb, strings)


def test_stop_string_split_inside_a_utf8_character():
  tb = [b"\xc3", b"\xa9", b"caf", b"!"]  # "é" is two tokens.
  table = stops.stop_table(tb, ["café!"])
  assert _run_table(table, [2, 0, 1, 3]) == 3
  assert _run_table(table, [2, 0, 3]) is None


def test_token_bytes_from_decode_callable():
  vocab = {0: "ab", 1: "\ufffd", 2: " </x>"}
  tb = stops.token_byte_table(lambda ids: "".join(vocab[i] for i in ids), 4)
  assert tb == [b"ab", b"\xff", b" </x>", b""]


def test_cut_at_stop():
  assert stops.cut_at_stop("a </b> c </d>", ["</d>", "</b>"]) == (
      "a </b>", "</b>")
  assert stops.cut_at_stop("x```y", ["```"], keep=False) == ("x", "```")
  assert stops.cut_at_stop("none", ["</b>"]) == ("none", None)


def test_stop_strings_end_rows_exactly(qwen):
  """Each row stops on the token completing its first stop occurrence, even
  when the string spans tokens; rows that never match run to the limit."""
  s, table = qwen["sampler"], qwen["table"]
  prompts = _prompts([3, 10, 6], seed=6)
  kw = dict(max_new_tokens=40, temperature=1.2, seed=7)
  free = s.generate(prompts, **kw)
  s1, _ = _boundary_stop(free.tokens[0], table, 6)
  s2, _ = _boundary_stop(free.tokens[1], table, 25)
  res = s.generate(prompts, stop_strings=[s1, s2], **kw)
  for i, t in enumerate(free.tokens):
    n = stops.first_stop(t, table, [s1, s2])
    if n is None:
      assert res.stop_reasons[i] == "length" and res.tokens[i] == t
      continue
    assert res.stop_reasons[i] == "stop"
    assert res.tokens[i] == t[:n + 1]
    np.testing.assert_allclose(res.logprobs[i], free.logprobs[i][:n + 1],
                               atol=1e-5)
    text = b"".join(table[j] for j in res.tokens[i]).decode()
    want, matched = stops.cut_at_stop(text, [s1, s2])
    assert (res.texts[i], res.matched_stops[i]) == (want, matched)
  assert res.stop_reasons[0] == "stop"


def test_eos_stops_a_row(qwen):
  s, table = qwen["sampler"], qwen["table"]
  prompts = _prompts([5, 8], seed=8)
  free = s.generate(prompts, max_new_tokens=20)
  eos = free.tokens[1][4]
  # A Sampler of the same model shares the compiled programs.
  with_eos = Sampler(qwen["params"], qwen["cfg"], config=dataclasses.replace(
      TINY_CONFIG, eos_ids=(eos,)), token_bytes=table)
  with compile_events.counting() as compiles:
    res = with_eos.generate(prompts, max_new_tokens=20)
  assert not compile_events.cache_programs(compiles)
  for i, t in enumerate(free.tokens):
    n = t.index(eos) if eos in t else None
    if n is None:
      assert res.tokens[i] == t and res.stop_reasons[i] == "length"
      continue
    assert res.tokens[i] == t[:n + 1] and res.stop_reasons[i] == "eos"
    assert res.texts[i] == b"".join(table[j] for j in t[:n]).decode()


# ----------------------------------------------------- limits and errors


def test_cache_full_and_too_long(qwen):
  s = qwen["sampler"]
  with pytest.raises(ValueError, match="max_cache_len"):
    s.generate([[1] * 129], max_new_tokens=4)
  with pytest.raises(ValueError, match="empty"):
    s.generate([[1], []], max_new_tokens=4)
  res = s.generate(_prompts([100, 4], seed=9), max_new_tokens=64)
  assert res.stop_reasons == ["cache_full", "length"]
  assert [len(t) for t in res.tokens] == [28, 64]


def test_compiles_a_fixed_number_of_programs(qwen):
  s = qwen["sampler"]
  s.generate(_prompts([3]), max_new_tokens=8)  # The programs exist.
  with compile_events.counting() as compiles:
    for i, lengths in enumerate([[1], [30, 2], [17, 5, 9], [8, 8, 8, 8]]):
      s.generate(_prompts(lengths, seed=i), max_new_tokens=10 + 9 * i,
                 temperature=0.5 * (i % 2), top_k=i, top_p=0.9,
                 stop_strings=["ab", "</a>", "x"][:i], seed=i)
  assert not compile_events.cache_programs(compiles), compiles


# ------------------------------------------------------ host round trips


@pytest.fixture
def host_traffic(monkeypatch):
  """Counts, by name, the pool's programs dispatched, the host arrays they
  take ('to_device') and the device-to-host copies of `jax.Array`s
  ('read': `device_get`, `np.asarray`, `int()` alike)."""
  counts = collections.Counter()
  for name in ("init", "append", "decode"):
    def counted(*args, _program=getattr(pages, name), _name=name, **kw):
      counts[_name] += 1
      counts["to_device"] += sum(isinstance(x, np.ndarray)
                                 for x in jax.tree.leaves(args))
      return _program(*args, **kw)
    monkeypatch.setattr(pages, name, counted)
  # Every read of a device buffer to the host goes through this method
  # (on a CPU the transfer guard does not fire: nothing is copied).
  copy = getattr(ArrayImpl, "_single_device_array_to_np_array_did_copy",
                 None)
  if copy is None:  # A private hook; a JAX without it cannot be counted.
    pytest.skip("this jax has no ArrayImpl read hook to count reads with")

  def counted_copy(self):
    counts["read"] += 1
    return copy(self)
  monkeypatch.setattr(ArrayImpl, "_single_device_array_to_np_array_did_copy",
                      counted_copy)
  return counts


def test_host_round_trips_per_decode_chunk(qwen, host_traffic):
  """A chunk of decode steps is one program and one read-back of its four
  outputs (tokens, log-probs, counts, reasons): its steps never return to
  the host. `Sampler.generate` decodes every token in one chunk."""
  s = qwen["sampler"]
  prompts = _prompts([7, 3, 11, 5], seed=4)
  s.generate(prompts, max_new_tokens=20)  # Compiles outside the count.
  host_traffic.clear()
  res = s.generate(prompts, max_new_tokens=20)
  assert [len(t) for t in res.tokens] == [20] * 4
  # Host arrays: append's rows, page tables, tokens held, stop states,
  # tokens, mask; decode's rows, page tables, tokens held, 5 draw columns,
  # budgets, EOS ids.
  assert host_traffic == dict(init=1, append=1, decode=1, read=4,
                              to_device=16)
  # The engine's way: a chunk after each stretch (20 tokens each here),
  # on generate's programs.
  dev, rows = _opened(s, prompts, chunk_steps=64)
  host_traffic.clear()
  for _ in range(3):
    assert [len(t) for t, _, _ in _decode(dev, rows)] == [20] * 4
  dev.close()
  assert host_traffic == dict(decode=3, read=12, to_device=30)


# ------------------------------------------------------------------ mesh


_MESH_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, numpy as np
    jax.config.update("jax_default_matmul_precision", "highest")
    from jax.sharding import PartitionSpec as P
    from swirl_jax import sharding as shd
    from swirl_jax.models import hf_io
    from swirl_jax.training import lora
    from swirl_jax.sampling.sampler import Sampler, SamplerConfig
    path, want = sys.argv[1], json.loads(sys.argv[2])
    mesh = shd.make_mesh([("data", 4), ("fsdp", 1), ("tensor", 2)])
    cfg, params = hf_io.load_hf_dir(path, mesh=mesh)
    s = Sampler(params, cfg, config=SamplerConfig.from_config(want["config"]),
                mesh=mesh)
    res = s.generate(want["prompts"], **want["kw"])
    assert res.tokens == want["tokens"], (res.tokens, want["tokens"])
    err = max(float(np.abs(np.asarray(a) - b).max())
              for a, b in zip(res.logprobs, want["logprobs"]))
    assert err < 1e-4, err
    # Rows over the 4 data groups, each decoding on its 2 devices.
    groups = s.device(1, 8).groups
    assert [sorted(d.id for d in g.layout.mesh.devices.flat)
            for g in groups] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # LoRA: adapters sharded as the trainer holds them, merged on the mesh
    # (the trainer's policy_params), sampled with the same programs.
    sys.path.insert(0, "tests")
    from test_sampler import lora_adapters
    adapters, lora_cfg, shardings = lora_adapters(cfg, params, mesh)
    adapters = jax.device_put(adapters, shardings)
    merged = lora.merge(params, adapters, lora_cfg)
    for w, base in zip(jax.tree.leaves(merged), jax.tree.leaves(params)):
      assert w.sharding.is_equivalent_to(base.sharding, w.ndim), w.sharding
    s.params = merged
    res = s.generate(want["prompts"], **want["kw"])
    assert res.tokens == want["lora_tokens"], (res.tokens, want["lora_tokens"])
    print("OK", err)
""")


def lora_adapters(cfg, params, mesh=None):
  """Rank-4 adapters with nonzero `b` (seeded), the LoRA config and, on a
  mesh, the adapters' shardings."""
  lora_cfg = lora.default_config()
  lora_cfg.rank, lora_cfg.alpha = 4, 8.0
  rng = np.random.default_rng(3)
  adapters = jax.tree.map(
      lambda x: rng.normal(0.0, 0.2, x.shape).astype(np.float32),
      jax.eval_shape(lambda p: lora.init_adapters(p, lora_cfg,
                                                  jax.random.key(0)), params))
  if mesh is None:
    return adapters, lora_cfg, None
  axes = lora.logical_axes(decoder.param_logical_axes(cfg), lora_cfg)
  return adapters, lora_cfg, shd.tree_shardings(axes, adapters, mesh)


def test_sharded_sampler_on_fake_mesh(qwen):
  """data x tensor against one device, the base model and LoRA merged.
  (Sampling always attends over the KV cache with `attention.attend`:
  `attention_impl` only picks the no-cache path, so it has no case here.)"""
  prompts = _prompts([5, 12, 9, 2], seed=10)
  kw = dict(max_new_tokens=16, temperature=0.9, top_k=20, seed=5)
  res = qwen["sampler"].generate(prompts, **kw)
  adapters, lora_cfg, _ = lora_adapters(qwen["cfg"], qwen["params"])
  sampler = qwen["sampler"]
  sampler.params = lora.merge(qwen["params"], adapters, lora_cfg)
  try:  # The trainer's swap of weights: the same programs.
    lora_res = sampler.generate(prompts, **kw)
  finally:
    sampler.params = qwen["params"]
  assert lora_res.tokens != res.tokens  # The adapters change the samples.
  config = dataclasses.asdict(TINY_CONFIG)
  want = dict(config=config, prompts=prompts, kw=kw, tokens=res.tokens,
              logprobs=[lp.tolist() for lp in res.logprobs],
              lora_tokens=lora_res.tokens)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             PYTHONPATH=os.pathsep.join(
                 [os.path.dirname(os.path.dirname(__file__)),
                  os.environ.get("PYTHONPATH", "")]))
  out = subprocess.run([sys.executable, "-c", _MESH_SCRIPT,
                        str(qwen["path"]), json.dumps(want)],
                       capture_output=True, text=True, env=env, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "OK" in out.stdout
