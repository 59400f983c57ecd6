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
