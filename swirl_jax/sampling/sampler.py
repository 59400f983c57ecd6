"""`Sampler`: batched generation from token ids, on the page pool.

`generate` samples one stretch for every prompt until each stops (an EOS,
a stop string, its token budget or a full cache): it prefills the prompts
into a page pool (`pages.py`) sized for the call, decodes them together
and reads the tokens, log-probs and texts back. The rollout
engine runs the same cache and programs, trajectory by trajectory, on the
device `Sampler.device` gives it; the Sampler also holds what both need of
the model: its params on the decode mesh, EOS ids, stop tables and the
detokeniser.

Sizes are bucketed so a run compiles few programs: rows, prompt pieces,
the prefix of its rows' pages a program reads and the decode steps are
each rounded up to a bucket from `SamplerConfig`.
"""

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from swirl_jax import config_lib
from swirl_jax import dispatch
from swirl_jax import distributed
from swirl_jax import sharding as shd
from swirl_jax.models import decoder, loading
from swirl_jax.models.config import ModelConfig
from swirl_jax.sampling import decoding, pages, stops
from swirl_jax.sampling.device import Draw, PlainRow
from swirl_jax.shapes import bucket

_POW2 = tuple(2 ** i for i in range(21))


@dataclasses.dataclass(frozen=True)
class SamplerConfig(config_lib.FromConfig):
  """Sizes and defaults; `from_config` reads a config block of these keys."""
  max_cache_len: int = 4096  # Context tokens a row holds at most.
  cache_dtype: str | None = None  # None: the model's activation dtype.
  # Slots of a KV-cache page (models/paged.py): a row takes pages as it
  # grows. Each cache bucket is a multiple of it.
  page_size: int = 64
  batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
  # Prompt and observation lengths (padding costs slots: keep them fine).
  length_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 384, 512, 768,
                                     1024, 1536, 2048, 3072, 4096)
  # A program reads its rows' pages up to the first of these past their
  # longest context, so a short context reads little (steps of 1.5x: at
  # most a third of the slots read idle).
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
  # Rows with the same prompt (a group's samples) prefill it once and
  # share its full pages; each copies the last, partial one (pages.py).
  share_prompts: bool = True
  # Rows of one `generate` call where a job samples many prompts at once
  # (SWiRL stage 2 goes in calls of at most this many); 0: all at once.
  max_rows: int = 0

  def __post_init__(self):
    bad = [b for b in self.cache_buckets if b % self.page_size]
    if self.page_size < 1 or bad:
      raise config_lib.ConfigError(
          f"sampler.page_size={self.page_size} must divide every cache "
          f"bucket; {bad} are not multiples of it")


@dataclasses.dataclass
class GenerateResult:
  """One stretch for every prompt.

  Attributes:
    tokens: the new token ids; the last is the EOS or the token that
      completed the stop string.
    logprobs: float32 log-prob of each token under the distribution it was
      drawn from (after temperature / top-k / top-p; greedy: the model's).
    texts: the tokens' text (a final EOS left out), cut after the first
      stop string (or before it, `keep_stop_string=False`); None without a
      tokenizer or token table.
    stop_reasons: 'eos' | 'stop' | 'length' | 'cache_full'.
    matched_stops: the stop string a 'stop' row ended with.
  """
  tokens: list[list[int]]
  logprobs: list[np.ndarray]
  texts: list[str] | None
  stop_reasons: list[str]
  matched_stops: list[str | None]


def _per_row(value, n: int, name: str, dtype) -> np.ndarray:
  arr = np.asarray(value, dtype)
  if arr.ndim == 0:
    return np.full((n,), arr, dtype)
  if arr.shape != (n,):
    raise ValueError(f"{name}: {arr.shape[0]} values for {n} rows")
  return arr


def eos_buffer(ids) -> np.ndarray:
  """EOS ids as the decode programs take them: int32, padded with -1 to a
  power of two (at least 8), so one program serves any tokenizer's."""
  ids = [] if ids is None else ([ids] if isinstance(ids, int) else ids)
  out = np.full((bucket(max(len(ids), 1), _POW2[3:]),), -1, np.int32)
  out[:len(ids)] = ids
  return out


