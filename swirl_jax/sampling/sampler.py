"""`Sampler`: batched, multi-turn generation from token ids.

One turn of a rollout is `generate` (sample until each row stops), then the
host parses the text, runs tools and `extend`s each row with its observation
tokens, and `generate(state=...)` continues: the earlier context stays in the
KV cache and is never recomputed.

Shapes are bucketed so a run compiles few programs: the batch, prompt and
observation lengths, the cache length and the new-token buffer are each
rounded up to a bucket from `SamplerConfig`. Prompts are left-padded; padded
slots are invalid in the cache, and every row keeps its own positions.

States are used once: `generate` and `extend` donate the cache they are given
(it is updated in place), so keep only the state they return.

The module (~590 lines) holds the one sampler the jobs and the rollout
engine share: its config, bucketing, program cache and the generate /
extend / select entry points read as one contract; the decode kernels live
in `decoding.py` and the engine's slot cache in `slots.py`.
"""

import collections
import dataclasses
import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from swirl_jax import config_lib
from swirl_jax import distributed
from swirl_jax import sharding as shd
from swirl_jax.models import decoder, loading
from swirl_jax.models.config import ModelConfig
from swirl_jax.sampling import decoding, stops
from swirl_jax.shapes import bucket

_POW2 = tuple(2 ** i for i in range(21))


@dataclasses.dataclass(frozen=True)
class SamplerConfig(config_lib.FromConfig):
  """Sizes and defaults; `from_config` reads a config block of these keys."""
  max_cache_len: int = 4096  # Slots per row, padding included.
  cache_dtype: str | None = None  # None: the model's activation dtype.
  batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
  # Prompt and observation lengths (padding costs slots: keep them fine).
  length_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 384, 512, 768,
                                     1024, 1536, 2048, 3072, 4096)
  # The cache grows through these as a context gets longer; attention reads
  # the whole cache every step, so a short context keeps a short cache
  # (steps of 1.5x: at most a third of the slots idle).
  cache_buckets: tuple[int, ...] = (256, 384, 512, 768, 1024, 1536, 2048,
                                    3072, 4096, 6144, 8192, 12288, 16384,
                                    24576, 32768)
  step_buckets: tuple[int, ...] = (16, 64, 256, 1024, 4096)  # max_new_tokens.
  stop_state_buckets: tuple[int, ...] = (16, 64, 256, 1024)
  keep_stop_string: bool = True  # In the returned text.
  eos_ids: tuple[int, ...] | None = None  # None: tokenizer's, else model's.
  # Decode on the host's devices as a ('data', 'tensor') mesh
  # (`decode_layout`): weights and KV heads over 'tensor', rows over
  # 'data', each data group holding the weights once. tensor_parallel:
  # devices per group (0: from 1B params, the most that divide the heads,
  # KV heads and the host's devices; else 1). data_parallel: groups (0:
  # from 1B params, the host's devices / tensor_parallel; else 1). Ignored
  # when the Sampler is given a mesh.
  tensor_parallel: int = 1
  data_parallel: int = 1
  # Rows of one `generate` call where a job samples many prompts at once
  # (SWiRL stage 2 goes in calls of at most this many); 0: all at once.
  max_rows: int = 0


@dataclasses.dataclass
class SamplerState:
  """A batch of contexts in a KV cache, between turns.

  Attributes:
    cache: the model's KV cache (device), batch padded to a bucket.
    logits_BV: next-token logits of every row (device).
    stop_state_B: stop-string matcher state of every row (device).
    lengths: [rows] tokens in each row's context, i.e. its next position.
    index: cache slots used so far (padding included), same for all rows.
    seeds, salts: [rows] each row's PRNG key is fold_in(key(seed), salt).
    stop_strings: what `stop_state_B` is matching.
  """
  cache: dict
  logits_BV: jax.Array
  stop_state_B: jax.Array
  lengths: np.ndarray
  index: int
  seeds: np.ndarray
  salts: np.ndarray
  stop_strings: tuple[str, ...] = ()
  consumed: bool = False

  @property
  def num_rows(self) -> int:
    return len(self.lengths)

  @property
  def cache_len(self) -> int:
    return int(self.cache["valid"].shape[1])

  @property
  def padded_batch(self) -> int:
    return int(self.cache["valid"].shape[0])


