"""Several processes, one job: start-up, work split, global batches, writers.

A TPU pod slice or a SLURM job runs one process per host; they form one
SPMD program over a global mesh. This module holds what every job needs for
that, on top of `jax.distributed` and one all-gather (`_allgather`):

- `initialize()`: `jax.distributed.initialize` from the launchers' settings.
- `host_share(pairs, seed)`, `host_block(n)`: this host's (task, sample)
  pairs, each with a seed from the run seed and the pair only
  (`mix_seed`), so results do not depend on the host count;
  `run_local(fn, items)` runs a host's block and keeps its results;
  `run_shared(fn, items)` gives every host all results (`gather_texts`).
- `global_batch(local, sharding)` (each host its rows) and
  `place_rows(full, sharding)` (each host the same whole batch): one global
  array per field, after a cross-host check of names, shapes and dtypes
  that fails on every host with a message naming the host that differs;
  `rows_from_hosts(local, rows)`: every host's rows end to end, each host
  handing over only its own (host-local data: the rows never cross hosts
  as messages, only their counts do).
- `gather(rows)` / `to_host(x)`: values every host needs, from
  process-local rows or from globally sharded arrays (never a `device_get`
  of a non-addressable array); `gather_rows(x)` / `gather_own_rows(x)`:
  every host's rows, any count each (and which of them are this host's);
  `to_local(tree, shardings)`: this host's copy of global arrays on its
  own mesh, device to device.
- `is_writer()`, `one_writer(what)`: one process writes each file;
  `take_turns(fn, what)`: each host appends its own records to a file, in
  host order; `host_file(path)`: a file of this host's own.
- `check_shared_workdir(workdir)`: a workdir every host sees, or a clear
  error at start.

Every cross-host check exchanges a fixed-size buffer, so hosts that disagree
still run the same collective and all raise the same error instead of one
raising and the others waiting in a collective. Every function here that
exchanges data is a collective: call it on every host, in the same order.
With one process they all reduce to the plain local operation.

One module on purpose: the checks, exchanges and writers share the one
rule above (every host runs the same collectives in the same order) and
the same host order, seed mixing and all-gather; the rule is easier to
keep when it is read in one place.
"""

import contextlib
import functools
import hashlib
import json
import os
import uuid
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from swirl_jax import dispatch
from swirl_jax import sharding as shd

# Settings `initialize` reads; the launchers in launch/ set them. JAX reads
# JAX_COORDINATOR_ADDRESS and JAX_LOCAL_DEVICE_IDS itself, too.
COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "JAX_NUM_PROCESSES"
PROCESS_ID_ENV = "JAX_PROCESS_ID"
# Fixed size of one host's message in a cross-host check (names, shapes).
_MESSAGE_BYTES = 8192
_SEP = "\x1f"  # Between the parts of one message.


# ---------------------------------------------------------------- start-up.


def _int_env(env: Mapping[str, str], name: str) -> int | None:
  value = env.get(name, "").strip()
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"{name}={value!r} is not an integer") from None


def is_multiprocess(env: Mapping[str, str] | None = None) -> bool:
  """Whether the environment says this process is one of several."""
  env = os.environ if env is None else env
  if env.get(COORDINATOR_ENV) or env.get("COORDINATOR_ADDRESS"):
    return True
  for name in (NUM_PROCESSES_ENV, "SLURM_NTASKS"):
    if (_int_env(env, name) or 1) > 1:
      return True
  hosts = env.get("TPU_WORKER_HOSTNAMES", "")
  return len([h for h in hosts.split(",") if h]) > 1


