"""One process of a two-host SimpleTIR job whose generator fails on one
host, for tests/test_pipeline_faults.py:

  python fault_worker.py WORKDIR

with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES=2 and JAX_PROCESS_ID set.
The job is multihost_worker.py's `simpletir` (two GRPO iterations,
scripted turns through the real sandbox) at staleness STALENESS (default
1). On host FAULT_HOST (default 1) the generator raises a RuntimeError
while it samples iteration FAULT_AT (default 1), after printing
`FAULT_AT <unix time>`. The job runs inside `main.reporting_errors`, so
each process ends as `python -m swirl_jax.main` would.
"""

import os
import pathlib
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax

from swirl_jax import distributed


def main():
  work = pathlib.Path(sys.argv[1])
  distributed.initialize(timeout_s=60)
  # After the job is joined: importing these touches the backend.
  from swirl_jax import main as main_lib
  from swirl_jax.simpletir import stages
  import multihost_worker
  jax.config.update("jax_default_matmul_precision", "highest")
  host, at = int(os.environ.get("FAULT_HOST", "1")), int(
      os.environ.get("FAULT_AT", "1"))
  real = stages.collect

  def collect(loop, it, feed):
    if jax.process_index() == host and it == at:
      print(f"FAULT_AT {time.time():.3f}", flush=True)
      raise RuntimeError("injected fault")
    return real(loop, it, feed)

  stages.collect = collect
  main_lib.reporting_errors(lambda: multihost_worker.simpletir_scenario(
      work, iterations=3,
      staleness=int(os.environ.get("STALENESS", "1"))))


if __name__ == "__main__":
  main()