@dataclasses.dataclass
class GenerateResult:
  """One turn for every row of the state ([] / None for rows not sampled).

  Attributes:
    tokens: the new token ids; the last is the EOS or the token that
      completed the stop string, and the cache ends exactly there.
    logprobs: float32 log-prob of each token under the distribution it was
      drawn from (after temperature / top-k / top-p; greedy: the model's).
    texts: the tokens' text (a final EOS left out), cut after the first
      stop string (or before it, `keep_stop_string=False`); None without a
      tokenizer or token table.
    stop_reasons: 'eos' | 'stop' | 'length' | 'cache_full'.
    matched_stops: the stop string a 'stop' row ended with.
    state: the state to `extend` and continue from.
  """
  tokens: list[list[int]]
  logprobs: list[np.ndarray]
  texts: list[str] | None
  stop_reasons: list[str | None]
  matched_stops: list[str | None]
  state: SamplerState


def _per_row(value, n: int, name: str, dtype) -> np.ndarray:
  arr = np.asarray(value, dtype)
  if arr.ndim == 0:
    return np.full((n,), arr, dtype)
  if arr.shape != (n,):
    raise ValueError(f"{name}: {arr.shape[0]} values for {n} rows")
  return arr


class Sampler:
  """Holds the model, tokenizer and config; jits and runs `decoding`.

  Args:
    params: the model's params (placed / sharded already).
    cfg: its ModelConfig.
    tokenizer: optional; gives EOS ids, token bytes for stop strings and
      texts (any object with `eos_ids` and `token_bytes(i)` or `decode`).
    config: a SamplerConfig.
    mesh: shard rows over the mesh's batch axes ('data', 'fsdp').
    rules: logical-axis rules for the mesh.
    token_bytes: the token -> bytes table, instead of the tokenizer's.
  """

  def __init__(self, params, cfg: ModelConfig, tokenizer=None,
               config: SamplerConfig = SamplerConfig(), mesh=None,
               rules=shd.DEFAULT_RULES, token_bytes=None):
    self.cfg, self.tokenizer = cfg, tokenizer
    if mesh is None:
      mesh = decode_mesh(config, cfg)
    self.config, self.mesh, self.rules = config, mesh, rules
    self.params = params
    self._token_bytes_src = token_bytes
    self._token_bytes = None
    self._stop_tables: dict[tuple[str, ...], jax.Array] = {}
    self._eos = self._eos_ids()
    self.programs = _programs(cfg, config.cache_dtype, mesh, rules)

  @property
  def params(self):
    """The params, with the layers split for the cached path (one copy of
    the weights, made here so that decode steps never slice them)."""
    return self._params

  @params.setter
  def params(self, params):
    """Takes params in any layout, this host's or sharded over every host
    (the trainer's): this host's copy, laid out for its decode mesh,
    device to device (`distributed.to_local`)."""
    if self.mesh is not None or jax.process_count() > 1:
      params = distributed.to_local(params, self._layout(
          split=isinstance(params["layers"], (tuple, list))))
    self._params = _split_layers(params)

  def _layout(self, split: bool):
    """The params' shardings on the decode mesh (no mesh: this host's
    first device)."""
    mesh = self.mesh or shd.make_mesh([("one", 1)], jax.local_devices()[:1])
    return decoding.param_shardings(self.cfg, mesh, self.rules, split)

  @property
  def trace_counts(self) -> collections.Counter:
    """Traces (= compilations) per program, shared by like Samplers."""
    return self.programs.trace_counts

  def _run(self, fn, *args):
    if self.mesh is None:
      return fn(*args)
    with shd.use_mesh(self.mesh, self.rules):
      return fn(*args)

  def _put(self, x):
    """A host batch-major array, rows over the mesh's batch axes."""
    if self.mesh is None:
      return jnp.asarray(x)
    x = np.asarray(x)
    return jax.device_put(x, shd.data_sharding(self.mesh, x.ndim, self.rules,
                                               x.shape))

  # -- sizes --

  def _batch_size(self, n: int) -> int:
    b = bucket(n, self.config.batch_buckets)
    if self.mesh is not None:  # Whole rows on every batch shard.
      table = dict(self.rules)
      axes = table.get("batch") or ()
      axes = (axes,) if isinstance(axes, str) else axes
      dp = math.prod(self.mesh.shape.get(a, 1) for a in axes)
      b = dp * math.ceil(b / dp)
    return b

  def _cache_size(self, need: int) -> int:
    return min(bucket(need, self.config.cache_buckets),
               self.config.max_cache_len)

  def _eos_ids(self) -> np.ndarray:
    ids = self.config.eos_ids
    if ids is None and self.tokenizer is not None:
      ids = getattr(self.tokenizer, "eos_ids", None)
    if ids is None:
      ids = self.cfg.eos_token_id
    ids = [] if ids is None else ([ids] if isinstance(ids, int) else ids)
    out = np.full((bucket(max(len(ids), 1), _POW2[3:]),), -1, np.int32)
    out[:len(ids)] = ids
    return out

  # -- token bytes and stop strings --

  def token_bytes(self) -> list[bytes] | None:
    """The token -> bytes table (built once), None without a source."""
    if self._token_bytes is None:
      src = self._token_bytes_src
      if src is None and self.tokenizer is not None:
        src = (self.tokenizer if hasattr(self.tokenizer, "token_bytes")
               else self.tokenizer.decode)
      if src is None:
        return None
      self._token_bytes = stops.token_byte_table(src, self.cfg.vocab_size)
    return self._token_bytes

  def _stop_table(self, stop_strings: tuple[str, ...]) -> jax.Array:
    if stop_strings not in self._stop_tables:
      table = self.token_bytes()
      if stop_strings and table is None:
        raise ValueError("stop strings need a tokenizer or token_bytes")
      t = stops.stop_table(table or [b""] * self.cfg.vocab_size,
                           stop_strings)
      q = bucket(t.shape[0], self.config.stop_state_buckets)
      t = np.pad(t, ((0, q - t.shape[0]), (0, 0)))
      dtype = np.int16 if q < 2 ** 15 else np.int32
      self._stop_tables[stop_strings] = jnp.asarray(t.astype(dtype))
    return self._stop_tables[stop_strings]

  # -- states --

  def start(self, prompts: Sequence[Sequence[int]], seed=0,
            room: int = 0) -> SamplerState:
    """Prefills `prompts` (token ids, at least one each) into a new state.

    Args:
      prompts: one list of token ids per row.
      seed: an int (row r gets fold_in(key(seed), r)) or one seed per row
        (row r gets fold_in(key(seed[r]), 0), whatever the batch holds).
      room: free slots wanted after the prompts (the cache grows later
        when needed; this only saves a copy).
    """
    n = len(prompts)
    if n == 0:
      raise ValueError("no prompts")
    lens = np.asarray([len(p) for p in prompts])
    limit = self.config.max_cache_len
    for i, ln in enumerate(lens):
      if ln == 0:
        raise ValueError(f"prompt {i} is empty")
      if ln > limit:
        raise ValueError(
            f"prompt {i} has {ln} tokens; the KV cache holds {limit} "
            "(SamplerConfig.max_cache_len)")
    P = min(bucket(int(lens.max()), self.config.length_buckets), limit)
    S = self._cache_size(P + room)
    B = self._batch_size(n)
    tokens = np.zeros((B, P), np.int32)
    mask = np.zeros((B, P), bool)
    for i, p in enumerate(prompts):  # Left-padded.
      tokens[i, P - len(p):] = p
      mask[i, P - len(p):] = True
    cache, logits = self._run(self.programs.prefill, self.params,
                              self._put(tokens), self._put(mask), S)
    return SamplerState(cache, logits, self._put(np.zeros(B, np.int32)),
                        lens.astype(np.int64), P, **self._seeds(seed, n))

  def _use(self, state: SamplerState) -> SamplerState:
    if state.consumed:
      raise ValueError("this SamplerState was already used (its cache was "
                       "donated): continue from the state last returned")
    state.consumed = True
    return state

  def _ensure_room(self, state: SamplerState, need: int) -> dict:
    """The cache, grown to a bigger bucket when `need` slots do not fit."""
    need = min(need, self.config.max_cache_len)
    if need <= state.cache_len:
      return state.cache
    return self._run(self.programs.resize, state.cache, self._cache_size(need))

  def room(self, state: SamplerState) -> int:
    """Cache slots left to every row (they share one write index)."""
    return self.config.max_cache_len - state.index

  def extend(self, state: SamplerState,
             observations: Sequence[Sequence[int] | None]) -> SamplerState:
    """Appends each row's tokens (None / [] adds none) to its context."""
    if len(observations) != state.num_rows:
      raise ValueError(f"{len(observations)} observations for "
                       f"{state.num_rows} rows")
    obs = [list(o) if o is not None else [] for o in observations]
    lens = np.asarray([len(o) for o in obs])
    T = int(lens.max())
    if T == 0:
      return state
    room = self.room(state)
    if T > room:
      raise ValueError(
          f"observations of up to {T} tokens do not fit: {state.index} of "
          f"{self.config.max_cache_len} cache slots are used "
          "(SamplerConfig.max_cache_len)")
    state = self._use(state)
    T = min(bucket(T, self.config.length_buckets), room)
    cache = self._ensure_room(state, state.index + T)
    B = state.padded_batch
    tokens = np.zeros((B, T), np.int32)
    mask = np.zeros((B, T), bool)
    for i, o in enumerate(obs):
      if o:
        tokens[i, T - len(o):] = o
        mask[i, T - len(o):] = True
    cache, logits = self._run(self.programs.extend, self.params, cache,
                              state.logits_BV, self._put(tokens),
                              self._put(mask))
    touched = np.zeros(B, bool)
    touched[:len(obs)] = lens > 0
    stop_state = jnp.where(self._put(touched), 0, state.stop_state_B)
    return dataclasses.replace(state, cache=cache, logits_BV=logits,
                               stop_state_B=stop_state,
                               lengths=state.lengths + lens,
                               index=state.index + T, consumed=False)

  def select(self, state: SamplerState, rows: Sequence[int]) -> SamplerState:
    """A state of only `rows` (in that order), in a batch bucket that fits."""
    rows = [int(r) for r in rows]
    if not rows:
      raise ValueError("select: no rows")
    state = self._use(state)
    B = self._batch_size(len(rows))
    idx = np.zeros(B, np.int32)
    idx[:len(rows)] = rows
    keep = np.arange(B) < len(rows)
    cache, logits, stop_state = self._run(
        self.programs.take, state.cache, state.logits_BV, state.stop_state_B,
        self._put(idx), self._put(keep))
    return dataclasses.replace(
        state, cache=cache, logits_BV=logits, stop_state_B=stop_state,
        lengths=state.lengths[rows], seeds=state.seeds[rows],
        salts=state.salts[rows], consumed=False)

  # -- generation --

  def generate(self, prompts: Sequence[Sequence[int]] | None = None,
               max_new_tokens=256, stop_strings: Sequence[str] = (),
               temperature=0.0, top_k=0, top_p=1.0, seed=None, *,
               state: SamplerState | None = None,
               rows: Sequence[int] | None = None) -> GenerateResult:
    """Samples one turn for every row (or `rows`) until each stops.

    Args:
      prompts: token ids per row, to start new contexts; or None with
        `state` to continue.
      max_new_tokens: int, or one per row.
      stop_strings: texts that end a row's turn (matched across tokens).
      temperature: 0 is greedy; int/float or one per row (as are top_k,
        top_p).
      top_k: keep the k most likely tokens; 0 is off.
      top_p: nucleus mass; 1 is off.
      seed: see `start`; None continues with the state's seeds (0 new).
      state: continue these contexts (consumed; use the returned one).
      rows: sample only these rows; the others stay as they are.

    Returns:
      A GenerateResult; `.state` continues the contexts.
    """
    if (prompts is None) == (state is None):
      raise ValueError("pass prompts to start, or state to continue")
    n = len(prompts) if state is None else state.num_rows
    max_new = _per_row(max_new_tokens, n, "max_new_tokens", np.int32)
    active = np.zeros(n, bool)
    active[list(range(n)) if rows is None else list(rows)] = True
    most = int(max_new[active].max(initial=0))
    if state is None:
      state = self.start(prompts, 0 if seed is None else seed, room=most)
    elif seed is not None:
      state = dataclasses.replace(state, **self._seeds(seed, n))
    stop_strings = tuple(stop_strings)
    stop_state = state.stop_state_B
    state = self._use(state)
    if stop_strings != state.stop_strings:
      stop_state = jnp.zeros_like(stop_state)
    cache = self._ensure_room(state, state.index + most)
    out = self._run(self.programs.decode, self.params, cache, state.logits_BV,
                    self._pad(active, state), stop_state,
                    self._sampling(state, temperature, top_k, top_p),
                    self._stop_spec(state, max_new, stop_strings),
                    bucket(max(most, 1), self.config.step_buckets))
    return self._result(state, out, active, stop_strings)

  def _seeds(self, seed, n: int) -> dict:
    if np.ndim(seed) == 0:
      return dict(seeds=np.full((n,), seed, np.int64), salts=np.arange(n))
    return dict(seeds=_per_row(seed, n, "seed", np.int64),
                salts=np.zeros(n, np.int64))

  def _pad(self, x: np.ndarray, state: SamplerState, fill=0):
    out = np.full((state.padded_batch,), fill, x.dtype)
    out[:len(x)] = x
    return self._put(out)

  def _sampling(self, state, temperature, top_k, top_p):
    n = state.num_rows
    keys = _row_keys(self._pad(state.seeds.astype(np.uint32), state),
                     self._pad(state.salts.astype(np.uint32), state))
    return decoding.SamplingParams(
        keys,
        self._pad(_per_row(temperature, n, "temperature", np.float32), state),
        self._pad(_per_row(top_k, n, "top_k", np.int32), state),
        self._pad(_per_row(top_p, n, "top_p", np.float32), state, 1.0))

  def _stop_spec(self, state, max_new, stop_strings):
    return decoding.StopSpec(self._pad(max_new, state),
                             jnp.asarray(self._eos),
                             self._stop_table(stop_strings))

  def _result(self, state: SamplerState, out: decoding.DecodeOut,
              active: np.ndarray, stop_strings) -> GenerateResult:
    n = state.num_rows
    # Rows sharded over a multi-host mesh: every host gets them all.
    tokens_BN, lps_BN, num_B, reason_B, index = distributed.to_host(
        (out.tokens_BN, out.logprobs_BN, out.num_B, out.reason_B,
         out.cache["index"]))
    num_B = num_B[:n]
    toks = [tokens_BN[i, :num_B[i]].tolist() for i in range(n)]
    reasons = [decoding.REASONS[r] if a else None
               for r, a in zip(reason_B[:n], active)]
    texts, matched = self._texts(toks, reasons, stop_strings)
    new = dataclasses.replace(
        state, cache=out.cache, logits_BV=out.logits_BV,
        stop_state_B=out.stop_state_B, lengths=state.lengths + num_B,
        index=int(index), stop_strings=stop_strings, consumed=False)
    return GenerateResult(toks, [lps_BN[i, :num_B[i]] for i in range(n)],
                          texts, reasons, matched, new)

  def _texts(self, toks, reasons, stop_strings):
    table = self.token_bytes()
    matched = [None] * len(toks)
    if table is None:
      return None, matched
    eos = set(self._eos.tolist())
    texts = []
    for i, (t, why) in enumerate(zip(toks, reasons)):
      if why == "eos" and t and t[-1] in eos:
        t = t[:-1]
      text = b"".join(table[j] for j in t).decode("utf-8", "replace")
      if why == "stop":
        # A stop string begun in an earlier call is not in this text.
        text, matched[i] = stops.cut_at_stop(
            text, stop_strings, self.config.keep_stop_string)
      texts.append(text)
    return texts, matched