def settings(env: Mapping[str, str] | None = None) -> dict[str, Any]:
  """(coordinator, count, id) from JAX_* settings, then SLURM's; None: auto.

  Unset values are left to JAX's cluster detection (TPU metadata, SLURM).
  """
  env = os.environ if env is None else env
  slurm = "SLURM_PROCID" in env
  count = _int_env(env, NUM_PROCESSES_ENV)
  pid = _int_env(env, PROCESS_ID_ENV)
  if slurm:
    count = count if count is not None else _int_env(env, "SLURM_NTASKS")
    pid = pid if pid is not None else _int_env(env, "SLURM_PROCID")
  if count is not None and count < 1:
    raise ValueError(f"{NUM_PROCESSES_ENV}={count}: want at least 1")
  if count is not None and pid is not None and not 0 <= pid < count:
    raise ValueError(f"process id {pid} is not in [0, {count}) "
                     f"({PROCESS_ID_ENV}, {NUM_PROCESSES_ENV})")
  return {"coordinator_address": env.get(COORDINATOR_ENV) or None,
          "num_processes": count, "process_id": pid}


def initialize(env: Mapping[str, str] | None = None,
               timeout_s: int = 300) -> bool:
  """Joins the job if the environment names one; True when multi-process.

  Call once, before any other JAX call. CPU processes exchange data over
  gloo (JAX's default; JAX_CPU_COLLECTIVES_IMPLEMENTATION=mpi overrides).
  """
  if jax.distributed.is_initialized():
    return jax.process_count() > 1
  if not is_multiprocess(env):
    return False
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**settings(env),
                             initialization_timeout=timeout_s)
  return True


# -------------------------------------------------------------- work split.


class Pair(NamedTuple):
  """One (task, sample) of an iteration, with its own seed."""
  task_id: Any
  sample: int
  seed: int


def mix_seed(*parts: int | str) -> int:
  """A 31-bit seed from `parts` (ints and strings) alone: the one way
  seeds are derived (an iteration's from the run seed, a pair's, a row's
  turn), so none depends on the host, the batch or the slot."""
  text = json.dumps([p if isinstance(p, str) else int(p) for p in parts])
  digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") % (2**31 - 1)


def pair_seed(run_seed: int, task_id: Any, sample: int) -> int:
  """A seed from the run seed and the pair only (never the host)."""
  return mix_seed(run_seed, str(task_id), sample)


def host_block(n: int, *, even: bool = True, process_index: int | None = None,
               process_count: int | None = None) -> slice:
  """This host's contiguous block of `n` items (host i: the i-th block).

  `even=True` (rows of a global batch) raises unless the hosts get equal
  counts; otherwise the first `n % count` hosts take one more.
  """
  pid = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if even and n % count:
    raise ValueError(f"{n} (task, sample) pairs do not split evenly over "
                     f"{count} hosts; make the batch a multiple of {count}")
  size, extra = divmod(n, count)
  start = pid * size + min(pid, extra)
  return slice(start, start + size + (pid < extra))


def host_share(pairs: Sequence[tuple[Any, int]], seed: int, *,
               process_index: int | None = None,
               process_count: int | None = None) -> list[Pair]:
  """This host's block of `pairs`, in order, each with its `pair_seed`.

  Every host must pass the same pairs in the same order; host i takes the
  i-th of `process_count` equal contiguous blocks, so the hosts' rows laid
  end to end are `pairs` (the row order of one process doing all of them).
  A count that does not divide evenly raises: the global batch needs equal
  rows per host.
  """
  block = pairs[host_block(len(pairs), process_index=process_index,
                           process_count=process_count)]
  return [Pair(t, int(s), pair_seed(seed, t, s)) for t, s in block]


# ----------------------------------------------------- cross-host messages.


def _fit(text: str, limit: int) -> str:
  """`text`, or its start and a digest of the whole when it is too long."""
  raw = text.encode()
  if len(raw) <= limit:
    return text
  digest = hashlib.blake2b(raw, digest_size=8).hexdigest()
  return raw[:limit - 24].decode(errors="ignore") + f"... (#{digest})"


