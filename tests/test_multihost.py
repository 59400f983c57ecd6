"""swirl_jax.distributed with two real jax.distributed processes on this CPU.

Each process of a pair has 4 CPU devices (8 global) and talks to the other
over gloo through a coordinator on a free localhost port; the reference is
one process with 8 devices running the same script (multihost_worker.py).
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from swirl_jax import distributed
from swirl_jax import sharding

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
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO),
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  env.update({k: str(v) for k, v in extra.items()})
  return env


def _run_pair(scenario, out, timeout=60):
  """Both processes of a 2-host job; (returncodes, outputs, seconds)."""
  address = f"127.0.0.1:{_free_port()}"
  start = time.monotonic()
  procs = [subprocess.Popen(
      [sys.executable, str(WORKER), scenario, str(out)],
      env=_env(4, JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=2,
               JAX_PROCESS_ID=i),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  try:
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return [p.returncode for p in procs], outputs, time.monotonic() - start


def _run_single(scenario, out):
  r = subprocess.run([sys.executable, str(WORKER), scenario, str(out)],
                     env=_env(8), capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stdout + r.stderr
  return json.loads((out / "result_0.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """(one-process result, [host 0 result, host 1 result])."""
  one = tmp_path_factory.mktemp("one")
  two = tmp_path_factory.mktemp("two")
  codes, outputs, _ = _run_pair("main", two)
  assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
  hosts = [json.loads((two / f"result_{i}.json").read_text()) for i in (0, 1)]
  return _run_single("main", one), hosts


def test_two_processes_form_one_job(runs):
  single, hosts = runs
  assert [(h["process"], h["processes"], h["devices"]) for h in hosts] == [
      (0, 2, 8), (1, 2, 8)]
  assert (single["processes"], single["devices"]) == (1, 8)


def test_host_shares_are_every_pair_once_with_one_process_seeds(runs):
  single, hosts = runs
  shares = [tuple(p) for h in hosts for p in h["share"]]
  assert len(shares) == len(set(shares)) == 16
  assert not set(map(tuple, hosts[0]["share"])) & set(
      map(tuple, hosts[1]["share"]))
  # Same pairs and seeds, in the same row order, as one process doing all.
  assert shares == [tuple(p) for p in single["share"]]


def test_gather_returns_every_hosts_rows(runs):
  single, hosts = runs
  for h in hosts:
    assert h["all_pairs"] == single["all_pairs"]
    assert h["stop"] == single["stop"]
    assert sorted(i for i, _ in h["all_pairs"]) == list(range(16))


def test_global_batch_step_matches_one_process(runs):
  single, hosts = runs
  for h in hosts:
    np.testing.assert_allclose(h["loss"], single["loss"], atol=1e-6)
    np.testing.assert_allclose(h["new_w"], single["new_w"], atol=1e-6)
    assert h["tokens"] == single["tokens"]


def test_sharded_output_needs_to_host(runs):
  """device_get of the batch-sharded output fails on a host; to_host works
  (its values are compared with one process above)."""
  single, hosts = runs
  assert single["direct_device_get"] == "ok"
  assert [h["direct_device_get"] for h in hosts] == ["RuntimeError"] * 2


def test_one_writer_writes_once_and_reports_its_failure(runs):
  _, hosts = runs
  assert [h["log_lines"] for h in hosts] == [["one line"]] * 2
  assert hosts[0]["writer_failure"] == "OSError: disk full"
  assert hosts[1]["writer_failure"].startswith("RuntimeError: ")
  assert "host 0 failed while writing" in hosts[1]["writer_failure"]


def test_check_shared_workdir(runs):
  """Passes for one shared dir (else the run had failed); two dirs fail on
  both hosts with the same message."""
  single, hosts = runs
  assert single["workdir_error"] == ""
  errors = [h["workdir_error"] for h in hosts]
  assert errors[0] == errors[1]
  assert "workdir not shared by all hosts: host 1: no check file" in errors[0]
  assert "own1" in errors[0] and "own0" in errors[0]
  assert not list((pathlib.Path(errors[0].split("under ")[1].split(";")[0])
                   ).parent.glob(".hosts_check/*"))  # Token cleaned up.


def test_different_batch_shapes_fail_on_both_hosts_fast(tmp_path):
  codes, outputs, seconds = _run_pair("bad_shapes", tmp_path, timeout=60)
  want = ("ValueError: global batch fields differ between hosts: host 0 has "
          "{tokens: int32[4, 16]}, host 1 has {tokens: int32[4, 24]}")
  for code, output in zip(codes, outputs):
    assert code == 1, output[-3000:]
    assert want in output
  assert seconds < 30  # No hang: a stuck collective would hit the timeout.


# One process: the same functions without collectives.


def test_host_share_splits_evenly_for_any_host_count():
  pairs = [(t, s) for t in ("a", "b", "c") for s in range(4)]
  one = distributed.host_share(pairs, 3, process_index=0, process_count=1)
  for count in (1, 2, 3, 4, 6):
    parts = [distributed.host_share(pairs, 3, process_index=i,
                                    process_count=count)
             for i in range(count)]
    assert [p for part in parts for p in part] == one
  assert [(p.task_id, p.sample) for p in one] == pairs
  assert len({p.seed for p in one}) == len(pairs)
  assert one[0].seed == distributed.pair_seed(3, "a", 0)
  assert one[0].seed != distributed.pair_seed(4, "a", 0)
  with pytest.raises(ValueError, match="12 .* do not split evenly over 5"):
    distributed.host_share(pairs, 3, process_index=0, process_count=5)


def test_settings_from_launcher_environment():
  env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.2:8476", "JAX_NUM_PROCESSES": "4",
         "JAX_PROCESS_ID": "3"}
  assert distributed.settings(env) == {
      "coordinator_address": "10.0.0.2:8476", "num_processes": 4,
      "process_id": 3}
  # SLURM: the id of each task comes from srun.
  slurm = {"JAX_COORDINATOR_ADDRESS": "node1:61000", "JAX_NUM_PROCESSES": "2",
           "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
  assert distributed.settings(slurm)["process_id"] == 1
  # TPU VMs: only the coordinator; JAX reads the rest from the metadata.
  assert distributed.settings({"JAX_COORDINATOR_ADDRESS": "h:1"}) == {
      "coordinator_address": "h:1", "num_processes": None, "process_id": None}
  with pytest.raises(ValueError, match="JAX_PROCESS_ID='x' is not an int"):
    distributed.settings({"JAX_PROCESS_ID": "x"})
  with pytest.raises(ValueError, match=r"process id 2 is not in \[0, 2\)"):
    distributed.settings({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"})


@pytest.mark.parametrize("env, want", [
    ({}, False), ({"JAX_NUM_PROCESSES": "1"}, False),
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.2:8476"}, True),
    ({"JAX_NUM_PROCESSES": "2"}, True), ({"SLURM_NTASKS": "2"}, True),
    ({"TPU_WORKER_HOSTNAMES": "a,b"}, True),
    ({"TPU_WORKER_HOSTNAMES": "a"}, False)])
def test_is_multiprocess(env, want):
  assert distributed.is_multiprocess(env) is want


def test_single_process_helpers():
  assert not distributed.initialize({})  # Nothing to join.
  assert distributed.is_writer()
  mesh = sharding.make_mesh([("data", -1)])
  rows = NamedSharding(mesh, P("data"))
  x = np.arange(16, dtype=np.float32).reshape(8, 2)
  batch = distributed.global_batch({"x": x}, rows)
  assert batch["x"].sharding == rows
  np.testing.assert_array_equal(distributed.to_host(batch)["x"], x)
  np.testing.assert_array_equal(distributed.gather(x), x)
  with pytest.raises(ValueError, match="differ in rows"):
    distributed.global_batch({"x": x, "y": np.zeros(4)}, rows)
  distributed.check_shared_workdir("/nonexistent/one/process")
  with distributed.one_writer("x") as writing:
    assert writing


def test_long_messages_keep_a_digest():
  a, b = "x" * 10000 + "a", "x" * 10000 + "b"
  fa, fb = distributed._fit(a, 100), distributed._fit(b, 100)
  assert len(fa.encode()) <= 100 and fa != fb
  assert distributed._fit("short", 100) == "short"