class _Programs:
  """The jitted programs for one (model config, cache dtype, mesh).

  Samplers of the same model share them, so a new Sampler (e.g. with the
  params of the latest training step) compiles nothing.
  """

  def __init__(self, cfg: ModelConfig, cache_dtype: str | None):
    self.trace_counts = collections.Counter()
    counted = functools.partial(decoding.count_traces, self.trace_counts)

    def prefill(params, tokens, mask, cache_len):
      return decoding.prefill(params, cfg, tokens, mask, cache_len,
                              cache_dtype)

    def extend(params, cache, logits, tokens, mask):
      return decoding.extend(params, cfg, cache, tokens, mask, logits)

    def decode(params, cache, logits, active, state, sp, stop, max_steps):
      return decoding.decode(params, cfg, cache, logits, active, state, sp,
                             stop, max_steps)

    self.prefill = jax.jit(counted("prefill", prefill), static_argnums=3)
    # The cache and logits are donated: updated in place, never copied.
    self.extend = jax.jit(counted("extend", extend), donate_argnums=(1, 2))
    self.decode = jax.jit(counted("decode", decode), static_argnums=7,
                          donate_argnums=(1, 2))
    self.resize = jax.jit(counted("resize", _resize), static_argnums=1)
    self.take = jax.jit(counted("take", _take_rows))


