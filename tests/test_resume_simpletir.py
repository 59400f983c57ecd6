"""SimpleTIR training killed -9 at seeded random points and rerun: every
iteration's rollouts and metrics once, TensorBoard the same, and the same
records as an uninterrupted run."""

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


def test_simpletir_async_killed_and_resumed_equals_an_uninterrupted_run(
    tmp_path):
  """Staleness 1 (rollouts sampled a version behind, in a thread, beside
  the update; validation every 2 iterations): killed -9 at seeded points
  (the generator thread's queue writes among them) and rerun, every
  record once (validations too), the same rollouts files (each stamped
  with its policy version) and the same final parameters as an
  uninterrupted run. Several runs of the job: over a minute."""
  cache, ref, work = tmp_path / "cache", tmp_path / "ref", tmp_path / "work"
  counts = checks.reference("simpletir_async", ref, cache)
  plan = checks.kill_plan(counts, ("train",) * 3, seed=37)
  checks.kill_and_resume("simpletir_async", work, cache, plan)
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
  assert versions == [{0}, {0}, {1}, {2}, {3}]  # Iteration i: i - 1.
  assert not (work / "queue").exists()  # Gone with the finished run.
  checks.assert_same_params(work / "hf", ref / "hf")
