"""The page pool against the slot cache it replaced (golden outputs in
tests/data/decode_golden.json, tests/decode_golden.py): the same tokens
and log-probs from `Sampler.generate` and the rollout engine, greedy and
seeded, also when a pool too small for every row makes the engine preempt
rows and recompute them (the tiny model's greedy rollout on the default
pool is checked by tests/test_engine.py::test_engine_equals_lockstep);
a preempted row's stretch is an unpreempted one's, stop strings across
chunks included; the Pallas kernels (in their interpreters) and every
decode path against the reference; one program for any rows of a
bucket."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import compile_events
import decode_golden
import testutil
from swirl_jax.models import attention, decoder, paged, presets
from swirl_jax.sampling import pages
from swirl_jax.sampling.device import Draw, PlainRow
from swirl_jax.sampling.sampler import Sampler, SamplerConfig

GOLDEN = decode_golden.GOLDEN
# A pool too small for the engine's 4 rows in flight: 512-token rows of
# 16-slot pages, 32 pages (one row at the limit) where 4 rows reach ~250.
# The engine checks its bookkeeping after every step.
SMALL_POOL = dict(
    engine_kw=dict(pages=32, check_invariants=True),
    sampler_kw=dict(max_cache_len=512, page_size=16,
                    cache_buckets=(256, 384, 512)))


def test_generate_equals_the_slot_cache():
  """Tiny, mini and a Gemma-2-like model (sliding window, soft-caps):
  greedy, seeded with per-row budgets, a crossing of the first cache
  bucket and a stop string. (About a minute: three models' programs.)"""
  got = decode_golden.generate_cases()
  assert set(got) == {k for k in GOLDEN if not k.startswith("engine_")}
  for name, out in got.items():
    want = GOLDEN[name]
    assert out["tokens"] == want["tokens"], name
    assert out["reasons"] == want["reasons"], name
    for a, b in zip(out["logprobs"], want["logprobs"]):
      np.testing.assert_allclose(a, b, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("preset,temperature", [
    ("tiny", 0.0), ("tiny", 1.0), ("mini", 1.0)])
def test_engine_equals_the_slot_cache(preset, temperature):
  """The engine's rollouts (6 rows, 4 in flight, calculator calls, false
  stops) token for token, with a pool too small for every row: rows are
  preempted and recomputed, and the behaviour log-probs still equal a
  teacher-forced pass's. Every page comes back when the rollout ends.
  Rows share no prompt pages here: a task's two samples sharing theirs
  leave the pool roomy enough that whether a row is preempted turns on
  when the tools return (test_rows_with_one_prompt_share_its_pages
  preempts shared rows; tests/test_engine.py runs the engine sharing)."""
  trajs, eng, (cfg, params) = decode_golden.engine_run(
      preset, temperature, engine_kw=SMALL_POOL["engine_kw"],
      sampler_kw=dict(SMALL_POOL["sampler_kw"], share_prompts=False))
  decode_golden.assert_same_trajs(decode_golden.trajs_json(trajs),
                                  decode_golden.ENGINE_GOLDEN[
                                      f"engine_{preset}_{temperature}"])
  m = eng.metrics
  assert m["preempted"] > 0 and m["recomputed_tokens"] > 0
  assert eng.device.peak_pages <= 32
  entries, free = eng.device.free()
  assert entries == 4 and free == 32
  if temperature > 0:
    assert testutil.teacher_forced_gap(cfg, params, trajs, eng.config) \
        <= 2e-4


# --------------------------------------------------------- on the device


@pytest.fixture(scope="module")
def tiny():
  cfg = presets.get_preset("tiny")
  params = decoder.init_params(cfg, jax.random.key(2))
  table = decode_golden._table(cfg.vocab_size)  # pylint: disable=protected-access
  config = SamplerConfig(max_cache_len=128, page_size=16,
                         batch_buckets=(4,), length_buckets=(32,),
                         cache_buckets=(64, 128), eos_ids=())
  return cfg, params, table, config


def _rows(prompts, budget):
  return [PlainRow(i, list(p), budget) for i, p in enumerate(prompts)]


def _chunks(dev, rows, n, stop_strings, preempt=()):
  """`n` decode chunks of every row, preempting `preempt[k]` (row indices)
  after chunk k: each row's tokens, log-probs and reasons, joined."""
  out = [([], [], []) for _ in rows]
  draws = [Draw(7, 1.0, 0, 1.0, i) for i in range(len(rows))]
  for k in range(n):
    live = [i for i, (_, _, why) in enumerate(out) if rows[i].budget > 0
            and (not why or why[-1] == "length")]
    got, _ = dev.decode([rows[i] for i in live], [draws[i] for i in live],
                        stop_strings)
    for i, (t, lp, why) in zip(live, got):
      out[i][0].extend(t)
      out[i][1].extend(lp)
      out[i][2].append(why)
      rows[i].length += len(t)
      rows[i].budget -= len(t)
    for i in (preempt[k] if k < len(preempt) else ()):
      dev.preempt(rows[i])
  return out


def test_a_preempted_row_continues_as_if_never_preempted(tiny):
  """Chunks of 5 steps; rows preempted between chunks (their pages freed,
  tokens kept) are recomputed by their next chunk and give the tokens and
  log-probs of an unpreempted run, a stop string begun before the
  preemption and completed after it included."""
  cfg, params, table, config = tiny
  s = Sampler(params, cfg, config=config, token_bytes=table)
  prompts = [np.random.RandomState(i).randint(0, 256, n).tolist()
             for i, n in enumerate([9, 30, 17])]

  def run(preempt, stop_strings=()):
    dev = s.device(4, 5, 32)
    dev.open(3, 3)
    rows = _rows(prompts, 30)
    dev.append(rows, fresh=True)
    for r in rows:
      r.length = len(r.obs)
    out = _chunks(dev, rows, 6, stop_strings, preempt)
    held = sum(len(r.seat.pages) for r in rows)
    assert dev.free()[1] == dev._P - held  # pylint: disable=protected-access
    dev.close()
    return out

  free = run(())
  # A stop string over tokens 3..6 of row 1: it starts in the first chunk
  # and ends in the second, across the preemption.
  text = [table[t] for t in free[1][0]]
  stop = (text[3][-1:] + b"".join(text[4:6]) + text[6][:1]).decode()
  assert stop not in b"".join(text[:6]).decode()
  want = run((), (stop,))
  got = run(([1], [0, 2], [1]), (stop,))
  assert [t for t, _, _ in got] == [t for t, _, _ in want]
  assert [w[-1] for _, _, w in got] == [w[-1] for _, _, w in want]
  assert want[1][2][-1] == "stop" and len(want[1][0]) > 5
  for (_, a, _), (_, b, _) in zip(got, want):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_rows_with_one_prompt_share_its_pages(tiny):
  """Three samples of each of two prompts (37 tokens: two full 16-slot
  pages and a partial one; 32: two full pages): one prefill a prompt, the
  others share its full pages and copy the partial one. Seeded chunks,
  with a leader and a follower preempted between them, give the tokens
  and log-probs of rows that share nothing; no row writes a page another
  holds; every page comes back."""
  cfg, params, table, config = tiny
  base = [np.random.RandomState(i).randint(0, 256, n).tolist()
          for i, n in enumerate([37, 32])]
  prompts = [base[0]] * 3 + [base[1]] * 3

  def run(share, preempt=()):
    s = Sampler(params, cfg, config=dataclasses.replace(
        config, share_prompts=share), token_bytes=table)
    dev = s.device(4, 5, 32)
    dev.open(6, 6)
    rows = _rows(prompts, 30)
    dev.append(rows, fresh=True)
    held = dev.held()
    for r in rows:
      r.length = len(r.obs)
    out = _chunks(dev, rows, 4, (), preempt)
    counts = dict(dev.counts, held_after_prefill=held)
    for r in rows:
      dev.release(r)
    assert dev.free() == (6, dev.size()[1]) and dev.held() == 0
    dev.close()
    return out, counts

  want, alone = run(False)
  got, shared = run(True, ([0, 4], [], [1]))
  assert [t for t, _, _ in got] == [t for t, _, _ in want]
  for (_, a, _), (_, b, _) in zip(got, want):
    np.testing.assert_allclose(a, b, atol=1e-6)
  assert alone["prefill_tokens"] == 3 * (37 + 32)
  assert shared["prefill_tokens"] == 37 + 32
  assert shared["forked_rows"] == 4 and shared["shared_pages"] == 4 * 2
  # 3 + 2 pages the leaders, a partial page each of the two followers of
  # the 37-token prompt.
  assert alone["held_after_prefill"] == 15
  assert shared["held_after_prefill"] == 7


def test_a_leader_preempted_before_its_prefill_leaves_no_stale_pages(tiny):
  """A follower whose leader lets go of the shared pages before filling
  them prefills its prompt into pages of its own: the same tokens as
  rows that share nothing."""
  cfg, params, table, config = tiny
  prompt = np.random.RandomState(3).randint(0, 256, 40).tolist()
  out = {}
  for share in (True, False):
    s = Sampler(params, cfg, config=dataclasses.replace(
        config, share_prompts=share), token_bytes=table)
    dev = s.device(4, 5, 32)
    dev.open(2, 2)
    rows = _rows([prompt] * 2, 10)
    assert dev.reserve(rows, [40, 40])
    if share:
      assert rows[1].seat.pages[:2] == rows[0].seat.pages[:2]
      dev.preempt(rows[0])
    dev.append(rows, fresh=True)
    for r in rows:
      r.length = len(r.obs)
    out[share] = _chunks(dev, rows, 2, ())
    assert not share or dev.counts["forked_rows"] == 0
    dev.close()
  assert [t for t, _, _ in out[True]] == [t for t, _, _ in out[False]]


def test_a_shared_page_is_never_written(tiny):
  """A decode that would write into a page another row holds raises
  before it runs."""
  cfg, params, table, config = tiny
  s = Sampler(params, cfg, config=config, token_bytes=table)
  dev = s.device(4, 5, 32)
  dev.open(2, 2)
  rows = _rows([list(range(40))] * 2, 10)
  dev.append(rows, fresh=True)
  assert rows[0].seat.pages[:2] == rows[1].seat.pages[:2]
  assert rows[0].seat.pages[2] != rows[1].seat.pages[2]
  rows[1].seat.pages[2] = rows[0].seat.pages[2]  # A bookkeeping bug.
  dev._refs[rows[0].seat.pages[2]] += 1  # pylint: disable=protected-access
  with pytest.raises(RuntimeError, match="shares with another row"):
    dev.decode(rows, [Draw(0)] * 2, ())
  dev.close()


def test_one_program_serves_any_rows(tiny):
  """Decoding other rows, in other entries and pages, compiles nothing;
  the decode program does not grow with its rows (they are arrays, not
  unrolled), where the slot cache's grew by a slice and an update a row."""
  cfg, params, table, config = tiny
  s = Sampler(params, cfg, config=config, token_bytes=table)
  dev = s.device(4, 4, 32)
  dev.open(8, 8)
  prompts = [np.random.RandomState(i).randint(0, 256, 20).tolist()
             for i in range(8)]
  rows = _rows(prompts, 12)
  dev.append(rows, fresh=True)
  dev.decode(rows[:4], [Draw(0)] * 4, ())
  with compile_events.counting() as compiles:
    dev.decode(rows[4:], [Draw(1)] * 4, ())
    dev.decode(rows[2:6], [Draw(2)] * 4, ())
  assert not compile_events.cache_programs(compiles)
  dev.close()
  sizes = {}
  for batch in (8, 64):
    big = s.device(batch, 4, 32)
    program = big.lowerable(batch, ())["decode"].lower()
    sizes[batch] = len(program.as_text())
  assert sizes[64] < 1.05 * sizes[8], sizes


# ------------------------------------------------------------- kernels


def _pool(cfg, seed=0, pages_=16, page=8, bf16_exact=False):
  rng = np.random.RandomState(seed)
  x = lambda *s: jnp.asarray(rng.randn(*s), jnp.float32)
  kp, vp = (x(cfg.num_kv_heads, pages_, page, cfg.head_dim) for _ in "kv")
  if bf16_exact:  # Values a bf16 matmul pass multiplies exactly.
    kp, vp = (a.astype(jnp.bfloat16).astype(jnp.float32) for a in (kp, vp))
  return kp, vp, rng


@pytest.mark.parametrize("backend", ["gpu", "tpu"])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_pallas_kernels_match_the_reference(backend, softcap):
  """JAX's Pallas paged-attention kernels, in their interpreters on the
  CPU, against the decoder's attention over the gathered pages (the xla
  path's): rows of lengths inside a page, at a page's end and across
  pages, in pages out of order. The TPU kernel multiplies in bf16 passes
  (its default precision): its inputs are bf16 values, which such a pass
  multiplies exactly."""
  cfg = presets.get_preset("tiny").replace(attn_logit_softcap=softcap)
  kp, vp, rng = _pool(cfg, bf16_exact=backend == "tpu")
  table = jnp.asarray(rng.permutation(16)[:12].reshape(3, 4), jnp.int32)
  lengths = jnp.asarray([5, 16, 29], jnp.int32)
  q = jnp.asarray(rng.randn(3, 1, cfg.num_heads, cfg.head_dim), jnp.float32)
  if backend == "tpu":
    q = q.astype(jnp.bfloat16).astype(jnp.float32)
  k, v = paged.gather(kp, vp, table)
  mask = (jnp.arange(32)[None] < lengths[:, None])[:, None, :]
  want = attention.attend(cfg, q, k, v, mask, keys_last=True)
  if backend == "tpu":
    from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
    with pltpu.force_tpu_interpret_mode():
      got = paged.attend_pages(cfg, q, kp, vp, table, lengths, "tpu")
  else:
    got = paged.attend_pages(cfg, q, kp, vp, table, lengths, "gpu")
  np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("impl", ["xla_pages", "pallas"])
def test_every_decode_path_gives_the_reference_tokens(tiny, impl):
  """`generate` with the pages read each step (gathered, or by the GPU
  kernel in its interpreter) gives the xla path's tokens and log-probs;
  a sliding-window model's 'pallas' decodes with xla_pages."""
  cfg, params, table, config = tiny
  prompts = [np.random.RandomState(i).randint(0, 256, n).tolist()
             for i, n in enumerate([3, 21, 40])]
  kw = dict(max_new_tokens=[12, 30, 20], temperature=1.0, seed=4)
  want = Sampler(params, cfg, config=config).generate(prompts, **kw)
  got = Sampler(params, cfg.replace(paged_attention_impl=impl),
                config=config).generate(prompts, **kw)
  assert got.tokens == want.tokens
  for a, b in zip(got.logprobs, want.logprobs):
    np.testing.assert_allclose(a, b, atol=1e-5)
  gemma = cfg.replace(family="gemma2", sliding_window=4, layer_types=(
      "sliding_attention", "full_attention"), paged_attention_impl=impl)
  assert paged.resolve(gemma) == "xla_pages"


def test_pool_sizes_are_checked(tiny):
  cfg, params, table, config = tiny
  s = Sampler(params, cfg, config=config)
  with pytest.raises(ValueError, match="cannot hold one row"):
    s.device(4, 4, 32).open(4, 4, pages=7)  # A row at 128 needs 8 of 16.
  with pytest.raises(ValueError, match="page_size"):
    SamplerConfig(page_size=48)  # 256 is no multiple of it.
  dev = s.device(4, 4, 32)
  dev.open(4, 4, pages=8)
  rows = _rows([[1] * 100, [2] * 60], 4)
  assert not dev.reserve(rows, [100, 60])  # 7 + 4 pages: all or nothing.
  assert dev.free() == (4, 8) and all(r.seat is None for r in rows)
  with pytest.raises(RuntimeError, match="reserve them first"):
    dev.append(rows, fresh=True)
  dev.close()


_DATA_GROUPS_RESERVE = """
import json
import numpy as np
from swirl_jax.sampling import pages
from swirl_jax.sampling.device import PlainRow

def group(g):
  dev = pages.PagedDevice.__new__(pages.PagedDevice)
  dev.group, dev.limit, dev.page, dev._P, dev.peak_pages = g, 64, 16, 8, 0
  dev._free_entries, dev._free_pages = [1, 0], list(range(8))[::-1]
  dev._refs, dev.share = np.zeros(8, np.int32), False
  dev._leaders, dev._follows = {}, {}
  return dev

groups = pages.DataGroups.__new__(pages.DataGroups)
groups.groups = [group(0), group(1)]
rows = [PlainRow(i, [1] * 20) for i in range(3)]
ok = groups.reserve(rows, [20, 20, 40])
free = [sum(g.free()[i] for g in groups.groups) for i in (0, 1)]
print(json.dumps(dict(ok=ok, asserts=__debug__, free=free,
                      pages=[len(r.seat.pages) for r in rows])))
"""


def test_data_groups_reserve_under_python_o():
  """`python -O` drops asserts: the data groups' reserve, once an
  `assert` around the groups' own, must still take the pages (before, the
  rows got seats and no pages)."""
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run(
      [sys.executable, "-O", "-c", _DATA_GROUPS_RESERVE], cwd=root,
      env=dict(os.environ, PYTHONPATH=root), capture_output=True, text=True,
      timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["ok"] and not out["asserts"]
  assert out["pages"] == [2, 2, 3] and out["free"] == [1, 16 - 7]
