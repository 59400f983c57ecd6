"""What SimpleTIR's hosts send each other and read from their devices
(tests/multihost_launch.py, multihost_worker.py's `simpletir_bytes`): the
same for turns of ~64 and of ~256 tokens, so no trajectory crosses."""

import json

from swirl_jax import distributed

import multihost_launch as launch


def test_simpletir_hosts_exchange_no_trajectories(tmp_path):
  """One SimpleTIR iteration on two hosts, with turns of ~64 and of ~256
  tokens (one after the other in the same pair of processes): each host
  keeps the trajectories it rolled out, so the bytes it hands to
  swirl_jax.distributed's exchanges (every host-to-host message of the
  job: row counts, rewards and flags, metrics, checks) are the same for
  both lengths, and so is every read of device data into its memory (the
  trainer's log-probs and the mismatch stay on the devices: only scalars
  and row-sized arrays come back); the trainer's global batch, built from
  each host's rows, equals one process's. A pair and a single process,
  three iterations in all: minutes."""
  out = tmp_path / "two"
  codes, outputs, _ = launch.run_pair(
      "simpletir_bytes", out, timeout=600,
      RESPONSE_TOKENS="64,256")
  assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
  hosts = [json.loads((out / f"result_{i}.json").read_text())
           for i in (0, 1)]
  got = {n: [h[str(n)] for h in hosts] for n in (64, 256)}
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
  one = launch.run_single("simpletir_bytes", tmp_path / "one", timeout=600,
                          RESPONSE_TOKENS="256")["256"]
  assert len(one["batch"]["tokens"][0]) > 256
  for host in (0, 1):
    assert got[256][host]["batch"] == one["batch"]