def decode_layout(host_devices: int, cfg: ModelConfig, tensor_parallel: int,
                  data_parallel: int) -> tuple[int, int]:
  """(data groups, devices per group) a host decodes with (see
  `SamplerConfig`). KV heads split evenly over 'tensor': a 7B model with 4
  KV heads on 8 devices decodes as 2 groups of 4, not 8 devices each
  holding every head of every row."""
  big = loading.num_params(cfg) >= loading.BIG_MODEL_PARAMS
  t = tensor_parallel
  if t == 0:
    t = max(n for n in range(1, host_devices + 1) if host_devices % n == 0
            and cfg.num_kv_heads % n == 0 and cfg.num_heads % n == 0) \
        if big else 1
  d = data_parallel or (host_devices // t if big else 1)
  if t < 1 or d < 1 or t * d > host_devices:
    raise ValueError(f"sampler.tensor_parallel={tensor_parallel}, "
                     f"data_parallel={data_parallel}: {d} x {t} devices, "
                     f"and a host has {host_devices}")
  return d, t


def decode_mesh(config: SamplerConfig, cfg: ModelConfig):
  """The ('data', 'tensor') mesh of the host's devices a `Sampler` decodes
  on (`decode_layout`); None: one device."""
  d, t = decode_layout(jax.local_device_count(), cfg, config.tensor_parallel,
                       config.data_parallel)
  if d * t == 1:
    return None
  return shd.make_mesh([("data", d), ("tensor", t)],
                       jax.local_devices()[:d * t])


_PROGRAMS: dict[tuple, _Programs] = {}
_split_layers = jax.jit(decoder.split_layers)


def _programs(cfg: ModelConfig, cache_dtype, mesh, rules) -> _Programs:
  # The mesh and rules are part of the key because model code reads them
  # when it is traced.
  key = (cfg, cache_dtype, mesh, tuple(rules))
  if key not in _PROGRAMS:
    _PROGRAMS[key] = _Programs(cfg, cache_dtype)
  return _PROGRAMS[key]


def _row_keys(seeds_B, salts_B):
  return jax.vmap(lambda s, r: jax.random.fold_in(jax.random.key(s), r))(
      seeds_B, salts_B)


def _resize(cache, length: int):
  """The cache with `length` slots per row (new slots empty)."""
  pad = length - cache["valid"].shape[1]
  grow = lambda x, axis: jnp.pad(x, [(0, pad if a == axis else 0)
                                     for a in range(x.ndim)])
  return decoding.constrain_cache(dict(
      cache, k=tuple(grow(x, 3) for x in cache["k"]),
      v=tuple(grow(x, 2) for x in cache["v"]),
      pos=grow(cache["pos"], 1), valid=grow(cache["valid"], 1)))


def _take_rows(cache, logits_BV, stop_state_B, idx_B, keep_B):
  """Rows `idx_B` of everything; rows with keep_B False become empty."""
  cache = dict(cache, k=tuple(x[idx_B] for x in cache["k"]),
               v=tuple(x[idx_B] for x in cache["v"]),
               pos=cache["pos"][idx_B],
               valid=cache["valid"][idx_B] & keep_B[:, None])
  return (decoding.constrain_cache(cache), logits_BV[idx_B],
          stop_state_B[idx_B])


