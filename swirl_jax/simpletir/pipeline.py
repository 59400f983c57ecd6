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
The queue goes when the run ends.
"""

import pathlib
import shutil
import threading
from typing import Callable

from swirl_jax import distributed, jsonl
from swirl_jax.rollout.engine import Policy
from swirl_jax.rollout.records import Trajectory

Collect = Callable[[int, Callable[[], Policy]], list[Trajectory]]


class Closed(Exception):
  """The generator was closed while it sampled (the run is ending)."""


class Queue:
  """Collected rollouts by (iteration, version), this host's own files."""

  def __init__(self, directory: pathlib.Path):
    self.directory = directory

  def path(self, it: int, version: int) -> pathlib.Path:
    return pathlib.Path(distributed.host_file(
        str(self.directory / f"iter_{it:06d}_v{version:06d}.jsonl")))

  def load(self, it: int, version: int) -> list[Trajectory] | None:
    path = self.path(it, version)
    return jsonl.read(path, Trajectory.from_dict) if path.exists() else None

  def save(self, it: int, version: int, trajs) -> None:
    self.directory.mkdir(parents=True, exist_ok=True)
    jsonl.write(self.path(it, version), trajs)

  def clear(self) -> None:
    shutil.rmtree(self.directory, ignore_errors=True)


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
    self._error: BaseException | None = None
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
    them now, on version `it`, which must be published)."""
    if not self.k:
      policy = self._versions[it]
      self._versions = {it: policy}  # Older ones are never used again.
      return self.collect(it, lambda: policy)
    with self._cond:
      self._cond.wait_for(lambda: it in self._ready or self._error)
      self._raise()
      return self._ready.pop(it)

  def saved(self, data_pos: int) -> None:
    """Waits until the rollouts a resume from `data_pos` needs are on disk
    (those of iterations before data_pos + k); `Trainer.before_save`."""
    if not self.k:
      return
    upto = min(data_pos + self.k, self.stop)
    with self._cond:
      self._cond.wait_for(lambda: self._next >= upto or self._error)
      self._raise()

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
    if self._error is not None:
      raise RuntimeError("the rollout generator failed") from self._error

  def _run(self, start: int) -> None:
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
        self._error = e  # Raised in the main thread (`take`, `saved`).
        self._cond.notify_all()

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
