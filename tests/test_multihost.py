"""swirl_jax.distributed with two real jax.distributed processes on this CPU.

Each process of a pair has 4 CPU devices (8 global) and talks to the other
over gloo through a coordinator on a free localhost port; the reference is
one process with 8 devices running the same script (multihost_worker.py):
the helpers, then the jobs themselves (SimpleTIR, SWiRL, a killed stage 1).
"""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from swirl_jax import distributed
from swirl_jax import jsonl
from swirl_jax import sharding
from swirl_jax.swirl import stage1

import resume_checks
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
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO),
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  env.update({k: str(v) for k, v in extra.items()})
  return env


def _start_pair(scenario, out, **extra):
  address = f"127.0.0.1:{_free_port()}"
  return [subprocess.Popen(
      [sys.executable, str(WORKER), scenario, str(out)], cwd=REPO,
      env=_env(4, JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=2,
               JAX_PROCESS_ID=i, **extra),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
          for i in range(2)]


def _run_pair(scenario, out, timeout=60, **extra):
  """Both processes of a 2-host job; (returncodes, outputs, seconds)."""
  start = time.monotonic()
  procs = _start_pair(scenario, out, **extra)
  try:
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return [p.returncode for p in procs], outputs, time.monotonic() - start


def _run_single(scenario, out, timeout=60, **extra):
  r = subprocess.run([sys.executable, str(WORKER), scenario, str(out)],
                     cwd=REPO, env=_env(8, **extra), capture_output=True,
                     text=True, timeout=timeout)
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  path = out / "result_0.json"
  return json.loads(path.read_text()) if path.exists() else None


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
  codes, outputs, _ = _run_pair(scenario, tmp_path, timeout=300)
  ended = time.time()
  for i, (code, output) in enumerate(zip(codes, outputs)):
    assert code == 1, output[-3000:]
    error = tmp_path / f"error_{i}.txt"
    assert error.exists(), output[-3000:]
    assert want in error.read_text(), output[-3000:]
  started = max(float(t) for o in outputs
                for t in re.findall(r"CHECKING_AT (\d+\.\d+)", o))
  assert ended - started < 30  # No hang: a stuck collective never ends.


# The jobs: two hosts against one, in shared workdirs.


def _files(work: pathlib.Path) -> set[str]:
  """Output files; checkpoint and TensorBoard internals differ by design
  (orbax writes per-process parts), stage 1 shards by host."""
  skip = {"checkpoints", "tensorboard", "stage1", ".hosts_check"}
  return {str(p.relative_to(work)) for p in work.rglob("*") if p.is_file()
          and not skip & set(p.relative_to(work).parts)}


def _readable(work: pathlib.Path) -> None:
  for p in work.rglob("*.jsonl"):
    if "checkpoints" not in p.parts:
      jsonl.read(p)  # Strict: a torn or doubled write would fail here.
  for p in work.rglob("*.json"):
    if "checkpoints" not in p.parts:
      jsonl.read_json(p)


def _params(work: pathlib.Path) -> dict:
  return testutil.load_weights(work / "hf")


def _compare_params(one: dict, two: dict) -> None:
  assert set(one) == set(two)
  for k in one:
    np.testing.assert_allclose(two[k], one[k], atol=1e-5, err_msg=k)


def _losses(path: pathlib.Path) -> list[tuple[int, float]]:
  return [(r["step"], r["loss"]) for r in jsonl.read(path)]


def _jobs(scenario, tmp_path, timeout, **extra):
  """(one-process workdir, two-process workdir) after the same job."""
  one, two = tmp_path / "one", tmp_path / "two"
  codes, outputs, _ = _run_pair(scenario, two, timeout=timeout, **extra)
  assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
  _run_single(scenario, one, timeout=timeout, **extra)
  one, two = one / "work", two / "work"
  assert _files(one) == _files(two)
  _readable(two)
  return one, two


def test_simpletir_on_two_hosts_matches_one(tmp_path):
  """Two GRPO iterations with the sandbox: each host rolls out its half of
  each iteration's (task, sample) pairs; the same trajectories, losses and
  updated params as one process with the same 8 devices."""
  one, two = _jobs("simpletir", tmp_path, timeout=300)
  for it in (0, 1):
    name = f"rollouts/iter_{it:06d}.jsonl"
    rows = jsonl.read(two / name)
    assert rows == jsonl.read(one / name)  # Same order, each pair once.
    pairs = [(r["task_id"], r["sample_index"]) for r in rows]
    assert len(pairs) == len(set(pairs)) == 8
  # Rewards vary in each group (the scripted turns ran in the sandbox).
  assert {r["reward"] for r in rows} == {0.0, 1.0}
  l1, l2 = _losses(one / "metrics.jsonl"), _losses(two / "metrics.jsonl")
  assert [s for s, _ in l2] == [s for s, _ in l1] == [1, 2, 3, 4]
  np.testing.assert_allclose([l for _, l in l2], [l for _, l in l1],
                             atol=1e-5)
  _compare_params(_params(one), _params(two))
  assert jsonl.read_json(two / "done.json") == {"iterations": 2}


@pytest.mark.parametrize("setting", [dict(STALENESS=1),
                                     dict(OVERSAMPLE=3)])
def test_simpletir_async_or_oversampled_on_two_hosts_matches_one(
    tmp_path, setting):
  """Staleness 1 (each host's rollouts sampled a version behind in a
  thread of its own, which exchanges nothing), or 3x oversampling with
  failing groups among the kept ones (each host keeps another number of
  rows): the same rollouts files, records and updated params as one
  process with the same 8 devices. Two jobs each: minutes."""
  one, two = _jobs("simpletir", tmp_path, timeout=600, **setting)
  for it in (0, 1):
    name = f"rollouts/iter_{it:06d}.jsonl"
    assert jsonl.read(two / name) == jsonl.read(one / name)
  recs = [jsonl.read(w / "metrics.jsonl") for w in (one, two)]
  resume_checks.assert_same_records(recs[1], recs[0])
  if "STALENESS" in setting:
    assert {r["meta"]["policy_version"]
            for r in jsonl.read(two / "rollouts/iter_000001.jsonl")} == {0}
  else:  # 6 groups drawn; kept up to the 2nd passing one.
    assert [r["groups_run"] for r in recs[1]] == [6, 6, 5, 5]
    assert len(jsonl.read(two / "rollouts/iter_000001.jsonl")) == 5 * 4
  _compare_params(_params(one), _params(two))


def test_simpletir_hosts_exchange_no_trajectories(tmp_path):
  """One SimpleTIR iteration on two hosts, with turns of ~64 and of ~256
  tokens: each host keeps the trajectories it rolled out, so the bytes it
  hands to swirl_jax.distributed's exchanges (every host-to-host message
  of the job: row counts, rewards and flags, metrics, checks) are the same
  for both lengths, and so is every read of device data into its memory
  (the trainer's log-probs and the mismatch stay on the devices: only
  scalars and row-sized arrays come back); the trainer's global batch,
  built from each host's rows, equals one process's. Three jobs of
  several processes: minutes."""
  got = {}
  for n in (64, 256):
    out = tmp_path / f"two{n}"
    codes, outputs, _ = _run_pair("simpletir_bytes", out, timeout=600,
                                  RESPONSE_TOKENS=n)
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    got[n] = [json.loads((out / f"result_{i}.json").read_text())
              for i in (0, 1)]
  lengths = [got[n][0]["response_len"] for n in (64, 256)]
  assert 40 < lengths[0] < 120 < 200 < lengths[1], lengths
  for host in (0, 1):
    assert got[64][host]["bytes"] == got[256][host]["bytes"]
    assert got[64][host]["calls"] == got[256][host]["calls"]
    assert got[64][host]["bytes"] < 64 << 10  # Fixed-size checks, mostly.
    reads = [sorted(got[n][host]["reads"]) for n in (64, 256)]
    assert reads[0] == reads[1] and reads[0]  # Metrics, at least.
    # The largest: a fixed-size check message gathered from both hosts.
    assert max(reads[1]) <= 2 * distributed._MESSAGE_BYTES  # pylint: disable=protected-access
  one = _run_single("simpletir_bytes", tmp_path / "one", timeout=600,
                    RESPONSE_TOKENS=256)
  assert len(one["batch"]["tokens"][0]) > 256
  for host in (0, 1):
    assert got[256][host]["batch"] == one["batch"]


@pytest.mark.slow
def test_swirl_stages_on_two_hosts_match_one(tmp_path):
  """SWiRL stage 1 (tiny model) -> filter -> stage 2 (with the KL term's
  reference log-probs): each host generates half of stage 1's pairs into
  its own shard, judges half of the filter's steps and samples half of
  each stage 2 step's states; the filter's files and stage 2's losses and
  params equal one process's."""
  one, two = _jobs("swirl", tmp_path, timeout=400)
  t1 = stage1.read_trajectories(str(one / "stage1"))
  t2 = stage1.read_trajectories(str(two / "stage1"))
  assert sorted(t.id for t in t2) == sorted(t.id for t in t1)
  assert len(t2) == len({t.id for t in t2}) == 6
  assert {t.id: t for t in t2} == {t.id: t for t in t1}
  shards = sorted(p.name for p in (two / "stage1").iterdir())
  assert shards == ["shard_00000-host000.jsonl", "shard_00000-host001.jsonl"]
  assert [len(jsonl.read(two / "stage1" / s)) for s in shards] == [3, 3]
  for name in ("units.jsonl", "units_none.jsonl", "report.json"):
    assert (two / "filter" / name).read_bytes() == \
        (one / "filter" / name).read_bytes()
  l1, l2 = _losses(one / "rl" / "metrics.jsonl"), _losses(
      two / "rl" / "metrics.jsonl")
  assert len(l2) == len(l1) == 2
  np.testing.assert_allclose([l for _, l in l2], [l for _, l in l1],
                             atol=1e-5)
  _compare_params(_params(one / "rl"), _params(two / "rl"))


def _shard_lines(directory: pathlib.Path) -> list[dict]:
  return testutil.shard_rows(directory, torn_tail=True)


def test_stage1_host_killed_then_rerun_has_each_pair_once(tmp_path):
  """SIGKILL of host 1 mid-run (after it wrote two batches), then both
  rerun: every (question, sample) once, equal to one uninterrupted process,
  and what the survivor wrote is kept."""
  two = tmp_path / "two"
  procs = _start_pair("stage1", two, PAUSE_S=1)
  mine = two / "work" / "stage1" / "shard_00000-host001.jsonl"
  deadline = time.monotonic() + 120
  try:
    while time.monotonic() < deadline and procs[1].poll() is None:
      if mine.exists() and mine.read_bytes().count(b"\n") >= 2:
        break
      time.sleep(0.05)
    assert procs[1].poll() is None, procs[1].communicate()[0][-3000:]
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    try:  # The survivor's next gather has no peer: it fails, or is stopped.
      procs[0].wait(timeout=30)
    except subprocess.TimeoutExpired:
      procs[0].kill()
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
      p.communicate()
  before = _shard_lines(two / "work" / "stage1")
  assert 4 <= len(before) < 12, len(before)  # Killed mid-run.
  codes, outputs, _ = _run_pair("stage1", two, timeout=120)
  assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
  after = _shard_lines(two / "work" / "stage1")
  assert all(r in after for r in before)  # Nothing lost.
  ids = [(r["task_id"], r["sample_index"]) for r in after]
  assert len(ids) == len(set(ids)) == 12
  _run_single("stage1", tmp_path / "one", timeout=120)
  one = _shard_lines(tmp_path / "one" / "work" / "stage1")
  key = lambda r: (r["task_id"], r["sample_index"])
  assert sorted(after, key=key) == sorted(one, key=key)


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
