"""The demo (the README's main command) at smoke size: every stage."""

import importlib.util
import json
import pathlib

from matplotlib import image as mpimg
import numpy as np

from swirl_jax.rollout.records import Trajectory, read_jsonl
from swirl_jax import warmstart
from swirl_jax.swirl import jobs
from swirl_jax.tasks import datasets

import testutil  # pylint: disable=g-bad-import-order

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
  # After a 4-step warm start the policy still writes 40 tokens of no step
  # and no answer (recorded from two runs); the full demo's figures are in
  # docs/results.md.
  want = dict(n=4.0, accuracy=0.0, f1=0.0, answered=0.0, steps=4.0,
              process_correctness=0.0, turns=1.0, response_len=40.0,
              void_rate=1.0, turn_cap_rate=0.0, overlong_rate=0.0,
              tool_use_rate=0.0, tool_solved_rate=0.0)
  assert results == {"base": want, "rl": want}
  # Equal figures, so what tells the policies apart: the eval loaded each
  # from its own export, and stage 2 trained the one it exported.
  assert json.loads((work / "eval" / "weights.json").read_text()) == {
      "base": str(hf), "rl": str(work / c.rl_name / "hf")}
  rows = testutil.read_jsonl(work / c.rl_name / "metrics.jsonl")
  assert [r["step"] for r in rows] == list(range(1, c.rl_iterations + 1))
  assert all(r["num_loss_rows"] > 0 for r in rows)
  # The smoke run's rewards are all 0 (no GOOD step), hence zero
  # gradients: the weights move exactly when some gradient was not 0.
  base, rl = testutil.load_weights(hf), testutil.load_weights(
      work / c.rl_name / "hf")
  assert sorted(base) == sorted(rl)
  moved = any(not np.array_equal(base[k], rl[k]) for k in base)
  assert moved == any(r["grad_norm"] > 0 for r in rows)
  text = (work / "report.md").read_text()
  assert "| base |" in text and "| rl |" in text and "Stage 2" in text
  # The plots at their figure sizes, 100 dpi: 6 x 3.5 in, and 6 in by 0.4 in
  # a bar (stage 1, the four filters, the two policies) + 1.2 in.
  assert mpimg.imread(work / "reward.png").shape == (960, 600, 4)
  assert mpimg.imread(work / "judged_steps.png").shape == (560, 600, 4)
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
