"""The one KV-cache design: a page pool, its programs, and the device that
hands out its pages.

The cache is a pool of P pages per layer (models/paged.py) plus, for each
of M row entries, the row's next-token logits and stop-string state. A row
holds a page table (the pages of its tokens, in order), takes pages as it
grows and gives them back when it ends, so the pool holds what rows hold,
not what each could. Padding rows of a batch bucket use a scratch entry M
past the M real ones, and write no page.

Three programs, jitted at module level with a static, hashable `Layout`
(model config, mesh, rules, cache dtype) among their arguments, so jax's
own cache holds one compiled program per (layout, shapes) and every
`Sampler` of a model shares them: `init` (an empty pool), `append`
(prefill a row, or add an observation) and `decode` (a chunk of decode
steps of the rows that are ready). Rows come to them as arrays (entries,
page tables, tokens held), so one program serves any rows of a shape
bucket; a program reads a bucket of its rows' prefix pages
(`SamplerConfig.cache_buckets`), not the whole pool.

`PagedDevice` (a `device.Device`) turns rows into calls of these programs
and keeps the pages: which are free, each row's `device.Seat`. When the
pool runs short its caller preempts rows: their pages are freed and their
tokens kept, and the next program a preempted row is in first recomputes
its cache from its tokens (a prefill).

Rows with one prompt (a group's samples, the judge's prompts of one
trajectory) prefill it once (`SamplerConfig.share_prompts`). The first row
reserved for a prompt leads it; a row with the same prompt reserved before
the leader's prefill shares the prompt's full pages (a page holds a count
of the rows that hold it, and is free when none does) and takes pages of
its own for the rest. After the leader's prefill, the `fork` program
copies into each follower the leader's logits, stop-string state and the
prompt's last, partial page: the first page a follower writes. Rows only
write past their tokens, so a full shared page is never written again
(`_row_args` checks it); a preempted follower lets go of its shares and
is recomputed into pages of its own. `DataGroups` runs one per data
group of a decode mesh. `Sampler.generate` and the rollout engine both
decode with them.

One module: the programs, the device and its page bookkeeping share the
`Layout` and the row/page arithmetic; the bookkeeping decides the arrays
the programs take.
"""

import collections
import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from swirl_jax import dispatch
from swirl_jax import sharding as shd
from swirl_jax.models import paged
from swirl_jax.models.config import ModelConfig
from swirl_jax.sampling import decoding
from swirl_jax.sampling.device import Draw, Lowerable, Seat
from swirl_jax.shapes import bucket, buckets_upto


@dataclasses.dataclass(frozen=True)
class Layout:
  """What a program's trace reads besides its arguments: the model, the
  mesh and rules its constraints use, the cache dtype."""
  cfg: ModelConfig
  mesh: Mesh | None = None
  rules: tuple = ()
  cache_dtype: str | None = None

  def active(self):
    """The mesh context to call (or lower) a program in: jit cannot enter
    it while tracing."""
    return (contextlib.nullcontext() if self.mesh is None
            else shd.use_mesh(self.mesh, self.rules))


@functools.partial(jax.jit, static_argnames=("layout", "rows", "pages",
                                             "page_size"))
def init(*, layout: Layout, rows: int, pages: int, page_size: int):
  """(pool, logits, stop states): `pages` empty pages of `page_size` slots
  and `rows` row entries plus the scratch entry (index `rows`). Under
  `layout.active()` each device allocates only its shard (KV heads over
  'tensor')."""
  cfg = layout.cfg
  pool = paged.init(cfg, pages, page_size, layout.cache_dtype)
  return (paged.constrain_pool(pool),
          jnp.zeros((rows + 1, cfg.vocab_size), jnp.float32),
          jnp.zeros((rows + 1,), jnp.int32))


@functools.partial(jax.jit, static_argnames=("layout",), donate_argnums=(1,))
def append(params, dev, rows_A, pages_AN, start_A, stop_A, tokens_AT,
           mask_AT, *, layout: Layout):
  """Appends right-padded tokens to the rows of entries `rows_A`, which hold
  `start_A` tokens in the pages `pages_AN` lists (with room for T more:
  `paged.Rows`), and sets their stop-string states to `stop_A`. `dev` =
  (pool, logits, stop states), donated (updated in place); returns (the
  new one,)."""
  pool, logits_MV, stop_M = dev
  pool, new_AV = decoding.extend(params, layout.cfg, pool,
                                 paged.Rows(pages_AN, start_A), tokens_AT,
                                 mask_AT, logits_MV[rows_A])
  return ((pool, logits_MV.at[rows_A].set(new_AV),
           stop_M.at[rows_A].set(stop_A)),)


