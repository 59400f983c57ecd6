"""A pool of worker processes that can be killed when a call overruns.

Symbolic maths (SymPy, math-verify) can hang or blow up on adversarial
input, and a Python thread cannot be stopped. Each call here runs in a
long-lived worker process (imports paid once); a call that overruns its
timeout gets its worker killed and replaced, so the caller always gets an
answer in bounded time. Workers run their function in their main thread,
so libraries that rely on `signal.alarm` work there too.

Why not `pebble.ProcessPool` (per-call timeout, worker restart, an
initializer that can set the memory limit): it passes this package's
calculator and checker tests, but two of our guarantees fail with pebble
5.1.1 (spawn context, measured on this machine):
- An initializer that raises (a missing math-verify, or a memory limit too
  small to import SymPy) leaves every call pending forever: pebble restarts
  the worker, and a call's timeout only starts once a worker takes it (a
  future was still unresolved after 30 s). Here the call returns
  `(False, "worker died: ...")` at once (0.5 s).
- A call past its timeout gets SIGTERM, then SIGKILL after a grace period:
  with the timeout at 1 s, a call ignoring SIGTERM returned after 5.0 s
  (here 1.9 s: the worker is killed outright).
"""

import concurrent.futures
import multiprocessing
import queue
import resource
import signal
import threading
from typing import Any, Callable

_START_TIMEOUT_S = 60.0


def _address_space_bytes() -> int:
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[0]) * resource.getpagesize()
  except (OSError, ValueError, IndexError):  # Not Linux: no baseline.
    return 0


def _serve(conn, fn, memory_bytes, initializer):
  """Worker main loop: receive an argument, send (ok, result or error)."""
  # Ctrl-C (or a notebook interrupt) reaches the whole process group; the
  # owner stops its workers itself.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  if memory_bytes:
    # On top of what the process maps already: a spawned worker first
    # re-imports the parent's main module, which may have mapped gigabytes
    # of address space (JAX does) before this line runs.
    limit = _address_space_bytes() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
  if initializer is not None:
    initializer()  # Slow imports happen here, outside any call's timeout.
  conn.send("ready")
  while True:
    try:
      arg = conn.recv()
    except (EOFError, OSError):
      return
    try:
      reply = (True, fn(arg))
    except BaseException as e:  # pylint: disable=broad-except
      reply = (False, f"{type(e).__name__}: {e}")
    try:
      conn.send(reply)
    except Exception as e:  # pylint: disable=broad-except
      conn.send((False, f"unsendable result: {type(e).__name__}: {e}"))


class _Worker:
  """One process and its pipe."""

  def __init__(self, ctx, fn, memory_bytes, initializer):
    self.conn, child = ctx.Pipe()
    self.proc = ctx.Process(target=_serve,
                            args=(child, fn, memory_bytes, initializer),
                            daemon=True)
    self.proc.start()
    child.close()
    if not self.conn.poll(_START_TIMEOUT_S) or self.conn.recv() != "ready":
      self.kill()
      raise RuntimeError("worker process failed to start")

  def kill(self):
    self.proc.kill()
    self.proc.join(5)
    self.conn.close()


class WorkerPool:
  """Runs `fn(arg)` in worker processes, each call under a timeout.

  `fn` and `initializer` (run once in each new worker, before its first
  call) must be picklable by reference (module-level functions). Results
  come back as `(True, value)` or `(False, "error message")`; nothing is
  raised for a failing, hanging or crashing call.
  """

  def __init__(self, fn: Callable[[Any], Any], num_workers: int = 2,
               timeout_s: float = 5.0, memory_bytes: int | None = None,
               initializer: Callable[[], None] | None = None):
    if num_workers < 1:
      raise ValueError(f"num_workers={num_workers} must be >= 1")
    self.fn = fn
    self.num_workers = num_workers
    self.timeout_s = timeout_s
    self.memory_bytes = memory_bytes
    self.initializer = initializer
    # Spawned, not forked: the parent may hold threads and accelerators.
    self._ctx = multiprocessing.get_context("spawn")
    # Last in, first out: sequential use keeps reusing one live worker.
    self._slots = queue.LifoQueue()
    for _ in range(num_workers):
      self._slots.put(None)  # Workers start lazily, on first use.
    self._closed = False
    self._lock = threading.Lock()

  def run(self, arg: Any, timeout_s: float | None = None) -> tuple[bool, Any]:
    """One call in a free worker; blocks until a worker is free."""
    if self._closed:
      raise RuntimeError("WorkerPool is closed")
    timeout_s = self.timeout_s if timeout_s is None else timeout_s
    worker = self._slots.get()
    try:
      if worker is None or not worker.proc.is_alive():
        worker = _Worker(self._ctx, self.fn, self.memory_bytes,
                         self.initializer)
      worker.conn.send(arg)
      if worker.conn.poll(timeout_s):
        return worker.conn.recv()
      worker.kill()
      worker = None
      return False, f"timed out after {timeout_s:g} s"
    except (EOFError, OSError, RuntimeError) as e:
      # The worker died (memory limit, crash): replace it next time.
      if worker is not None:
        worker.kill()
      worker = None
      return False, f"worker died: {type(e).__name__}: {e}"
    finally:
      self._slots.put(worker)

  def map(self, args, timeout_s: float | None = None) -> list[tuple[bool, Any]]:
    """`run` over args, up to `num_workers` at a time, in order."""
    args = list(args)
    if len(args) <= 1:
      return [self.run(a, timeout_s) for a in args]
    with concurrent.futures.ThreadPoolExecutor(self.num_workers) as ex:
      return list(ex.map(lambda a: self.run(a, timeout_s), args))

  def close(self):
    """Kills all workers; the pool cannot be used afterwards."""
    with self._lock:
      if self._closed:
        return
      self._closed = True
    for _ in range(self.num_workers):
      worker = self._slots.get()
      if worker is not None:
        worker.kill()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def __del__(self):
    try:
      self.close()
    except Exception:  # pylint: disable=broad-except
      pass
