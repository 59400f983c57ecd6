"""Rollouts sampled ahead of the update: SimpleTIR with bounded staleness.

`Generator` hands the training loop each iteration's rollouts (`take`)
and takes each new policy from it (`publish`). With `staleness` k = 0 it
samples iteration i's rollouts when asked, on policy version i (the
params after i iterations): the synchronous loop. With k >= 1 a thread
samples ahead while the trainer updates: iteration i's rollouts on
version max(0, i - k), so iteration i + 1's are sampled on version i
while the trainer makes version i + 1 (k = 1), and no trajectory is ever
more than k versions behind the policy it updates.

Deterministic. The version that samples each token is a function of the
iteration alone: iteration i starts and ends on version max(0, i - k),
taken into the generator's device when the rollout starts (never when
the trainer happens to finish: that would depend on timing). With the
rollout seeds (`turns.draw`: run seed, trajectory, turn, stretch), a
row's tokens then do not depend on when anything ran, so a run at k = 0
equals the synchronous loop record for record, a resumed run equals an
uninterrupted one and several hosts equal one. (Timing decides only
how far an oversampled rollout on one host runs past the groups it
needs, which `oversample.kept_groups` then leaves out.) Each trajectory
is stamped with its version (`meta['policy_version']`), which the select
stage checks (`grpo.stale`): a row more than k versions behind is
dropped from the loss and counted, never trained on.

The generator thread does no cross-host exchange: it samples and scores
this host's own pairs, on params already laid out for this host
(`Sampler.local_params`, in the main thread, where every collective is,
in the same order on every host). It holds `lock` while it samples; the
main thread takes it (`paused`) to validate on the same sampler.

Exact resume. A checkpoint at data position n (n iterations trained)
comes with the rollouts of iterations n .. n + k - 1 on disk: sampled on
versions older than n, which the checkpoint no longer holds. Each
iteration's collected rollouts go, as sampled, to
`<workdir>/queue/iter_<i>_v<version>.jsonl` (each host its own file,
written atomically), and before a checkpoint is taken the trainer waits
for those k (`saved`). A resumed run reads the files it finds for
(iteration, version) and samples the rest, on versions it makes again.
Once a checkpoint at data position n is on disk no resume starts before
it, so the files of iterations before n go (`prune`, on
`Trainer.after_save`): the queue holds the iterations from the newest
checkpoint on disk to k past the trainer's position, not the whole run.
(A resume that falls back to an older checkpoint, the newest being
unreadable, then stops with the error naming the missing file.) The
queue goes when the run ends.

A fault reaches every host. The hosts meet in `take` (and in `saved`,
before a checkpoint) whatever happened: a host whose generator raised
brings its error there, and every host raises (`distributed.
fail_together`): that one its own error, the others `HostFailed` naming
it, in one line. A host still waiting for its own rollouts does not wait
them out: the failed generator leaves a mark in the queue
(`failed-host<h>.txt`, cleared when a queue is opened again), which the
waiting hosts look for every `POLL_S` seconds. No host so goes on into a
collective that the failed one never joins (it would wait there until
the coordination service's heartbeat timed out).

A queue belongs to one run. Its manifest (`manifest.json`, written when
the queue is made) holds what decides the rollouts: the config's fields
that do (`stages.queue_manifest`: the seed among them) and the host
count (each host's files hold its own block of the pairs). A queue whose
manifest differs is refused (`Mismatch`), naming the first field that
does, rather than read as this run's rollouts.
"""

import json
import pathlib
import re
import shutil
import threading
from typing import Any, Callable

import jax

from swirl_jax import distributed, errors, jsonl
from swirl_jax.rollout.engine import Policy
from swirl_jax.rollout.records import Trajectory

Collect = Callable[[int, Callable[[], Policy]], list[Trajectory]]


class Closed(Exception):
  """The generator was closed while it sampled (the run is ending)."""


class Mismatch(errors.UserError, ValueError):
  """A queue written by a run with other settings than this one."""


class Failed(RuntimeError):
  """The generator thread raised while it made an iteration's rollouts."""


class FailedUserError(errors.UserError, Failed):
  """`Failed` of a cause the user can act on (a bad file, a full disk):
  `main` prints its one line."""


class HostFailed(errors.UserError, Failed):
  """Another host's generator failed: this host stops with one line naming
  it (`main` prints it), the failed host's own log has the traceback."""


MANIFEST = "manifest.json"
_NAME = re.compile(r"iter_(\d+)_v(\d+)")
_FAILED = "failed-host*.txt"  # A host's generator failed: its line.
POLL_S = 0.5  # How often a waiting host looks for another host's failure.


