"""The demo (the README's main command) at smoke size: every stage."""

import importlib.util
import json
import pathlib

from swirl_jax.rollout.records import Trajectory, read_jsonl
from swirl_jax import warmstart
from swirl_jax.swirl import jobs
from swirl_jax.tasks import datasets

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _demo_config(arg):
  spec = importlib.util.spec_from_file_location("demo", ROOT / "configs" /
                                                "demo.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(arg)


def test_demo_smoke(demo_smoke_run):
  work, c = demo_smoke_run, _demo_config("smoke")
  hf = warmstart.hf_dir(work)
  assert (hf / "config.json").exists() and (hf / "tokenizer.json").exists()
  assert (work / "warmstart" / "tokenizer" / "tokenizer.json").exists()
  results = json.loads((work / "eval" / "results.json").read_text())
  assert set(results) == {"base", "rl"}
  for r in results.values():
    assert 0.0 <= r["accuracy"] <= 1.0 and "process_correctness" in r
  text = (work / "report.md").read_text()
  assert "| base |" in text and "| rl |" in text and "Stage 2" in text
  assert (work / "reward.png").stat().st_size > 0
  assert (work / "judged_steps.png").stat().st_size > 0
  # Held out: no evaluation question was trained on.
  evals = {t.question for t in datasets.load_tasks(
      c.data.eval, c.data.eval_split, None, c.data.eval_limit)}
  stage1 = [t for p in sorted((work / "stage1").glob("*.jsonl"))
            for t in read_jsonl(str(p), Trajectory)]
  assert stage1 and not any(q in t.prompt for t in stage1 for q in evals)
  # Every later stage loaded the warm-started policy.
  assert warmstart.model_config(c, work).checkpoint == str(hf)


def test_finished_warm_start_is_not_redone(demo_smoke_run):
  c = _demo_config("smoke")
  hf = warmstart.hf_dir(demo_smoke_run)
  weights = hf / "model.safetensors"
  before = weights.stat().st_mtime_ns
  c.stages = ("warmstart",)
  jobs.run_pipeline(c, str(demo_smoke_run))
  assert weights.stat().st_mtime_ns == before
