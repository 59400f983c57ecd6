"""Which device programs are queued outside `dispatch.LOCK`, for
tests/test_pipeline_faults.py:

  python dispatch_check.py WORKDIR

Runs SimpleTIR with the tiny model at staleness 1 on 4 CPU devices: the
trainer's mesh over all 4, the sampler tensor-parallel over 2 (two data
groups), so both threads queue programs with collectives on the same
devices. Every program call goes through JAX's Python path (its C++ fast
path is turned off), where each run of a compiled program is seen with
the thread that queued it, while the generator's thread runs. Prints, as its last line, a JSON object:
`threads` (the threads that queued programs on more than one device) and
`unlocked` (each such program queued without the lock held: thread,
program name and count).
"""

import collections
import json
import os
import sys
import threading

# XLA's lowest backend level: this check counts which thread queues each
# program and pins no figure, and compiles dominate it (25 s -> 18.5 s
# for its test alone at 58dc193).
os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=4 "
                           "--xla_backend_optimization_level=0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
from jax._src import pjit
from jax._src.interpreters import pxla

from swirl_jax import dispatch
from swirl_jax.simpletir import train

import simpletir_script

QUEUED = collections.Counter()  # (thread, program, locked) -> calls.


def _beside_generator() -> bool:
  """Whether the generator's thread runs (only then can two threads'
  programs interleave)."""
  return any(t.name == "generator" and t.is_alive()
             for t in threading.enumerate())


def _watch() -> None:
  pjit._get_fastpath_data = lambda *a, **k: None  # pylint: disable=protected-access
  real = pxla.ExecuteReplicated.__call__

  def call(self, *args):
    if len(self._local_devices) > 1 and _beside_generator():  # pylint: disable=protected-access
      QUEUED[(threading.current_thread().name, self.name,
              dispatch.LOCK.held())] += 1
    return real(self, *args)
  pxla.ExecuteReplicated.__call__ = call


def main():
  jax.config.update("jax_default_matmul_precision", "highest")
  assert jax.device_count() == 4, jax.devices()
  _watch()
  c = simpletir_script.config(temperature=1.0)
  c.staleness, c.train.loss.tis_cap = 1, 2.0
  c.sampler.update(tensor_parallel=2, data_parallel=2)
  train.run(c, sys.argv[1])
  threads = sorted({t for t, _, _ in QUEUED})
  unlocked = sorted([t, p, n] for (t, p, locked), n in QUEUED.items()
                    if not locked)
  print(json.dumps({"threads": threads, "unlocked": unlocked}))


if __name__ == "__main__":
  main()