class Queue:
  """Collected rollouts by (iteration, version), this host's own files.

  `manifest`: what decides this run's rollouts (a flat JSON-able dict);
  written with a new queue, checked against an existing one's."""

  def __init__(self, directory: pathlib.Path,
               manifest: dict[str, Any] | None = None):
    self.directory = directory
    if manifest is not None:
      # As it reads back: tuples as lists, anything else as its text.
      self._open(json.loads(json.dumps(manifest, default=str)))

  def _open(self, manifest: dict[str, Any]) -> None:
    """Writes the manifest (process 0; the workdir is shared), or checks
    the one there, on every host alike. A queue without one (made before
    queues had manifests) is taken as this run's."""
    path = self.directory / MANIFEST
    with distributed.one_writer(f"{path}") as writing:
      if writing and not path.exists():
        jsonl.write_bytes(path, json.dumps(manifest, indent=1,
                                           sort_keys=True).encode())
      if writing:  # A failed run's marks; this run starts clean.
        for mark in self.directory.glob(_FAILED):
          mark.unlink(missing_ok=True)
    theirs = jsonl.read_json(path)
    for key in sorted(manifest.keys() | theirs.keys(), key=_first):
      was, now = _shown(theirs, key), _shown(manifest, key)
      if was != now:
        raise Mismatch(
            f"queue {self.directory} was written by a run with {key} = "
            f"{was}; this run has {now}: its rollouts are not this run's "
            f"(rerun with that run's settings, or use a new workdir)")

  def path(self, it: int, version: int) -> pathlib.Path:
    return pathlib.Path(distributed.host_file(
        str(self.directory / f"iter_{it:06d}_v{version:06d}.jsonl")))

  def load(self, it: int, version: int) -> list[Trajectory] | None:
    path = self.path(it, version)
    return jsonl.read(path, Trajectory.from_dict) if path.exists() else None

  def save(self, it: int, version: int, trajs) -> None:
    self.directory.mkdir(parents=True, exist_ok=True)
    jsonl.write(self.path(it, version), trajs)

  def prune(self, data_pos: int) -> None:
    """Deletes this host's files of iterations before `data_pos` (a
    checkpoint there is on disk: no resume needs them)."""
    for path in self.directory.glob("iter_*"):
      m = _NAME.match(path.name)
      if m and int(m[1]) < data_pos and \
          self.path(int(m[1]), int(m[2])) == path:
        path.unlink(missing_ok=True)

  def mark_failed(self, line: str) -> None:
    """Tells the other hosts (the workdir is shared) that this host's
    generator failed, so that one waiting for its own rollouts stops
    waiting (`failed_elsewhere`) and meets this one in `take`."""
    jsonl.write_bytes(self._mark(), line.encode())

  def failed_elsewhere(self) -> bool:
    return any(p != self._mark() for p in self.directory.glob(_FAILED))

  def _mark(self) -> pathlib.Path:
    return self.directory / _FAILED.replace("*",
                                            f"{jax.process_index():03d}")

  def clear(self) -> None:
    shutil.rmtree(self.directory, ignore_errors=True)


def _shown(manifest: dict[str, Any], key: str) -> str:
  if key not in manifest:
    return "(unset)"
  return json.dumps(manifest[key], sort_keys=True)


def _first(key: str) -> tuple:
  """The order mismatches are named in: the host count and the seed (the
  usual suspects) first, then the rest by name."""
  return ({"process_count": 0, "seed": 1}.get(key, 2), key)


