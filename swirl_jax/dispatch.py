"""One dispatcher of device programs per process: `with dispatch.LOCK:`.

Two threads put programs on the same devices when SimpleTIR samples
ahead (`simpletir/pipeline.py`, staleness >= 1): the generator its
decode and prefill programs, the main thread the train step, the
log-probs, the layouts of new params and the hosts' exchanges. Programs
with collectives (tensor-parallel all-reduces, FSDP all-gathers, the
hosts' all-gathers) must start in the same order on every device they
span: a device runs its programs in the order they were queued on it,
and a collective waits until every participant reaches it. If thread A
queued program P on device 0 while thread B queued Q there, and the
order came out Q, P on device 1, device 0 would wait in P's collective
for device 1, which waits in Q's for device 0: a deadlock no timeout
ends. A CPU seldom shows it (its collectives are in-process), a GPU or
TPU can.

So every program call that may run beside the other thread's holds
`LOCK` while it is queued on all its devices. JAX queues asynchronously:
the lock is held for the call (microseconds once compiled), not for the
program's run, and is never held while waiting (for a tool, for the
other thread's rollouts, for a result copied to the host). The devices
therefore still take programs from both threads back to back; only the
order in which one program is queued on its devices is made atomic.
Which calls hold it, and the test that finds any that does not, are in
docs/scaling.md ("One dispatcher").
"""

import threading


class Dispatcher:
  """A re-entrant lock that knows its owner (`held`)."""

  def __init__(self):
    self._cond = threading.Condition()
    self._owner: int | None = None
    self._depth = 0

  def __enter__(self) -> "Dispatcher":
    me = threading.get_ident()
    with self._cond:
      if self._owner != me:
        self._cond.wait_for(lambda: self._owner is None)
        self._owner = me
      self._depth += 1
    return self

  def __exit__(self, *exc) -> None:
    with self._cond:
      self._depth -= 1
      if not self._depth:
        self._owner = None
        self._cond.notify_all()

  def held(self) -> bool:
    """Whether the calling thread holds it."""
    return self._owner == threading.get_ident()


LOCK = Dispatcher()
