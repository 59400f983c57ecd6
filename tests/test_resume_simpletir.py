"""SimpleTIR training killed -9 at seeded random points, and (staleness 1
and 2) at the queue's and the checkpoints' writes, and rerun: every
iteration's rollouts and metrics once, TensorBoard the same, and the same
records as an uninterrupted run."""

import pytest

import resume_checks as checks


def test_simpletir_killed_and_resumed_equals_an_uninterrupted_run(tmp_path):
  cache, ref, work = tmp_path / "cache", tmp_path / "ref", tmp_path / "work"
  counts = checks.reference("simpletir", ref, cache)
  plan = checks.kill_plan(counts, ("train",) * 3, seed=31)
  checks.kill_and_resume("simpletir", work, cache, plan)
  got = checks.records(work / "metrics.jsonl")
  checks.assert_same_records(got, checks.records(ref / "metrics.jsonl"))
  # Iteration 2 is all void: logged without an update, at step 4 again.
  assert [(r["step"], r["iteration"]) for r in got] == [
      (1, 0), (2, 0), (3, 1), (4, 1), (4, 2), (5, 3), (6, 3), (7, 4), (8, 4)]
  checks.assert_tensorboard_matches(work)
  checks.assert_tensorboard_matches(ref)
  names = sorted(p.name for p in (ref / "rollouts").iterdir())
  assert names == [f"iter_{i:06d}.jsonl" for i in range(5)]
  assert sorted(p.name for p in (work / "rollouts").iterdir()) == names
  for name in names:
    assert ((work / "rollouts" / name).read_text() ==
            (ref / "rollouts" / name).read_text()), name
  assert (work / "report.md").read_text().replace(str(work), "") == \
      (ref / "report.md").read_text().replace(str(ref), "")


# Each named point once before and once after a write, over the two
# stalenesses, in an order in which every kill lands on the run resumed
# from the one before: the queue's while no checkpoint is on disk yet (a
# resumed run then samples from iteration 0 again, loading what the queue
# holds), then the first checkpoint's (before it is written at staleness
# 2, once it is at staleness 1). Staleness 1 also dies at a seeded random
# write. (Both stalenesses killed at all four points ran four more jobs,
# about 2.5 worker-minutes, for kills the other staleness makes.)
POINTS = {1: ("queue:2:before", "checkpoint:1:after"),
          2: ("queue:2:after", "checkpoint:1:before")}


@pytest.mark.parametrize("scenario, staleness", [("simpletir_async", 1),
                                                 ("simpletir_async2", 2)])
def test_simpletir_async_killed_and_resumed_equals_an_uninterrupted_run(
    tmp_path, scenario, staleness):
  """Staleness 1 and 2 (rollouts sampled k versions behind, in a thread,
  beside the update; validation every 2 iterations), killed -9 before or
  after a queue write (in the generator's thread) and before or after a
  checkpoint (`POINTS`; staleness 1: then at a seeded random write), each
  time rerun: every record once (validations too), the same rollouts
  files (each stamped with its policy version) and the same final
  parameters as an uninterrupted run. Four or five runs of the job each:
  over a minute on 2 idle cores."""
  cache, ref, work = tmp_path / "cache", tmp_path / "ref", tmp_path / "work"
  counts = checks.reference(scenario, ref, cache)
  assert counts["queue"] == 5 and counts["checkpoint"] >= 2, counts
  plan = list(POINTS[staleness])
  if staleness == 1:  # And any write, at one seeded point.
    plan += checks.kill_plan(counts, ("train",), seed=37)
  checks.kill_and_resume(scenario, work, cache, plan)
  got = checks.records(work / "metrics.jsonl")
  checks.assert_same_records(got, checks.records(ref / "metrics.jsonl"))
  vals = [r["iteration"] for r in got if "val_iteration" in r]
  assert vals == [0, 2, 4, 5]  # Every 2, and after the last: once each.
  checks.assert_tensorboard_matches(work)
  names = sorted(p.name for p in (ref / "rollouts").iterdir())
  assert names == [f"iter_{i:06d}.jsonl" for i in range(5)]
  for name in names:
    assert ((work / "rollouts" / name).read_text() ==
            (ref / "rollouts" / name).read_text()), name
  versions = [{r["meta"]["policy_version"]
               for r in checks.records(ref / "rollouts" / name)}
              for name in names]
  # Iteration i: version max(0, i - k).
  assert versions == [{max(0, i - staleness)} for i in range(5)]
  assert not (work / "queue").exists()  # Gone with the finished run.
  checks.assert_same_params(work / "hf", ref / "hf")
