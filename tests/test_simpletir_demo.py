"""configs/simpletir_demo.py through `python -m swirl_jax.main` at smoke
size: the demo and its ablation arm (one module fixture, two runs), then
the evaluation job on what they trained."""

import json

import numpy as np
import pytest

from swirl_jax.simpletir import report

import testutil

_main = testutil.run_main


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
  """Workdirs trained by configs/simpletir_demo.py at smoke size: the demo
  (`on`) and its ablation arm (`off`: no void filter, reusing on's warm
  start, one iteration). Two runs, warm start and held-out evaluation
  included: about two minutes."""
  root = tmp_path_factory.mktemp("demo")
  on, off = root / "on", root / "off"
  # Nothing here pins a figure: compiled at XLA's lowest level.
  env = testutil.cpu_env(XLA_FLAGS=testutil.FAST_XLA_FLAGS)
  _main("--config=configs/simpletir_demo.py:smoke", f"--workdir={on}",
        env=env)
  _main("--config=configs/simpletir_demo.py:smoke,filter_void=False,"
        f"warmstart_from={on}", f"--workdir={off}",
        "--config.num_iterations=1", env=env)
  return on, off


def test_simpletir_demo_config_runs_and_reuses_its_warm_start(demo_runs):
  """configs/simpletir_demo.py at smoke size: warm start on ```python
  demonstrations, GRPO iterations, report; then the ablation arm reuses the
  first run's warm-started policy instead of training its own. (Its
  fixture's two runs take about two minutes.)"""
  on, off = demo_runs
  assert (on / "warmstart" / "hf" / "model.safetensors").exists()
  assert [r["iteration"] for r in report.iterations(on)] == [0, 1]
  assert (on / "report.md").exists() and (on / "reward.png").exists()
  # The held-out table: the base (the warm start) and the trained export,
  # each evaluated from its own weights, and their difference.
  held = json.loads((on / "heldout.json").read_text())
  assert set(held) == {"base", "trained", "trained − base"}
  assert held["trained − base"]["avg@2"] == pytest.approx(
      held["trained"]["avg@2"] - held["base"]["avg@2"])
  evals = json.loads((on / "eval" / "results.json").read_text())
  assert {v["policy"]: v["weights"] for v in evals.values()} == {
      "base": str(on / "warmstart" / "hf"), "trained": str(on / "hf")}
  assert "## Held out" in (on / "report.md").read_text()
  assert not (off / "warmstart").exists()
  rows = report.iterations(off)
  assert len(rows) == 1
  # Without the void filter, void rows stay in the loss (drop_zero_variance
  # is off at smoke size), so every rollout is in it.
  assert rows[0]["rows_in_loss"] == 8


_weights = testutil.load_weights


def test_simpletir_eval_evaluates_the_trained_policy(demo_runs, tmp_path):
  """Job simpletir_eval on a workdir the demo trained loads the trained
  export by default, names the weights in its log and JSON, and its
  metrics differ from the base (warm-started) policy's; with no weights it
  refuses in one line.

  The ablation arm's workdir: its rows are in the loss, so its optimizer
  steps ran (at smoke size every reward is 0, so what moved the weights is
  AdamW's decoupled weight decay, 0.01 as verl's; the base's weights and
  the trained ones differ, and so do the policies' log-probs)."""
  on, off = demo_runs
  trained, base = _weights(off / "hf"), _weights(on / "warmstart" / "hf")
  assert any(not np.array_equal(trained[k], base[k]) for k in base)
  args = ["--config=configs/simpletir_demo.py:smoke,filter_void=False,"
          f"warmstart_from={on}", f"--workdir={off}",
          "--config.job=simpletir_eval"]
  out = {}
  for policy, want in (("", off / "hf"), ("base", on / "warmstart" / "hf")):
    proc = _main(*args, f"--config.eval.policy={policy}")
    name = policy or "trained"
    summary = json.loads((off / "eval" / name / "summary.json").read_text())
    assert summary["policy"] == name and summary["weights"] == str(want)
    assert f"policy {name}, weights {want}" in proc.stderr
    assert f"weights {want}" in (off / "eval" / name /
                                 "results.md").read_text()
    out[name] = summary["results"]["synthetic_compute:test"]
    assert {"avg@2", "pass@2"} <= set(out[name])
  # Same prompts and seeds; other weights give other log-probs.
  assert out["trained"]["token_logp"] != out["base"]["token_logp"]
  both = json.loads((off / "eval" / "results.json").read_text())
  assert {k: v["weights"] for k, v in both.items()} == {
      "trained synthetic_compute:test": str(off / "hf"),
      "base synthetic_compute:test": str(on / "warmstart" / "hf")}
  table = (off / "eval" / "results.md").read_text()
  assert "| policy dataset | avg@2 | pass@2 |" in table
  assert f"policy base: weights {on / 'warmstart' / 'hf'}" in table
  empty = tmp_path / "untrained"
  for policy in ("", "base"):
    proc = _main("--config=configs/simpletir_demo.py:smoke",
                 f"--workdir={empty}", "--config.job=simpletir_eval",
                 f"--config.eval.policy={policy}", rc=2)
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and (
        "simpletir_train" in lines[-1] or "training job" in lines[-1]), lines
  assert not (empty / "eval").exists()