def _allgather(x: Any, tiled: bool = False) -> np.ndarray:
  """Every host's `x` (same shape on each) stacked by host, or laid end to
  end when `tiled`; a global array comes back whole.

  As `multihost_utils.process_allgather`, but it returns only once every
  local device is done. That one reads one device's copy while the others
  may still be in the collective; a process that then ends (all hosts
  raising the same error) shut down the coordination service under them,
  and its client's teardown waited ~150 s for a gloo connection.
  """
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    if not isinstance(x.sharding, NamedSharding):
      raise TypeError(f"a global array needs a NamedSharding, not "
                      f"{type(x.sharding).__name__}")
    whole = NamedSharding(x.sharding.mesh, P())
  else:
    x = np.asarray(x)
    x = x if tiled and x.ndim else x[None]
    if jax.process_count() == 1:
      return x
    hosts = Mesh(np.array(jax.devices()).reshape(jax.process_count(), -1),
                 ("hosts", "local"))
    x = jax.make_array_from_process_local_data(
        NamedSharding(hosts, P("hosts")), x)
    whole = NamedSharding(hosts, P())
  with dispatch.LOCK:  # A collective: queued by the one dispatcher.
    out = _identity(x, whole).block_until_ready()
  return np.asarray(out.addressable_data(0))


@functools.partial(jax.jit, static_argnums=1)
def _identity(x, out_sharding):
  """`x` laid out by `out_sharding`: one compiled program a shape, kept."""
  return jax.lax.with_sharding_constraint(x, out_sharding)


def _allgather_text(text: str) -> list[str]:
  """Every host's `text`, one fixed-size all-gather (cut to fit)."""
  if jax.process_count() == 1:
    return [text]
  raw = _fit(text, _MESSAGE_BYTES).encode()
  buf = np.zeros(_MESSAGE_BYTES, np.uint8)
  buf[:len(raw)] = np.frombuffer(raw, np.uint8)
  rows = _allgather(buf)
  return [bytes(r).rstrip(b"\0").decode(errors="replace") for r in rows]


def _first_difference(texts: list[str], what: str) -> str | None:
  """A one-line message naming the first host whose text differs from 0's."""
  for host, text in enumerate(texts):
    if text != texts[0]:
      return f"{what} differ between hosts: host 0 has {texts[0]}, " \
             f"host {host} has {text}"
  return None


def check_same(value: Any, what: str) -> None:
  """Raises on every host unless all hosts pass the same JSON-able value."""
  text = json.dumps(value, sort_keys=True, default=str)
  digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
  _check_hosts(f"{text[:200]} (#{digest[:12]})", "", what)


def _check_hosts(text: str, problem: str, what: str) -> None:
  """Raises the same ValueError on every host if any host has a problem or
  a `text` that differs from host 0's."""
  half = _MESSAGE_BYTES // 2 - 1
  message = _fit(text, half) + _SEP + _fit(problem, half)
  reports = [r.split(_SEP, 1) for r in _allgather_text(message)]
  for host, (_, why) in enumerate(reports):
    if why:
      raise ValueError(f"{what}: host {host}: {why}")
  error = _first_difference([t for t, _ in reports], what)
  if error:
    raise ValueError(error)


# ----------------------------------------------------------- global batches.


def _describe(arrays: Mapping[str, np.ndarray]) -> str:
  return "{" + ", ".join(f"{k}: {np.dtype(v.dtype).name}{list(v.shape)}"
                         for k, v in sorted(arrays.items())) + "}"


def _rows_of_process(sharding: jax.sharding.Sharding,
                     global_shape: tuple[int, ...]) -> set[int]:
  rows = set()
  for index in sharding.addressable_devices_indices_map(global_shape).values():
    rows.update(range(global_shape[0])[index[0]] if index else
                range(global_shape[0]))
  return rows


def _layout_problem(sharding, local_rows: int) -> str:
  """'' when this host's devices hold exactly its `host_share` block."""
  pid, count = jax.process_index(), jax.process_count()
  rows = _rows_of_process(sharding, (local_rows * count,))
  block = set(range(pid * local_rows, (pid + 1) * local_rows))
  if rows == block:
    return ""
  return (f"its devices hold rows {min(rows, default=0)}..."
          f"{max(rows, default=-1)} of the batch, not its share "
          f"{pid * local_rows}...{(pid + 1) * local_rows - 1}")