@functools.partial(jax.jit, static_argnames=("layout", "steps"),
                   donate_argnums=(1,))
def decode(params, dev, rows_R, pages_RN, start_R, draws_R, max_new_R,
           eos_E, table_QV, *, layout: Layout, steps: int):
  """Up to `steps` decode steps of the rows of entries `rows_R` (all of them
  active), which hold `start_R` tokens in the pages `pages_RN` lists (with
  room for `steps` more).

  `draws_R` = (seeds, salts, temperature, top_k, top_p): a row's key is
  fold_in(key(seed), salt) and a token's folds in its position, so a row
  draws the same tokens in any entry, beside any rows.

  Returns (dev, tokens_RN, logprobs_RN, num_R, reason_R).
  """
  pool, logits_MV, stop_M = dev
  seeds_R, salts_R, temperature_R, top_k_R, top_p_R = draws_R
  keys_R = jax.vmap(lambda s, t: jax.random.fold_in(jax.random.key(s), t))(
      seeds_R, salts_R)
  sp = decoding.SamplingParams(keys_R, temperature_R, top_k_R, top_p_R)
  real_R = rows_R < logits_MV.shape[0] - 1
  out = decoding.decode(params, layout.cfg, pool,
                        paged.Rows(pages_RN, start_R), logits_MV[rows_R],
                        real_R, stop_M[rows_R], sp,
                        decoding.StopSpec(max_new_R, eos_E, table_QV), steps)
  dev = (out.cache, logits_MV.at[rows_R].set(out.logits_BV),
         stop_M.at[rows_R].set(out.stop_state_B))
  return dev, out.tokens_BN, out.logprobs_BN, out.num_B, out.reason_B


@functools.partial(jax.jit, static_argnames=("layout",), donate_argnums=(1,))
def fork(params, dev, src_F, dst_F, src_page_F, dst_page_F, *,
         layout: Layout):
  """Rows `dst_F` take the state rows `src_F` have after a prefill of the
  same prompt: their next-token logits and stop-string states, and a copy
  of page `src_page_F` (the prompt's last, partial page) into their own
  page `dst_page_F`; the full pages before it they share, untouched.
  Padding rows copy into the scratch entry and to page P (out of range:
  dropped). Returns (dev,)."""
  del params, layout  # One calling convention with the other programs.
  pool, logits_MV, stop_M = dev
  copy = lambda xs: tuple(x.at[:, dst_page_F].set(x[:, src_page_F],
                                                  mode="drop") for x in xs)
  pool = paged.constrain_pool(dict(pool, k=copy(pool["k"]),
                                   v=copy(pool["v"])))
  return ((pool, logits_MV.at[dst_F].set(logits_MV[src_F]),
           stop_M.at[dst_F].set(stop_M[src_F])),)


def _draw_arrays(draws, n: int):
  """Per-row draw arrays, padded to `n` rows (padding: greedy, seed 0)."""
  pad = list(draws) + [Draw(0)] * (n - len(draws))
  col = lambda i, dt: np.asarray([d[i] for d in pad], dt)
  key = lambda i: col(i, np.int64).astype(np.uint32)  # Any int wraps.
  return (key(0), key(4), col(1, np.float32), col(2, np.int32),
          col(3, np.float32))


