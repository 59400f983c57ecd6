"""SimpleTIR on two hosts against one process with the same 8 devices
(tests/multihost_launch.py): two GRPO iterations with scripted turns
through the sandbox, plain, at staleness 1 and with 3x oversampling. One
launch of the pair and one of the single process run the three jobs in
turn (multihost_worker.py's `simpletir` with SETTINGS), each in its own
workdirs; a test checks each.
"""

import numpy as np
import pytest

from swirl_jax import jsonl

import multihost_launch as launch
import resume_checks


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
  """setting -> (one-process workdir, two-process workdir)."""
  names = ("plain", "staleness", "oversample")
  return launch.jobs("simpletir", tmp_path_factory.mktemp("simpletir"),
                     timeout=900, workdirs=[f"{n}/work" for n in names],
                     SETTINGS=",".join(names))


def test_simpletir_on_two_hosts_matches_one(settings):
  """Two GRPO iterations with the sandbox: each host rolls out its half of
  each iteration's (task, sample) pairs; the same trajectories, losses and
  updated params as one process with the same 8 devices. (The fixture's
  launches run all three settings: minutes.)"""
  one, two = settings["plain/work"]
  for it in (0, 1):
    name = f"rollouts/iter_{it:06d}.jsonl"
    rows = jsonl.read(two / name)
    assert rows == jsonl.read(one / name)  # Same order, each pair once.
    pairs = [(r["task_id"], r["sample_index"]) for r in rows]
    assert len(pairs) == len(set(pairs)) == 8
  # Rewards vary in each group (the scripted turns ran in the sandbox).
  assert {r["reward"] for r in rows} == {0.0, 1.0}
  l1 = launch.losses(one / "metrics.jsonl")
  l2 = launch.losses(two / "metrics.jsonl")
  assert [s for s, _ in l2] == [s for s, _ in l1] == [1, 2, 3, 4]
  np.testing.assert_allclose([l for _, l in l2], [l for _, l in l1],
                             atol=1e-5)
  launch.compare_params(launch.params(one), launch.params(two))
  assert jsonl.read_json(two / "done.json") == {"iterations": 2}


@pytest.mark.parametrize("setting", ["staleness", "oversample"])
def test_simpletir_async_or_oversampled_on_two_hosts_matches_one(
    settings, setting):
  """Staleness 1 (each host's rollouts sampled a version behind in a
  thread of its own, which exchanges nothing), or 3x oversampling with
  failing groups among the kept ones (each host keeps another number of
  rows): the same rollouts files, records and updated params as one
  process with the same 8 devices."""
  one, two = settings[f"{setting}/work"]
  for it in (0, 1):
    name = f"rollouts/iter_{it:06d}.jsonl"
    assert jsonl.read(two / name) == jsonl.read(one / name)
  recs = [jsonl.read(w / "metrics.jsonl") for w in (one, two)]
  resume_checks.assert_same_records(recs[1], recs[0])
  if setting == "staleness":
    assert {r["meta"]["policy_version"]
            for r in jsonl.read(two / "rollouts/iter_000001.jsonl")} == {0}
  else:  # 6 groups drawn; kept up to the 2nd passing one.
    assert [r["groups_run"] for r in recs[1]] == [6, 6, 5, 5]
    assert len(jsonl.read(two / "rollouts/iter_000001.jsonl")) == 5 * 4
  launch.compare_params(launch.params(one), launch.params(two))