def _checked_batch(batch: Mapping[str, np.ndarray], layout,
                   trailing: bool = False):
  """`(arrays, what layout(rows) gives)` once every host's fields agree in
  names, shapes (`trailing`: all but the rows) and dtypes;
  `layout(rows) -> (problem, value)` adds this host's own check. Any
  difference raises the same error on every host."""
  text, problem, value = "", "", None
  try:  # Nothing may raise before the exchange: the others would wait.
    batch = {k: np.asarray(v) for k, v in batch.items()}
    text = _describe({k: v[:0] if trailing and v.ndim else v
                      for k, v in batch.items()})
    rows = {v.shape[0] if v.ndim else -1 for v in batch.values()}
    if len(rows) != 1 or -1 in rows:
      problem = f"fields differ in rows or are scalars: {text}"
    else:
      problem, value = layout(rows.pop())
  except Exception as e:  # pylint: disable=broad-except
    problem = f"{type(e).__name__}: {e}"
  _check_hosts(text, problem, "global batch fields")
  return batch, value


def global_batch(local: Mapping[str, np.ndarray],
                 sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
  """Global arrays, batch-sharded on dim 0, from this host's rows.

  Each host passes its `host_share` rows (equal counts); the result is what
  one process holding all rows would build. Before any array is made, the
  hosts compare field names, shapes and dtypes (one small all-gather): on a
  difference every host raises the same ValueError, naming the host.
  """
  local, _ = _checked_batch(
      local, lambda rows: (_layout_problem(sharding, rows), None))
  return {k: jax.make_array_from_process_local_data(sharding, v)
          for k, v in local.items()}


def place_rows(full: Mapping[str, np.ndarray],
               sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
  """Global arrays from a batch every host holds whole (built the same way
  on each, e.g. from gathered rollouts); each host hands over only the rows
  its devices hold. Checked across hosts first, as in `global_batch`."""
  full, held = _checked_batch(
      full, lambda rows: ("", _held_block(sharding, rows)))
  return {k: jax.make_array_from_process_local_data(sharding, v[held],
                                                    v.shape)
          for k, v in full.items()}


def _held_block(sharding, global_rows: int) -> slice:
  """The rows of a `global_rows` batch this host's devices hold."""
  rows = sorted(_rows_of_process(sharding, (global_rows,)))
  if rows != list(range(rows[0], rows[-1] + 1)):
    raise ValueError(f"this host's devices hold rows {rows} of the batch, "
                     "not one block; order the mesh's devices by host")
  return slice(rows[0], rows[-1] + 1)


def rows_from_hosts(local: Mapping[str, np.ndarray], rows: int
                    ) -> dict[str, Any]:
  """Every host's `local` rows laid end to end by host, then zero rows up
  to `rows`: what one process holding all of them would build.

  One process gets numpy arrays. Several get global arrays (rows over
  every device where they divide, else whole on each), each host handing
  over only its own rows; only the row counts (and a check of the fields'
  names, shapes and dtypes) cross hosts as messages. The rows go device
  to device, each to where the global array places it: a host's rows
  stay on its devices where the layout puts them there.
  """
  local, count = _checked_batch(local, lambda n: ("", n), trailing=True)
  counts = [int(n) for n in np.reshape(gather(np.int64([count])), -1)]
  if sum(counts) > rows:
    raise ValueError(f"{sum(counts)} rows from the hosts, {rows} wanted")
  if jax.process_count() == 1:
    return {k: np.concatenate([v, np.zeros((rows - count,) + v.shape[1:],
                                            v.dtype)]) for k, v in
            local.items()}
  most = max(counts)
  hosts = Mesh(np.array(jax.devices()).reshape(jax.process_count(), -1),
               ("hosts", "local"))
  # Past the staged rows: a zero row (`take` wraps negative indices).
  index = np.full(rows, len(counts) * most, np.int32)
  index[:sum(counts)] = np.concatenate(
      [h * most + np.arange(n) for h, n in enumerate(counts)])
  everyone = Mesh(np.array(jax.devices()), ("rows",))
  out = NamedSharding(everyone, P("rows") if rows % everyone.size == 0
                      else P())
  staged = {k: jax.make_array_from_process_local_data(
      NamedSharding(hosts, P("hosts")),
      np.concatenate([v, np.zeros((most - count,) + v.shape[1:], v.dtype)]))
            for k, v in local.items()}
  return {k: _take_rows(v, index, out) for k, v in staged.items()}


@functools.partial(jax.jit, static_argnums=2)
def _take_rows(x, index, out_sharding):
  """Rows `index` of `x` (past its rows: zeros), laid out by
  `out_sharding`."""
  return jax.lax.with_sharding_constraint(
      jnp.take(x, index, axis=0, mode="fill", fill_value=0), out_sharding)


def gather_rows(x: np.ndarray) -> np.ndarray:
  """Every host's rows of a small array (any count each), end to end by
  host."""
  return gather_own_rows(x)[0]


def gather_own_rows(x: np.ndarray) -> tuple[np.ndarray, slice]:
  """`gather_rows(x)`, and the slice of it that is this host's `x`."""
  x = np.asarray(x)
  counts = np.reshape(gather(np.int64([len(x)])), -1)
  most = int(counts.max())
  rows = np.reshape(gather(np.concatenate(
      [x, np.zeros((most - len(x),) + x.shape[1:], x.dtype)])),
                    (len(counts), most) + x.shape[1:])
  start = int(counts[:jax.process_index()].sum())
  return (np.concatenate([r[:n] for r, n in zip(rows, counts)]),
          slice(start, start + len(x)))


# ------------------------------------------------------- results to numpy.


def to_host(tree: Any) -> Any:
  """numpy copies of arrays, global ones included (a collective then)."""
  def one(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return np.asarray(jax.device_get(x))
    if x.is_fully_replicated:
      return np.asarray(x.addressable_data(0))
    return _allgather(x, tiled=True)
  return jax.tree.map(one, tree)


def gather(tree: Any) -> Any:
  """Every host's rows of process-local arrays, laid end to end by host.

  For each host's part of a result (sampled tokens, log-probs, stop
  reasons); global `jax.Array`s come back whole, as in `to_host`. Hosts
  whose local shapes differ all raise a ValueError naming the host.
  """
  if jax.process_count() == 1:
    return to_host(tree)
  leaves, treedef = jax.tree.flatten(tree)
  local = {str(i): np.asarray(x) for i, x in enumerate(leaves)
           if not isinstance(x, jax.Array) or x.is_fully_addressable}
  _check_hosts(_describe(local), "", "gathered values")
  out = [_allgather(x, tiled=True) if str(i) in local else to_host(x)
         for i, x in enumerate(leaves)]
  return jax.tree.unflatten(treedef, out)


def to_local(tree: Any, shardings: Any) -> Any:
  """Global arrays (sharded over every host's devices, as the trainer's
  params) as this host's own arrays laid out by `shardings`: NamedShardings
  on a mesh of this host's first devices, the same layout on every host
  (the sampler's decode mesh). Device to device, a leaf at a time: each
  leaf is resharded onto a mesh of every device holding copies of that
  local mesh (replicated over hosts and copies), and each host keeps the
  shards of its first copy. One process: `device_put`."""
  if jax.process_count() == 1:
    return jax.device_put(tree, shardings)
  return jax.tree.map(_to_local, tree, shardings)


def _to_local(x, s: NamedSharding):
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    return jax.device_put(x, s)
  local = s.mesh.devices
  count = jax.local_device_count()
  if count % local.size:  # No mesh of every device holds it: via the host.
    return jax.device_put(to_host(x), s)
  # A cross-host reshard keeps the device set: every host's devices, as
  # `count // local.size` copies of the local mesh (the first is it).
  grid = np.stack([np.array([d for d in jax.devices() if d.process_index == p
                            ]).reshape((-1,) + local.shape)
                   for p in range(jax.process_count())])
  if not (grid[jax.process_index(), 0] == local).all():
    raise ValueError("to_local: the local mesh must be this host's first "
                     f"{local.size} devices in order")
  everyone = Mesh(grid, ("hosts", "copies") + tuple(s.mesh.axis_names))
  return shd.reuse_shards(jax.device_put(x, NamedSharding(everyone, s.spec)),
                         s)


def gather_texts(texts: Sequence[str], what: str = "records",
                 problem: str = "") -> list[str]:
  """Every host's `texts` (any size), laid end to end by host.

  A host with a `problem` (its work failed) makes every host raise the same
  ValueError naming it, instead of the others waiting for its texts.
  """
  _check_hosts("", problem, what)
  if jax.process_count() == 1:
    return list(texts)
  raw = json.dumps(list(texts)).encode()
  sizes = _allgather(np.int64(len(raw)))
  sizes = [int(n) for n in np.reshape(sizes, -1)]
  buf = np.zeros(max(sizes), np.uint8)
  buf[:len(raw)] = np.frombuffer(raw, np.uint8)
  rows = _allgather(buf)
  return [t for row, n in zip(rows, sizes)
          for t in json.loads(bytes(row[:n]).decode())]


def run_local(fn: Callable[[Sequence[Any]], Sequence[Any]],
              items: Sequence[Any], what: str = "work") -> list:
  """`fn` on this host's `host_block` of `items` (uneven allowed): its
  results, once every host is done. A host whose `fn` raised raises that;
  the others a RuntimeError naming it. One process: `fn(items)`."""
  block = items[host_block(len(items), even=False)]
  return _then_wait(lambda: list(fn(block)) if len(block) else [], what)


def _then_wait(fn: Callable[[], Any], what: str) -> Any:
  """`fn()`, then wait for every host's: a host whose `fn` raised raises
  that, the others a RuntimeError naming it (none waits forever)."""
  out, error = None, None
  try:
    out = fn()
  except Exception as e:  # pylint: disable=broad-except
    error = e  # Reported below, so no host waits for this one.
  bad = _any_failed(error is not None)
  if error is not None:
    raise error
  if bad:
    raise RuntimeError(f"{what}: host {bad[0]} failed")
  return out


def fail_together(error: BaseException | None, what: str,
                  make: Callable[[str], BaseException] = RuntimeError
                  ) -> None:
  """Every host meets here with the error it has, if any. When a host has
  one, every host raises: that host its own `error` (with its traceback),
  the others `make('<what>: host <h>: <its first line>')`, so none goes on
  into a collective the failed host never joins. One process: `error`."""
  if jax.process_count() == 1:
    if error is not None:
      raise error
    return
  problem = ""
  if error is not None:
    text = str(error).strip()
    problem = (text.splitlines()[0] if text else "") or type(error).__name__
  try:
    _check_hosts("", problem, what)
  except ValueError as e:
    if error is not None:
      raise error from None
    raise make(str(e)) from None


def run_shared(fn: Callable[[Sequence[Any]], Sequence[Any]],
               items: Sequence[Any], *, to_text: Callable[[Any], str],
               from_text: Callable[[str], Any], what: str = "work"
               ) -> list:
  """`fn(items)` with the work split over hosts: each host runs `fn` on its
  `host_block` (uneven allowed) and every host gets all results, in the
  order of `items`. `fn` returns one result per item; results travel as
  text (`to_text` / `from_text`). One process: `fn(items)`.
  """
  if jax.process_count() == 1:
    return list(fn(items))
  block, error, texts = items[host_block(len(items), even=False)], None, []
  try:
    texts = [to_text(r) for r in (fn(block) if block else [])]
  except Exception as e:  # pylint: disable=broad-except
    error = e  # Reported below, so no host waits for the texts.
  problem = "" if error is None else f"{type(error).__name__}: {error}"
  try:
    texts = gather_texts(texts, f"{what} on every host", problem)
  except ValueError:
    if error is not None:
      raise error  # The failing host's own exception, with its traceback.
    raise
  return [from_text(t) for t in texts]


# -------------------------------------------------------------- one writer.


def host_file(path: str) -> str:
  """`path` itself with one process; with several, this host's own file
  beside it (`a/b.jsonl` -> `a/b-host001.jsonl`): for files every host
  writes its own part of (stage 1 shards, a judge's reply cache)."""
  if jax.process_count() == 1:
    return path
  stem, dot, suffix = path.rpartition(".")
  if not dot or "/" in suffix:
    stem, suffix = path, ""
  return f"{stem}-host{jax.process_index():03d}{dot if suffix else ''}" \
         f"{suffix}"


def is_writer() -> bool:
  """Process 0 writes the files every host would otherwise write."""
  return jax.process_index() == 0


def _any_failed(failed: bool) -> list[int]:
  """The hosts that report a failure (a barrier, too)."""
  if jax.process_count() == 1:
    return [0] if failed else []
  flags = _allgather(np.int32(failed))
  return [int(i) for i in np.flatnonzero(np.reshape(flags, -1))]


@contextlib.contextmanager
def one_writer(what: str) -> Iterator[bool]:
  """`with one_writer('eval report') as writing: if writing: ...`.

  The body writes when `writing` (process 0). On exit every host waits for
  the writer, so files are complete when any host goes on to read them; if
  the writer raised, the other hosts raise a RuntimeError saying so instead
  of going on (or waiting forever in their next collective).
  """
  failed = True
  try:
    yield is_writer()
    failed = False
  finally:
    bad = _any_failed(failed)
    if bad and not failed:
      raise RuntimeError(f"{what}: host {bad[0]} failed while writing")


def take_turns(fn: Callable[[], Any], what: str) -> None:
  """`fn()` on every host in turn, host 0 first, each once the one before
  is done: each host appends its own records to one file, which holds
  them in host order (as one process would write them), once each. If a
  host's `fn` raised, it raises that and the others a RuntimeError."""
  for host in range(jax.process_count()):
    _then_wait(fn if host == jax.process_index() else lambda: None, what)


# -------------------------------------------------------- shared workdirs.


_CHECK_DIR = ".hosts_check"


def check_shared_workdir(workdir: str | os.PathLike) -> None:
  """Raises on every host unless every host sees process 0's `workdir`.

  Process 0 writes a token file there; after a sync every host reads it
  back. Any `etils.epath` path works (local, NFS, `gs://`). One process:
  nothing to check.
  """
  if jax.process_count() == 1:
    return
  where = epath.Path(workdir) / _CHECK_DIR
  token, problem = uuid.uuid4().hex, ""
  if is_writer():
    try:
      where.mkdir(parents=True, exist_ok=True)
      (where / token).write_text(token)
    except Exception as e:  # pylint: disable=broad-except
      # Any failure must reach the exchange below, or the others would wait.
      problem = f"cannot write {where}: {e}"
  _check_hosts("", problem, f"workdir {os.fspath(workdir)}")
  token, first = _allgather_text(f"{token}{_SEP}{where}")[0].split(_SEP)
  try:
    seen = (where / token).read_text() == token
  except Exception:  # pylint: disable=broad-except
    seen = False
  problem = "" if seen else (
      f"no check file {where / token}, written by host 0 under {first}; put "
      f"the workdir on storage every host sees (NFS, a gcsfuse mount, gs://)")
  try:
    _check_hosts("", problem, "workdir not shared by all hosts")
  finally:
    if is_writer():
      with contextlib.suppress(Exception):
        (where / token).unlink()
        where.rmdir()
