"""Launching tests/multihost_worker.py for the multi-host test files
(test_multihost*.py): two real jax.distributed processes on this CPU, each
with 4 CPU devices (8 global), talking over gloo through a coordinator on
a free localhost port; the reference is one process with 8 devices
running the same scenario. And what the job tests compare: the files a
job wrote, its losses, its exported params.

Every process gets the session's compilation cache and XLA's lowest
backend optimisation level: the two sides of each comparison run under
the same flags, and no test of these files pins a figure.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np

from swirl_jax import jsonl

import testutil

REPO = pathlib.Path(__file__).resolve().parent.parent
WORKER = pathlib.Path(__file__).resolve().parent / "multihost_worker.py"
_DROP = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
         "JAX_PROCESS_ID", "SLURM_NTASKS", "SLURM_PROCID",
         "TPU_WORKER_HOSTNAMES", "XLA_FLAGS", "http_proxy", "https_proxy",
         "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices, **extra):
  env = {k: v for k, v in os.environ.items() if k not in _DROP}
  flags = (f"--xla_force_host_platform_device_count={devices} "
           f"{testutil.FAST_XLA_FLAGS}")
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO), XLA_FLAGS=flags,
             **testutil.jax_cache_env())
  env.update({k: str(v) for k, v in extra.items()})
  return env


def start_pair(scenario, out, **extra):
  """Both processes of a 2-host job, started (Popen, output piped)."""
  address = f"127.0.0.1:{_free_port()}"
  return [subprocess.Popen(
      [sys.executable, str(WORKER), scenario, str(out)], cwd=REPO,
      env=_env(4, JAX_COORDINATOR_ADDRESS=address,
               JAX_NUM_PROCESSES=2, JAX_PROCESS_ID=i, **extra),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
          for i in range(2)]


def run_pair(scenario, out, timeout=60, **extra):
  """Both processes of a 2-host job; (returncodes, outputs, seconds)."""
  start = time.monotonic()
  procs = start_pair(scenario, out, **extra)
  try:
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return [p.returncode for p in procs], outputs, time.monotonic() - start


def run_single(scenario, out, timeout=60, **extra):
  """The same scenario in one process with 8 devices; its result_0.json
  (None for a job, which writes only its workdir)."""
  r = subprocess.run([sys.executable, str(WORKER), scenario, str(out)],
                     cwd=REPO, env=_env(8, **extra),
                     capture_output=True, text=True, timeout=timeout)
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  path = out / "result_0.json"
  return json.loads(path.read_text()) if path.exists() else None


def files(work: pathlib.Path) -> set[str]:
  """Output files; checkpoint and TensorBoard internals differ by design
  (orbax writes per-process parts), stage 1 shards by host."""
  skip = {"checkpoints", "tensorboard", "stage1", ".hosts_check"}
  return {str(p.relative_to(work)) for p in work.rglob("*") if p.is_file()
          and not skip & set(p.relative_to(work).parts)}


def readable(work: pathlib.Path) -> None:
  for p in work.rglob("*.jsonl"):
    if "checkpoints" not in p.parts:
      jsonl.read(p)  # Strict: a torn or doubled write would fail here.
  for p in work.rglob("*.json"):
    if "checkpoints" not in p.parts:
      jsonl.read_json(p)


def params(work: pathlib.Path) -> dict:
  return testutil.load_weights(work / "hf")


def compare_params(one: dict, two: dict) -> None:
  assert set(one) == set(two)
  for k in one:
    np.testing.assert_allclose(two[k], one[k], atol=1e-5, err_msg=k)


def losses(path: pathlib.Path) -> list[tuple[int, float]]:
  return [(r["step"], r["loss"]) for r in jsonl.read(path)]


def jobs(scenario, root, timeout, workdirs=("work",), **extra):
  """Runs `scenario` on two hosts (under root/two) and on one (root/one);
  for each of `workdirs` (the job's workdirs under its output directory),
  the (one-process workdir, two-process workdir) pair: the same files,
  every record readable."""
  one, two = root / "one", root / "two"
  codes, outputs, _ = run_pair(scenario, two, timeout=timeout, **extra)
  assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
  run_single(scenario, one, timeout=timeout, **extra)
  out = {}
  for name in workdirs:
    a, b = one / name, two / name
    assert files(a) == files(b), name
    readable(b)
    out[name] = a, b
  return out
