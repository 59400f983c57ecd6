"""Exactly-once records on resume: kill -9 at seeded random points of the
SWiRL pipeline (stage 1, stage 2, evaluation), rerun, compare with an
uninterrupted run; and the rewind every trainer runs at start."""

import json

from swirl_jax import jsonl
from swirl_jax.training import metrics as metrics_lib

import resume_checks as checks
import testutil


def _trajectories(stage1_dir):
  return sorted(testutil.shard_rows(stage1_dir),
                key=lambda r: (r["task_id"], r["sample_index"]))


def test_swirl_pipeline_killed_and_resumed_equals_an_uninterrupted_run(
    tmp_path):
  cache, ref, work = tmp_path / "cache", tmp_path / "ref", tmp_path / "work"
  counts = checks.reference("swirl", ref, cache)
  plan = checks.kill_plan(counts, ("stage1", "rl", "rl", "eval"), seed=31)
  checks.kill_and_resume("swirl", work, cache, plan)
  # Stage 1: every (question, sample) once, as generated uninterrupted.
  assert _trajectories(work / "stage1") == _trajectories(ref / "stage1")
  assert (checks.records(work / "filter" / "units.jsonl") ==
          checks.records(ref / "filter" / "units.jsonl"))
  # Stage 2: each step's record once, equal; TensorBoard the same.
  got = checks.records(work / "rl" / "metrics.jsonl")
  checks.assert_same_records(got, checks.records(ref / "rl" /
                                                 "metrics.jsonl"))
  assert [r["step"] for r in got] == list(range(1, len(got) + 1))
  checks.assert_tensorboard_matches(work / "rl")
  checks.assert_tensorboard_matches(ref / "rl")
  # Evaluation: the same results and trajectories.
  for name in ("results.json", "trajectories_base.jsonl",
               "trajectories_rl.jsonl"):
    assert ((work / "eval" / name).read_text() ==
            (ref / "eval" / name).read_text()), name


def _write(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_rewind_keeps_the_iterations_a_checkpoint_covers(tmp_path):
  _write(tmp_path / "metrics.jsonl", [
      dict(step=1, iteration=0), dict(step=2, iteration=0),
      dict(step=2, iteration=1, skipped_batch=1.0),  # No update: same step.
      dict(step=3, iteration=2)])
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 4, "iter')  # Torn by a kill.
  for it in range(3):
    _write(tmp_path / "rollouts" / f"iter_{it:06d}.jsonl", [{"it": it}])
  files = (metrics_lib.METRICS,
           metrics_lib.RecordFile("rollouts/iter_*.jsonl", per_file=True))
  # A checkpoint at step 2 that had consumed 1 batch: iteration 1's record
  # (at step 2 too) is redone, so it goes.
  assert metrics_lib.rewind(tmp_path, 1, step=2, files=files) == 4
  assert checks.records(tmp_path / "metrics.jsonl") == [
      dict(step=1, iteration=0), dict(step=2, iteration=0)]
  assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == [
      "iter_000000.jsonl"]
  # Records without an iteration (older runs) go by step.
  _write(tmp_path / "old" / "metrics.jsonl", [dict(step=s) for s in (1, 2)])
  metrics_lib.rewind(tmp_path / "old", 5, step=1)
  assert checks.records(tmp_path / "old" / "metrics.jsonl") == [dict(step=1)]
  assert metrics_lib.rewind(tmp_path / "missing", 0) == 0


def test_jsonl_rewind_rewrites_only_when_something_goes(tmp_path):
  path = tmp_path / "r.jsonl"
  jsonl.append(path, [{"i": i} for i in range(3)])
  before = path.stat().st_ino
  assert jsonl.rewind(path, lambda r: True) == 0
  assert path.stat().st_ino == before  # Untouched.
  assert jsonl.rewind(path, lambda r: r["i"] < 2) == 1
  assert jsonl.read(path) == [{"i": 0}, {"i": 1}]


def test_a_writer_replays_metrics_into_one_fresh_events_file(tmp_path):
  w = metrics_lib.MetricWriter(str(tmp_path), progress=False, enabled=True)
  for s in (1, 2, 3):
    w.write(s, {"loss": float(s), "iteration": float(s - 1)},
            iteration=s - 1)
  # Killed here: no close. A resume from a checkpoint of 2 batches.
  w = metrics_lib.MetricWriter(str(tmp_path), initial_step=2, done=2,
                               progress=False, enabled=True)
  w.write(3, {"loss": 30.0}, iteration=2)
  w.close()
  rows = checks.records(tmp_path / "metrics.jsonl")
  assert [(r["step"], r["iteration"], r["loss"]) for r in rows] == [
      (1, 0, 1.0), (2, 1, 2.0), (3, 2, 30.0)]
  checks.assert_tensorboard_matches(tmp_path)