class Sampler:
  """Holds the model, tokenizer and config; generates on the page pool.

  Args:
    params: the model's params (any layout; None: set later).
    cfg: its ModelConfig.
    tokenizer: optional; gives EOS ids, token bytes for stop strings and
      texts (any object with `eos_ids` and `token_bytes(i)` or `decode`).
    config: a SamplerConfig.
    mesh: a ('data', 'tensor') mesh of this host's devices to decode on
      (None: `decode_mesh`, from the config).
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
    self._params = None
    if params is not None:
      self.params = params
    self._token_bytes_src = token_bytes
    self._token_bytes = None
    self._stop_tables: dict[tuple[str, ...], jax.Array] = {}
    ids = config.eos_ids
    if ids is None and tokenizer is not None:
      ids = getattr(tokenizer, "eos_ids", None)
    self.eos_ids = eos_buffer(cfg.eos_token_id if ids is None else ids)

  @property
  def params(self):
    """The params, with the layers split for the cached path (one copy of
    the weights, made here so that decode steps never slice them)."""
    return self._params

  @params.setter
  def params(self, params):
    """Takes params in any layout (`local_params`)."""
    self._params = self.local_params(params)

  def local_params(self, params):
    """`params` as this sampler decodes with them: from any layout, this
    host's or sharded over every host (the trainer's), this host's copy
    laid out for its decode mesh, device to device
    (`distributed.to_local`), layers split. Global params make it a
    collective (every host calls it, in the same order); this host's own
    (a result of this method) never cross hosts."""
    with dispatch.LOCK:  # Programs, beside the trainer's (`dispatch`).
      if self.mesh is not None or jax.process_count() > 1:
        mesh = self.mesh or shd.make_mesh([("one", 1)],
                                          jax.local_devices()[:1])
        params = distributed.to_local(params, decoding.param_shardings(
            self.cfg, mesh, self.rules,
            split=isinstance(params["layers"], (tuple, list))))
      return _split_layers(params)

  def device(self, decode_batch: int, chunk_steps: int,
             append_tokens: int = 64, limit: int = 0):
    """A `device.Device` on this model: `pages.make`'s (a page pool, rows
    of at most `limit` tokens, default `max_cache_len`)."""
    return pages.make(self, decode_batch, chunk_steps, append_tokens, limit)

  # -- token bytes, stop strings, texts --

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

  def stop_table(self, stop_strings: tuple[str, ...]) -> jax.Array:
    """`stops.stop_table` of `stop_strings` as the decode programs take
    it: states padded to a bucket, int16 where they fit."""
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

  def detokenize(self, tokens: Sequence[int], reason: str,
                 stop_strings: Sequence[str]) -> tuple[str | None,
                                                       str | None]:
    """(text, matched stop string) of a sampled stretch: a final EOS left
    out, cut after its stop string; (None, None) without token bytes."""
    table = self.token_bytes()
    if table is None:
      return None, None
    if reason == "eos" and tokens and tokens[-1] in self.eos_ids:
      tokens = tokens[:-1]
    text = b"".join(table[j] for j in tokens).decode("utf-8", "replace")
    if reason != "stop":
      return text, None
    # A stop string begun in an earlier stretch is not in this text.
    return stops.cut_at_stop(text, stop_strings,
                             self.config.keep_stop_string)

  # -- generation --

  def generate(self, prompts: Sequence[Sequence[int]],
               max_new_tokens=256, stop_strings: Sequence[str] = (),
               temperature=0.0, top_k=0, top_p=1.0,
               seed=None) -> GenerateResult:
    """Samples one stretch for every prompt until each stops.

    Args:
      prompts: token ids per row (at least one each).
      max_new_tokens: int, or one per row.
      stop_strings: texts that end a row (matched across tokens).
      temperature: 0 is greedy; int/float or one per row (as are top_k,
        top_p).
      top_k: keep the k most likely tokens; 0 is off.
      top_p: nucleus mass; 1 is off.
      seed: an int (row r gets fold_in(key(seed), r)) or one seed per row
        (row r gets fold_in(key(seed[r]), 0), whatever the batch holds);
        None is 0.
    """
    n, c = len(prompts), self.config
    if n == 0:
      raise ValueError("no prompts")
    for i, p in enumerate(prompts):
      if not len(p):
        raise ValueError(f"prompt {i} is empty")
      if len(p) > c.max_cache_len:
        raise ValueError(
            f"prompt {i} has {len(p)} tokens; the KV cache holds "
            f"{c.max_cache_len} (SamplerConfig.max_cache_len)")
    max_new = _per_row(max_new_tokens, n, "max_new_tokens", np.int32)
    rows = [PlainRow(i, list(p), int(m))
            for i, (p, m) in enumerate(zip(prompts, max_new))]
    limit = min(bucket(max(len(r.obs) + r.budget for r in rows),
                       c.cache_buckets), c.max_cache_len)
    groups = 1 if self.mesh is None else self.mesh.shape.get("data", 1)
    device = self.device(
        bucket(-(-n // groups), c.batch_buckets),
        bucket(max(int(max_new.max()), 1), c.step_buckets),
        min(bucket(max(len(r.obs) for r in rows), c.length_buckets),
            limit), limit)
    device.open(n, bucket(n, c.batch_buckets))
    device.append(rows, fresh=True)
    for r in rows:
      r.length = len(r.obs)
    # One chunk is as long as the longest budget: every row ends in it.
    out, _ = device.decode(rows, self._draws(n, seed, temperature, top_k,
                                             top_p), tuple(stop_strings))
    device.close()
    reasons = [("cache_full" if why == "length" and len(t) < r.budget
                else why) for r, (t, _, why) in zip(rows, out)]
    texts = [self.detokenize(t, why, stop_strings)
             for (t, _, _), why in zip(out, reasons)]
    return GenerateResult(
        [t for t, _, _ in out], [np.asarray(lp, np.float32)
                                 for _, lp, _ in out],
        None if self.token_bytes() is None else [t for t, _ in texts],
        reasons, [m for _, m in texts])

  def _draws(self, n: int, seed, temperature, top_k, top_p) -> list[Draw]:
    seed = 0 if seed is None else seed
    if np.ndim(seed) == 0:
      seeds, salts = np.full(n, seed, np.int64), np.arange(n)
    else:
      seeds, salts = _per_row(seed, n, "seed", np.int64), np.zeros(n, int)
    return [Draw(int(s), float(t), int(k), float(p), int(a))
            for s, a, t, k, p in zip(
                seeds, salts, _per_row(temperature, n, "temperature",
                                       np.float32),
                _per_row(top_k, n, "top_k", np.int32),
                _per_row(top_p, n, "top_p", np.float32))]


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


_split_layers = jax.jit(decoder.split_layers)