class PagedDevice:
  """A `Sampler`'s model (params, sizes, EOS, stop tables, detokeniser) on
  a page pool: a `device.Device`.

  A row holds at most `limit` tokens, in pages of `SamplerConfig.page_size`
  slots. Appends go in pieces of at most `append_tokens` tokens (a long
  prompt or observation takes several calls), so the append programs are
  one per (row bucket, piece bucket, prefix bucket), not one per prompt
  length.
  `group`: the data group this device is (`Seat.group` of its rows).
  """

  def __init__(self, sampler, decode_batch: int, chunk_steps: int,
               append_tokens: int = 64, limit: int = 0, mesh=None,
               group: int = 0):
    self.sampler, self.config = sampler, sampler.config
    self.decode_batch, self.steps = decode_batch, chunk_steps
    self.append_tokens, self.group = append_tokens, group
    mesh = sampler.mesh if mesh is None else mesh
    # Tensor parallel: rows whole on every device, weights over 'tensor'.
    self.layout = Layout(sampler.cfg, mesh,
                         decoding.decode_rules(sampler.rules),
                         self.config.cache_dtype)
    self._shardings = None if mesh is None else decoding.param_shardings(
        sampler.cfg, mesh, self.layout.rules, split=True)
    self.limit = limit or self.config.max_cache_len
    self.page = self.config.page_size
    self.row_pages = paged.pages_for(self.limit, self.page)  # At the limit.
    self.shapes = collections.Counter()  # (program, rows, ..., prefix).
    self._dev, self._params, self._M, self._P = None, None, 0, 0
    self._free_entries: list[int] = []
    self._free_pages: list[int] = []
    self._refs = np.zeros(0, np.int32)  # Rows holding each page.
    self.share = self.config.share_prompts
    # Prompt -> the row reserved to prefill it, until it does: rows with
    # the same prompt reserved meanwhile share its full pages and fork
    # from it (`_shareable`, `append`).
    self._leaders: dict[tuple, object] = {}
    self._follows: dict[int, tuple] = {}  # id(row) -> (row, its leader).
    self.peak_pages = 0  # Most pages held at once since `open`.
    # Since `open`: prompt tokens computed and rows forked from another's
    # prefill (`counts`), pages held when the first decode began.
    self.counts = collections.Counter()
    self._precompiled = set()  # (entries, pages, stop strings) compiled.

  def open(self, num_rows: int, max_rows: int, pages: int = 0) -> int:
    """Allocates the pool and takes the sampler's current params on this
    device's mesh (no copy where they are laid out so already)."""
    self._M = min(max_rows, bucket(num_rows, self.config.batch_buckets))
    self._P = pages or self._M * self.row_pages
    if self._P < self.row_pages:
      raise ValueError(
          f"a pool of {self._P} pages cannot hold one row at the limit of "
          f"{self.limit} tokens ({self.row_pages} pages of {self.page}); "
          "raise engine.pages")
    self.set_params(self.sampler.params)
    with dispatch.LOCK, self.layout.active():
      self._dev = init(layout=self.layout, rows=self._M, pages=self._P,
                       page_size=self.page)
    self._free_entries = list(range(self._M))[::-1]  # pop() takes 0 first.
    self._free_pages = list(range(self._P))[::-1]
    self._refs = np.zeros(self._P, np.int32)
    self._leaders, self._follows = {}, {}
    self.shapes, self.peak_pages = collections.Counter(), 0
    self.counts = collections.Counter()
    return self._M

  def close(self) -> None:
    self._dev = self._params = None

  def set_params(self, params) -> None:
    """The params the next program calls decode with, on this device's
    mesh (a data group's copy is the given buffers on its devices)."""
    with dispatch.LOCK:  # A relayout may be a program.
      self._params = params if self._shardings is None else jax.tree.map(
          shd.reuse_shards, params, self._shardings)

  def block(self) -> None:
    """Waits for the programs dispatched so far (for timing them)."""
    jax.block_until_ready(self._dev)

  # -- seats and pages --

  def need(self, row, more: int, leaders=None) -> tuple[int, int]:
    """(entries, pages) `row` lacks to hold `more` tokens past its own,
    within `limit` (all of its tokens when it is preempted; less the
    pages it would share when it is new and another row is reserved to
    prefill its prompt: `leaders`, default those reserved so far)."""
    seat = row.seat
    held = len(seat.tokens) if seat is not None else 0
    total = min(held + more, self.limit)
    seated = seat is not None and seat.entry >= 0
    have = len(seat.pages) if seated else self._shareable(row, leaders)[1]
    return (0 if seated else 1,
            max(0, paged.pages_for(total, self.page) - have))

  def _shareable(self, row, leaders=None) -> tuple[object, int]:
    """(leader, pages): the row reserved to prefill a new row's prompt,
    and the prompt's full pages the new row would share with it (the
    last, partial page it copies: rows only write past their tokens, so
    a full page is never written again). (None, 0) when there is none."""
    leaders = self._leaders if leaders is None else leaders
    if not self.share or row.seat is not None or not row.obs:
      return None, 0
    leader = leaders.get(tuple(row.obs))
    if leader is None or leader is row:
      return None, 0
    return leader, len(row.obs) // self.page

  def free(self) -> tuple[int, int]:
    """(entries, pages) free."""
    return len(self._free_entries), len(self._free_pages)

  def size(self) -> tuple[int, int]:
    """(entries, pages) of the pool `open` allocated."""
    return self._M, self._P

  def reserve(self, rows, more) -> bool:
    # On paper first (all or nothing), a new row's prompt leading the
    # rows after it with the same prompt.
    leaders, plan = dict(self._leaders), []
    for r, m in zip(rows, more):
      plan.append((self.need(r, m, leaders), self._shareable(r, leaders)))
      if self.share and r.seat is None and r.obs and plan[-1][1][0] is None:
        leaders[tuple(r.obs)] = r
    entries, pages = self.free()
    if (sum(e for (e, _), _ in plan) > entries
        or sum(p for (_, p), _ in plan) > pages):
      return False
    for r, ((e, p), (leader, k)) in zip(rows, plan):
      if r.seat is None:
        r.seat = Seat(self.group)
        if leader is not None:
          r.seat.pages = list(leader.seat.pages[:k])
          self._refs[r.seat.pages] += 1
          self._follows[id(r)] = (r, leader)
        elif self.share and r.obs:
          self._leaders[tuple(r.obs)] = r
      if e:
        r.seat.entry = self._free_entries.pop()
        r.seat.in_pool = not r.seat.tokens
      r.seat.pages += self._grab(p)
    self.peak_pages = max(self.peak_pages, self._P - len(self._free_pages))
    return True

  def _grab(self, n: int) -> list[int]:
    pages = [self._free_pages.pop() for _ in range(n)]
    self._refs[pages] = 1
    return pages

  def _give(self, seat) -> None:
    """Lets go of the seat's pages: each is free once no row holds it."""
    for p in seat.pages[::-1]:
      self._refs[p] -= 1
      if self._refs[p] == 0:
        self._free_pages.append(p)
      elif self._refs[p] < 0:
        raise RuntimeError(f"page {p} let go of more often than held")
    seat.pages = []

  def _forget(self, row) -> None:
    """Drops the row from the sharing tables (it ends or loses its
    pages before its prompt's prefill)."""
    self._follows.pop(id(row), None)
    if row.obs and self._leaders.get(tuple(row.obs)) is row:
      del self._leaders[tuple(row.obs)]

  def held(self) -> int:
    """Distinct pages rows hold (a shared page once)."""
    return self._P - len(self._free_pages)

  def _take(self, rows, more) -> None:
    if not self.reserve(rows, more):
      raise RuntimeError(
          f"{len(rows)} rows need more than the {self.free()} (entries, "
          f"pages) free of a pool of {self._P} pages: reserve them first, "
          "preempting rows (the engine does)")

  def preempt(self, row) -> None:
    seat = row.seat
    if seat.entry >= 0:
      # The stop-string matcher's state, for the row's next stretch (the
      # read is a program too: the one dispatcher queues it).
      with dispatch.LOCK:
        seat.stop = int(self._dev[2][seat.entry])
      self._free_entries.append(seat.entry)
      seat.entry = -1
    self._forget(row)
    self._give(seat)

  def release(self, row) -> None:
    if row.seat is not None:
      if row.seat.entry >= 0:
        self._free_entries.append(row.seat.entry)
      self._forget(row)
      self._give(row.seat)
      row.seat = None

  def _restore(self, rows) -> None:
    """Refills the pages of preempted rows from their tokens (a prefill),
    with their stop-string states."""
    back = [r for r in rows if not r.seat.in_pool]
    if back:
      tokens = [r.seat.tokens for r in back]
      for r in back:
        r.seat.tokens, r.seat.in_pool = [], True
      self._feed(back, tokens, [r.seat.stop for r in back])

  # -- appends --

  def append(self, rows, fresh: bool) -> None:
    if fresh:  # Whatever a row held is gone.
      for r in rows:
        if r.seat is not None and r.seat.tokens:
          self._give(r.seat)
          r.seat.tokens, r.seat.in_pool = [], True
    self._take(rows, [len(r.obs) for r in rows])
    self._restore(rows)
    forks = self._forks(rows) if fresh else []
    forked = {id(r) for r, _ in forks}
    feed = [r for r in rows if id(r) not in forked]
    self._feed(feed, [r.obs for r in feed], [0] * len(feed))
    if fresh:
      self.counts["prefill_tokens"] += sum(len(r.obs) for r in feed)
      for r in feed:
        self._forget(r)
      self._fork(forks)

  def _forks(self, rows) -> list[tuple]:
    """(row, leader) of the rows of a prefill that fork from a leader
    prefilled in it. A row whose leader is not in it, or let go of the
    shared pages before filling them (preempted before its prefill:
    nothing here does that), takes pages of its own for the prompt and
    prefills it."""
    here, forks = {id(r) for r in rows}, []
    for r in rows:
      _, leader = self._follows.pop(id(r), (None, None))
      if leader is None:
        continue
      shared = len(r.obs) // self.page
      if id(leader) in here and (leader.seat.pages[:shared]
                                 == r.seat.pages[:shared]):
        forks.append((r, leader))
        continue
      own = r.seat.pages[shared:]
      r.seat.pages = r.seat.pages[:shared]
      self._give(r.seat)
      if len(self._free_pages) < shared:
        raise RuntimeError(
            f"a row whose prompt's leader left needs {shared} pages of its "
            f"own; {len(self._free_pages)} are free")
      r.seat.pages = self._grab(shared) + own
    return forks

  def _fork(self, forks) -> None:
    """Each row takes its leader's state after the prompt (`fork`), in
    calls of a decode batch of rows."""
    A = self.decode_batch
    for lo in range(0, len(forks), A):
      part = forks[lo:lo + A]
      src, dst = [], []
      for r, leader in part:
        k = len(r.obs) // self.page
        partial = len(r.obs) % self.page > 0
        src.append(leader.seat.pages[k] if partial else 0)
        dst.append(r.seat.pages[k] if partial else self._P)
        r.seat.tokens, r.seat.in_pool = list(r.obs), True
        self.counts["forked_rows"] += 1
        self.counts["shared_pages"] += k
      self.shapes["fork", A] += 1
      self._call(fork, (
          self._padded([l.seat.entry for _, l in part], A, self._M),
          self._padded([r.seat.entry for r, _ in part], A, self._M),
          self._padded(src, A, 0), self._padded(dst, A, self._P)))

  def _feed(self, rows, seqs, stops) -> None:
    """Appends seqs[i] to rows[i]: decode-batch groups, in pieces."""
    C = self.append_tokens
    for lo in range(0, len(rows), self.decode_batch):
      group = list(range(lo, min(lo + self.decode_batch, len(rows))))
      for k in range(0, max(len(seqs[i]) for i in group), C):
        part = [i for i in group if len(seqs[i]) > k]
        self._append([rows[i] for i in part],
                     [seqs[i][k:k + C] for i in part], [stops[i] for i in part])

  def _piece_len(self, n: int) -> int:
    return bucket(n, [b for b in self.config.length_buckets
                      if b < self.append_tokens] + [self.append_tokens])

  def _prefix_pages(self, held: int, new: int) -> int:
    """Pages a program of `new` tokens a row reads of its rows' prefixes,
    `held` tokens the most a row holds (0: none): with the new tokens, a
    cache bucket past held + new, as a contiguous cache would read."""
    if held == 0:
      return 0
    total = bucket(held + new, self.config.cache_buckets)
    return min(paged.pages_for(total - new, self.page), self.row_pages)

  def _append(self, rows, pieces, stops) -> None:
    T = self._piece_len(max(len(p) for p in pieces))
    n = self._prefix_pages(max(len(r.seat.tokens) for r in rows), T)
    # Rows: a batch bucket (padded with the scratch entry), so a lone
    # observation or a group's one prompt computes one row, not a batch.
    A = min(bucket(len(rows), self.config.batch_buckets), self.decode_batch)
    self.shapes["append", A, T, n] += 1
    tokens, mask = np.zeros((A, T), np.int32), np.zeros((A, T), bool)
    for i, p in enumerate(pieces):
      tokens[i, :len(p)], mask[i, :len(p)] = p, True
    width = n + paged.pages_for(T, self.page)
    self._call(append, self._row_args(rows, A, width)
               + (self._padded(stops, A, 0), tokens, mask))
    for r, p in zip(rows, pieces):
      r.seat.tokens += p

  def _padded(self, values, n: int, fill: int) -> np.ndarray:
    return np.asarray(list(values) + [fill] * (n - len(values)), np.int32)

  def _row_args(self, rows, n: int, width: int):
    """(entries, page tables of `width` pages, tokens held) of `rows`,
    padded to `n` rows with the scratch entry (no pages, nothing held)."""
    table = np.zeros((n, width), np.int32)
    for i, r in enumerate(rows):
      own = r.seat.pages[:width]
      table[i, :len(own)] = own
      # A program writes a row's pages from its next slot on: never a page
      # another row holds too, but for a prompt's leader filling the
      # pages its followers will read.
      if (self._refs[r.seat.pages[len(r.seat.tokens) // self.page:]] != 1
          ).any() and self._leaders.get(tuple(r.obs or ())) is not r:
        raise RuntimeError(f"row {r.index} would write into a page it "
                           "shares with another row")
    return (self._padded([r.seat.entry for r in rows], n, self._M), table,
            self._padded([len(r.seat.tokens) for r in rows], n, 0))

  def _call(self, program, args, **static):
    """Runs `program` on this device's pool; returns its other outputs.
    Queued by the one dispatcher (`dispatch`): the generator's thread
    calls this beside the trainer's."""
    with dispatch.LOCK, self.layout.active():
      self._dev, *out = program(self._params, self._dev, *args,
                                layout=self.layout, **static)
    return out

  # -- decoding --

  def select(self, ready: list) -> list:
    return ready[:self.decode_batch]

  def decode(self, rows, draws, stop_strings):
    return self.decode_finish(self.decode_start(rows, draws, stop_strings))

  def chunk_tokens(self, row) -> int:
    """New tokens the next decode chunk may give `row`."""
    held = len(row.seat.tokens) if row.seat is not None else row.length
    return max(0, min(self.steps, row.budget, self.limit - held))

  def decode_start(self, rows, draws, stop_strings):
    """Dispatches the chunk (`decode`); `decode_finish` reads it back."""
    max_new = [self.chunk_tokens(r) for r in rows]
    self._take(rows, max_new)
    self._restore(rows)
    if "first_decode_pages" not in self.counts:
      self.counts["first_decode_pages"] = self.held()
    R = bucket(len(rows), self.config.batch_buckets)
    n = self._prefix_pages(max(len(r.seat.tokens) for r in rows),
                           self.steps)
    self.shapes["decode", R, n] += 1
    out = self._call(decode, self._decode_args(
        rows, draws, max_new, R, n, stop_strings), steps=self.steps)
    return rows, R, out

  def _decode_args(self, rows, draws, max_new, R: int, n: int,
                   stop_strings):
    return self._row_args(rows, R, n + paged.pages_for(self.steps, self.page)
                          ) + (
        _draw_arrays(draws, R), self._padded(max_new, R, 0),
        self.sampler.eos_ids, self.sampler.stop_table(stop_strings))

  def decode_finish(self, handle):
    rows, R, arrays = handle
    tokens, lps, num, reason = jax.device_get(arrays)
    out = [(tokens[j, :num[j]].tolist(), lps[j, :num[j]].tolist(),
            decoding.REASONS[reason[j]]) for j in range(len(rows))]
    for r, (t, _, _) in zip(rows, out):
      r.seat.tokens += t
    # Every row of the compiled batch runs each step the longest one runs.
    return out, R * int(num.max())

  def text(self, row, tokens, why: str, stop_strings) -> str:
    del row
    return self.sampler.detokenize(tokens, why, stop_strings)[0]

  # -- every program, ahead of time --

  def pieces(self) -> list[int]:
    """Every piece (tokens a row) an append program may take."""
    return sorted({self._piece_len(n)
                   for n in range(1, self.append_tokens + 1)})

  def prefixes(self, new: int) -> list[int]:
    """Every prefix (in pages) a program of `new` tokens a row may read."""
    return sorted({self._prefix_pages(held, new)
                   for held in range(self.limit + 1)})

  def _programs(self, M: int, stop_strings, full: bool = False):
    """(program, args, static) of every call shape a run can make, on the
    scratch entry (M) only: appends of each piece bucket and decode chunks,
    each of each row bucket up to the decode batch, at each prefix they
    may read (`full`: only the whole context's), and the fork."""
    A, page = self.decode_batch, self.page
    pad = lambda n, width: (np.full(n, M, np.int32),
                            np.zeros((n, width), np.int32),
                            np.zeros(n, np.int32))
    at = lambda new: [self.row_pages] if full else self.prefixes(new)
    rows = buckets_upto(A, self.config.batch_buckets)
    for T in self.pieces():
      for n in at(T):
        for R in rows:
          yield append, pad(R, n + paged.pages_for(T, page)) + (
              np.zeros(R, np.int32), np.zeros((R, T), np.int32),
              np.zeros((R, T), bool)), {}
    if self.share:
      yield fork, (np.full(A, M, np.int32), np.full(A, M, np.int32),
                   np.zeros(A, np.int32), np.full(A, self._P, np.int32)), {}
    for n in at(self.steps):
      if n == 0:  # A decoding row holds a token at least.
        continue
      for R in rows:
        width = n + paged.pages_for(self.steps, page)
        yield decode, pad(R, width) + (
            _draw_arrays([], R), np.zeros(R, np.int32),
            self.sampler.eos_ids, self.sampler.stop_table(stop_strings)
        ), dict(steps=self.steps)

  def precompile(self, stop_strings) -> None:
    """Runs every program a run can call once (after `open`), so none
    compiles mid-run, at the cost of programs a short run never uses."""
    key = (self._M, self._P, stop_strings)
    if key in self._precompiled:
      return
    self._precompiled.add(key)
    for program, args, static in self._programs(self._M, stop_strings):
      self._call(program, args, **static)

  def lowerable(self, rows: int, stop_strings, pages: int = 0
                ) -> dict[str, Lowerable]:
    """`append` and `decode` of a full decode batch reading the whole
    context a row may hold, with `rows` entries and a pool of `pages` pages
    (0: `rows` rows at the limit), from abstract arguments (the params as
    a trainer's sampling params are held here: compute dtype, this mesh's
    layout): nothing is allocated. What the fit job compiles."""
    cfg, lay = self.sampler.cfg, self.layout
    cfg = cfg.replace(param_dtype=cfg.dtype)
    params = decoding.abstract_params(cfg, split=True)
    if self._shardings is not None:
      params = jax.tree.map(_with_sharding, params, self._shardings)
    sizes = dict(layout=lay, rows=rows, pages=pages or rows * self.row_pages,
                 page_size=self.page)
    with lay.active():
      shardings = init.lower(**sizes).compile().output_shardings
    dev = jax.tree.map(_with_sharding, jax.eval_shape(
        functools.partial(init, **sizes)), shardings)
    whole = (lambda x: x) if lay.mesh is None else (
        lambda x: _with_sharding(x, NamedSharding(lay.mesh, P())))
    out = {}
    T, R = self._piece_len(self.append_tokens), self.decode_batch
    for program, args, static in self._programs(rows, stop_strings,
                                                full=True):
      if program is fork:  # In place: nothing to fit.
        continue
      if args[0].shape[0] == R and (program is not append
                                    or args[-1].shape[1] == T):
        out[program.__name__] = Lowerable(
            program, (params, dev) + jax.tree.map(whole, args),
            dict(static, layout=lay), lay)
    return out


def _with_sharding(x, sharding):
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


class DataGroups:
  """The device on a decode mesh of D > 1 'data' groups: one `PagedDevice`
  per group, each with its own pool on the group's 'tensor' devices. A new
  row is seated in the group with the most pages free (of those with an
  entry free), so rows spread over the groups; a preempted row comes back
  to its own. Each decode dispatches every group's program before reading
  any back, so the groups compute at once."""

  def __init__(self, sampler, decode_batch: int, chunk_steps: int,
               append_tokens: int = 64, limit: int = 0):
    mesh = sampler.mesh  # ('data', 'tensor'), other axes of size 1.
    self.D = mesh.shape["data"]
    devices = np.moveaxis(mesh.devices, mesh.axis_names.index("data"),
                          0).reshape(self.D, -1)
    self.groups = [PagedDevice(
        sampler, decode_batch, chunk_steps, append_tokens, limit,
        mesh=shd.make_mesh([("tensor", devices.shape[1])], list(row)),
        group=g) for g, row in enumerate(devices)]
    self.limit = self.groups[0].limit
    self.decode_batch = decode_batch

  @property
  def shapes(self) -> collections.Counter:
    return sum((g.shapes for g in self.groups), collections.Counter())

  @property
  def counts(self) -> collections.Counter:
    return sum((g.counts for g in self.groups), collections.Counter())

  def held(self) -> int:
    return sum(g.held() for g in self.groups)

  def _split(self, rows):
    by = [[] for _ in self.groups]
    for r in rows:
      by[r.seat.group].append(r)
    return by

  def open(self, num_rows: int, max_rows: int, pages: int = 0) -> int:
    """`max_rows` entries and `pages` pages in each group; returns the
    entries in all."""
    per = -(-num_rows // self.D)
    return sum(g.open(per, max_rows, pages) for g in self.groups)

  def close(self) -> None:
    for g in self.groups:
      g.close()

  def set_params(self, params) -> None:
    for g in self.groups:
      g.set_params(params)

  def precompile(self, stop_strings) -> None:
    for g in self.groups:
      g.precompile(stop_strings)

  def lowerable(self, rows: int, stop_strings, pages: int = 0):
    """One group's programs, `rows` entries each (all run the same)."""
    return self.groups[0].lowerable(rows, stop_strings, pages)

  def reserve(self, rows, more) -> bool:
    # Place unseated rows on paper first: all or nothing.
    free = [list(g.free()) for g in self.groups]
    where = []
    for r, m in zip(rows, more):
      if r.seat is not None:
        g = r.seat.group
        e, p = self.groups[g].need(r, m)
      else:
        # The group with the most pages free after it (one that shares
        # its prompt needs fewer).
        p_g = [g.need(r, m)[1] for g in self.groups]
        fits = [g for g, (fe, fp) in enumerate(free)
                if fe >= 1 and fp >= p_g[g]]
        if not fits:
          return False
        g = max(fits, key=lambda g: (free[g][1] - p_g[g], -g))
        e, p = 1, p_g[g]
      free[g][0] -= e
      free[g][1] -= p
      if free[g][0] < 0 or free[g][1] < 0:
        return False
      where.append(g)
    for r, g in zip(rows, where):
      if r.seat is None:
        r.seat = Seat(g)
    parts = collections.defaultdict(lambda: ([], []))
    for r, m in zip(rows, more):
      parts[r.seat.group][0].append(r)
      parts[r.seat.group][1].append(m)
    for g, (part, ms) in parts.items():
      # An explicit check, not an assert: the reserve is the side effect
      # (under `python -O` an assert would not run it).
      if not self.groups[g].reserve(part, ms):
        raise RuntimeError(f"data group {g} refused {len(part)} rows it "
                           "was counted to hold")
    return True

  def free(self) -> tuple[int, int]:
    """(entries, pages) free in all groups."""
    return tuple(map(sum, zip(*(g.free() for g in self.groups))))

  def size(self) -> tuple[int, int]:
    """(entries, pages) of all groups' pools."""
    return tuple(map(sum, zip(*(g.size() for g in self.groups))))

  def preempt(self, row) -> None:
    self.groups[row.seat.group].preempt(row)

  def release(self, row) -> None:
    if row.seat is not None:
      self.groups[row.seat.group].release(row)

  def append(self, rows, fresh: bool) -> None:
    if not self.reserve(rows, [len(r.obs) for r in rows]):
      raise RuntimeError(f"{len(rows)} rows need more entries or pages "
                         "than the data groups have free: reserve them "
                         "first, preempting rows (the engine does)")
    for g, part in zip(self.groups, self._split(rows)):
      if part:
        g.append(part, fresh)

  def select(self, ready: list) -> list:
    return [r for part in self._split(ready) for r in part[:self.decode_batch]]

  def decode(self, rows, draws, stop_strings):
    draw_of = {id(r): d for r, d in zip(rows, draws)}
    parts = self._split(rows)
    handles = [g.decode_start(p, [draw_of[id(r)] for r in p], stop_strings)
               if p else None for g, p in zip(self.groups, parts)]
    got, steps = {}, 0
    for g, p, h in zip(self.groups, parts, handles):
      if h is not None:
        out, n = g.decode_finish(h)
        got.update(zip(map(id, p), out))
        steps += n
    return [got[id(r)] for r in rows], steps

  def text(self, row, tokens, why: str, stop_strings) -> str:
    return self.groups[0].text(row, tokens, why, stop_strings)


def make(sampler, decode_batch: int, chunk_steps: int,
         append_tokens: int = 64, limit: int = 0):
  """The device for `sampler`: `DataGroups` when its mesh has more than
  one 'data' group, else a `PagedDevice`."""
  mesh = sampler.mesh
  if mesh is not None and mesh.shape.get("data", 1) > 1:
    if {a for a, n in mesh.shape.items() if n > 1} - {"data", "tensor"}:
      raise ValueError(f"the page pool decodes on a ('data', 'tensor') "
                       f"mesh, not {dict(mesh.shape)}")
    return DataGroups(sampler, decode_batch, chunk_steps, append_tokens,
                      limit)
  return PagedDevice(sampler, decode_batch, chunk_steps, append_tokens,
                     limit)
