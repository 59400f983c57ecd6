"""swirl_jax.distributed with two real jax.distributed processes on this CPU
(tests/multihost_launch.py): each of a pair has 4 CPU devices (8 global);
the reference is one process with 8 devices running the same scenario of
multihost_worker.py. This file: the helpers, on two hosts and on one. The
jobs on two hosts: test_multihost_simpletir.py,
test_multihost_exchange.py, test_multihost_swirl.py (one file each, so
that xdist's workers share them).
"""

import json
import pathlib
import re
import time

import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from swirl_jax import distributed
from swirl_jax import sharding

from multihost_launch import run_pair, run_single


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """(one-process result, [host 0 result, host 1 result])."""
  one = tmp_path_factory.mktemp("one")
  two = tmp_path_factory.mktemp("two")
  codes, outputs, _ = run_pair("main", two)
  assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
  hosts = [json.loads((two / f"result_{i}.json").read_text()) for i in (0, 1)]
  return run_single("main", one), hosts


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


def test_to_local_brings_global_params_to_a_host_mesh(runs):
  """The trainer's params (sharded over both hosts' 8 devices) onto each
  host's own decode mesh, device to device: the whole value, split over
  'tensor' and on that host's devices only."""
  single, hosts = runs
  want = np.arange(64.0).reshape(8, 8).tolist()
  for h in hosts + [single]:
    got = h["to_local"]
    for name, n in (("tensor2", 2), ("data2_tensor2", 4)):
      assert got[name]["values"] == want
      assert got[name]["addressable"]
      assert got[name]["devices"] == sorted(got["local_ids"][:n])
      assert got[name]["shard"] == [8, 4]
  assert hosts[0]["to_local"]["local_ids"] != hosts[1]["to_local"]["local_ids"]


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


@pytest.mark.parametrize("scenario, want", [
    ("bad_shapes", "ValueError: global batch fields differ between hosts: "
     "host 0 has {tokens: int32[4, 16]}, host 1 has {tokens: int32[4, 24]}"),
    ("bad_train_batch", "ValueError: global batch fields differ between "
     "hosts: host 0 has {loss_mask: float32[8, 16], tokens: int32[8, 16]}, "
     "host 1 has {loss_mask: float32[8, 24], tokens: int32[8, 24]}")])
def test_different_batch_shapes_fail_on_both_hosts_fast(tmp_path, scenario,
                                                        want):
  # A generous limit for start-up on a loaded machine; the check itself is
  # timed from the later host's start of it to both hosts' exit.
  codes, outputs, _ = run_pair(scenario, tmp_path, timeout=300)
  ended = time.time()
  for i, (code, output) in enumerate(zip(codes, outputs)):
    assert code == 1, output[-3000:]
    error = tmp_path / f"error_{i}.txt"
    assert error.exists(), output[-3000:]
    assert want in error.read_text(), output[-3000:]
  started = max(float(t) for o in outputs
                for t in re.findall(r"CHECKING_AT (\d+\.\d+)", o))
  assert ended - started < 30  # No hang: a stuck collective never ends.


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


def test_host_file_is_the_path_itself_with_one_process():
  assert distributed.host_file("/w/filter/judge_cache.sqlite") == \
      "/w/filter/judge_cache.sqlite"


def test_long_messages_keep_a_digest():
  a, b = "x" * 10000 + "a", "x" * 10000 + "b"
  fa, fb = distributed._fit(a, 100), distributed._fit(b, 100)
  assert len(fa.encode()) <= 100 and fa != fb
  assert distributed._fit("short", 100) == "short"