class Generator:
  """Each iteration's rollouts from `collect(it, policy)` (this host's
  scored trajectories of iteration `it`, sampled with `policy()`, asked
  before each device step), iterations `start` .. `stop` - 1, on version
  max(0, it - `staleness`); with `staleness` >= 1 in a thread, ahead of
  the trainer, through `queue`."""

  def __init__(self, collect: Collect, *, staleness: int, start: int,
               stop: int, queue: Queue | None = None):
    self.collect, self.k, self.stop = collect, staleness, stop
    self.queue = queue
    self.lock = threading.Lock()  # Held while sampling.
    self._cond = threading.Condition()
    self._versions: dict[int, Policy] = {}
    self._ready: dict[int, list[Trajectory]] = {}
    self._next = start  # The next iteration collected.
    self._error: tuple[int, BaseException] | None = None  # (it, error)
    self._closed = False
    self._thread = None
    if self.k:
      self._thread = threading.Thread(target=self._run, args=(start,),
                                      name="generator", daemon=True)
      self._thread.start()

  def version_for(self, it: int) -> int:
    return max(0, it - self.k)

  def publish(self, policy: Policy) -> None:
    """Version `policy.version` of the policy, to sample with (`params`
    already this host's: `Sampler.local_params`; with k >= 1 a copy the
    trainer does not update in place)."""
    with self._cond:
      self._versions[policy.version] = policy
      self._cond.notify_all()

  def latest(self) -> Policy:
    with self._cond:
      return self._versions[max(self._versions)]

  def take(self, it: int) -> list[Trajectory]:
    """Iteration `it`'s rollouts (waits for the thread; k = 0: samples
    them now, on version `it`, which must be published). Every host
    meets here: if any host's generator failed, every host raises
    (`distributed.fail_together`), none waits in a later collective."""
    trajs, error = None, None
    try:
      trajs = self._take(it)
    except Exception as e:  # pylint: disable=broad-except
      error = e  # Reported to every host below.
    distributed.fail_together(error, "this run stopped", HostFailed)
    if trajs is None:  # Marked failed elsewhere, yet no host reported it.
      raise Failed(f"iteration {it}: a host marked its generator failed "
                   f"in {self.queue.directory}, but none reported why")
    return trajs

  def _take(self, it: int) -> list[Trajectory] | None:
    """This host's rollouts of `it`; None when another host failed."""
    if not self.k:
      policy = self._versions[it]
      self._versions = {it: policy}  # Older ones are never used again.
      return self.collect(it, lambda: policy)
    if not self._wait_until(lambda: it in self._ready):
      return None
    return self._ready.pop(it)

  def saved(self, data_pos: int) -> None:
    """Waits until the rollouts a resume from `data_pos` needs are on disk
    (those of iterations before data_pos + k); `Trainer.before_save`.
    Every host meets here, as in `take`."""
    if not self.k:
      return
    upto = min(data_pos + self.k, self.stop)
    error = None
    try:
      self._wait_until(lambda: self._next >= upto)
    except Exception as e:  # pylint: disable=broad-except
      error = e
    distributed.fail_together(error, "this run stopped", HostFailed)

  def _wait_until(self, done: Callable[[], bool]) -> bool:
    """Waits for `done()` (True) or this thread's error (raised,
    `_raise`); False as soon as another host's generator failed (its mark
    in the queue), so this host goes on to meet it in `fail_together`
    rather than wait out its own iteration."""
    with self._cond:
      while not self._cond.wait_for(lambda: done() or self._error,
                                    timeout=POLL_S):
        if self.queue is not None and self.queue.failed_elsewhere():
          return False
      self._raise()
      return True

  def prune(self, data_pos: int) -> None:
    """The queue's files of iterations before `data_pos` go (a checkpoint
    there is on disk); `Trainer.after_save`."""
    if self.queue is not None:
      self.queue.prune(data_pos)

  def paused(self):
    """`with generator.paused():` nothing samples in the body."""
    return self.lock

  def close(self, finished: bool = False) -> None:
    """Stops the thread (a rollout in progress ends at its next device
    step); `finished`: the run is done, its queue goes."""
    with self._cond:
      self._closed = True
      self._cond.notify_all()
    if self._thread is not None:
      self._thread.join()
    if finished and self.queue is not None:
      with distributed.one_writer("queue cleanup") as writing:
        if writing:
          self.queue.clear()

  def _raise(self) -> None:
    """The thread's error, in the main thread, in one line naming the
    iteration and the cause (a user error's stays one: `main` prints it
    without a traceback)."""
    if self._error is None:
      return
    it, e = self._error
    cls = FailedUserError if errors.one_line(e) else Failed
    raise cls(self._line(it, e)) from e

  def _line(self, it: int, e: BaseException) -> str:
    cause = errors.one_line(e) or f"{type(e).__name__}: {_first_line(e)}"
    return (f"the rollout generator failed at iteration {it} "
            f"(policy version {self.version_for(it)}): {cause}")

  def _run(self, start: int) -> None:
    it = start
    try:
      for it in range(start, self.stop):
        trajs = self._collect(it, self.version_for(it))
        with self._cond:
          self._ready[it] = trajs
          self._next = it + 1
          # Versions below the next iteration's are never used again.
          for v in [v for v in self._versions
                    if v < self.version_for(it + 1) and
                    v != max(self._versions)]:
            del self._versions[v]
          self._cond.notify_all()
    except Closed:
      pass
    except BaseException as e:  # pylint: disable=broad-except
      with self._cond:
        self._error = (it, e)  # Raised in the main thread (`_raise`).
        self._cond.notify_all()
      if self.queue is not None:
        try:
          self.queue.mark_failed(self._line(it, e))
        except OSError:
          pass  # The others then learn of it in `take`, a little later.

  def _collect(self, it: int, version: int) -> list[Trajectory]:
    """Iteration `it`'s rollouts from the queue, or sampled on `version`
    (waiting for it) and put in the queue."""
    trajs = self.queue.load(it, version) if self.queue else None
    if trajs is not None:
      return trajs
    policy = self._wait(it, version)

    def feed() -> Policy:
      if self._closed:
        raise Closed()
      return policy
    with self.lock:
      trajs = self.collect(it, feed)
    if self.queue is not None:
      self.queue.save(it, version, trajs)
    return trajs

  def _wait(self, it: int, version: int) -> Policy:
    with self._cond:
      self._cond.wait_for(lambda: version in self._versions or self._closed
                          or (self._versions and
                              min(self._versions) > version))
      if self._closed:
        raise Closed()
      if version not in self._versions:
        raise RuntimeError(
            f"iteration {it}'s rollouts (policy version {version}) are not "
            f"in {self.queue.directory if self.queue else 'a queue'} and "
            f"the run no longer has version {version}: resume with the "
            f"staleness it was saved with")
      return self._versions[version]


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else "(no message)"
