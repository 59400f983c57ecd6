"""SimpleTIR: void turns, GRPO rows, and training steps with the sandbox."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from swirl_jax import config_lib
from swirl_jax.models import loading
from swirl_jax.rollout.records import Trajectory, Turn
from swirl_jax.simpletir import grpo, report, void
from swirl_jax.training import step as step_lib

import resume_checks  # pylint: disable=g-bad-import-order
import simpletir_script  # pylint: disable=g-bad-import-order
import testutil  # pylint: disable=g-bad-import-order

# SimpleTIR (arXiv 2509.02479): a void turn has neither a complete code
# block nor a final answer; an unclosed (truncated) block is void.
VOID_TABLE = [
    ("Let me think about it more.", True),
    ("```python\nprint(1+1)\n```\n", False),
    ("```py\nx = 2\nprint(x)\n```", False),
    ("```python\nprint(1+1", True),  # Truncated block.
    ("The answer is \\boxed{4}.", False),
    ("So final_answer(4) it is.", False),
    ("```python\nfinal_answer(4)\n```", False),
    ("", True),
    ("```\nprint(3)\n```", False),  # A bare fence is Python (SimpleTIR).
    ("\\boxed{", True),  # Unbalanced: no answer.
]


@pytest.mark.parametrize("text,want", VOID_TABLE)
def test_void_turn_table(text, want):
  assert void.is_void_turn(text) == want


def _traj(i, reward, turns):
  return Trajectory(task_id=f"q{i // 4}", sample_index=i % 4, reward=reward,
                    prompt_ids=[1, 2, 3],
                    turns=[Turn(text=t, action_ids=[5 + i, 6],
                                action_logprobs=[-1.0, -1.0]) for t in turns])


def test_void_rows_keep_group_statistics_but_leave_the_loss():
  ok, bad = "```python\nprint(1)\n```", "```python\nprint(1"
  trajs = [_traj(0, 1.0, [ok]), _traj(1, 0.0, [bad]), _traj(2, 0.0, [ok]),
           _traj(3, 1.0, [ok])]
  g = grpo.GroupConfig(group_size=4, accuracy_band=None)
  rows, adv, stats = grpo.select_rows(grpo.figures(trajs, g), g)
  assert rows.tolist() == [0, 2, 3] and stats["void_rate"] == 0.25
  # Mean 0.5 and std over all four (void included) set the advantages.
  r = np.array([1.0, 0.0, 0.0, 1.0])
  want = (r - r.mean()) / r.std(ddof=1)
  np.testing.assert_allclose(adv, want[[0, 2, 3]], rtol=1e-5)
  # Without the void row in the statistics they would differ.
  r3 = r[[0, 2, 3]]
  assert not np.allclose(adv, (r3 - r3.mean()) / r3.std(ddof=1))
  g_off = grpo.GroupConfig(group_size=4, accuracy_band=None,
                           filter_void=False)
  assert grpo.select_rows(grpo.figures(trajs, g_off), g_off)[0].tolist() \
      == [0, 1, 2, 3]


def test_masked_void_trajectory_contributes_zero_gradient():
  """A void row's tokens are masked: its content cannot move the gradient."""
  cfg, params, _ = loading.load_policy(config_lib.model_config("tiny", ""))
  ok, bad = "```python\nprint(1)\n```", "```python\nprint(1"
  trajs = [_traj(0, 1.0, [ok]), _traj(1, 0.0, [bad]), _traj(2, 0.0, [ok]),
           _traj(3, 1.0, [ok])]
  g = grpo.GroupConfig(group_size=4, accuracy_band=None)
  loss_cfg = step_lib.default_loss_config()

  def grad_with(void_tokens):
    trajs[1].turns[0].action_ids = void_tokens
    rows, adv, _ = grpo.select_rows(grpo.figures(trajs, g), g)
    # Keep the void row in the batch, masked, to show it adds nothing.
    seqs = [t.token_sequence() for t in trajs]
    keep = np.isin(np.arange(4), rows)
    seqs = [(a, m * k, lp) for (a, m, lp), k in zip(seqs, keep)]
    full_adv = np.zeros(4, np.float32)
    full_adv[rows] = adv
    from swirl_jax.rollout import batching
    b = batching.collate(seqs, full_adv)
    b = {k: jnp.asarray(v) for k, v in b.items()}
    return grad(params, b)

  # One program for both batches (their shapes are the same).
  grad = jax.jit(jax.grad(
      lambda p, b: step_lib.policy_loss(p, cfg, loss_cfg, b)[0]))

  g1, g2 = grad_with([100, 101]), grad_with([7000, 9000])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-7),
               g1, g2)


# Grad norms of the 6 updates, recorded from two identical runs each. The
# scripted sampler's log-probs are not the model's: with them as the old
# log-probs (old_logprobs='sampler') every ratio is far outside the clip
# and the gradient is tiny; recomputed by the trainer (SimpleTIR's code)
# the first mini-batch of each iteration is on-policy (ratio 1).
_GRAD_NORMS = {
    "sampler": [5.951700222794898e-05, 0.00010798522271215916,
                0.000118911630124785, 4.4710355723509565e-05,
                7.2482529503759e-05, 7.351527165155858e-05],
    "trainer": [1.032475233078003, 2.46901273727417, 2.5940394401550293,
                1.7162083387374878, 1.4618982076644897, 1.5273668766021729],
}


# What the synchronous loop wrote, before it was split into stages, for
# the scripted run with the split gradient norms each iteration
# (void_grad_every=1), with the same config and seeds.
SYNC_GOLDEN = pathlib.Path(__file__).parent / "data" / "simpletir_sync"


@pytest.mark.parametrize("old_logprobs", ["trainer", "sampler"])
def test_grpo_steps_with_real_sandbox(tmp_path, monkeypatch, old_logprobs):
  """Several GRPO iterations; every code block runs in the sandbox.

  Turns are replayed (simpletir_script.py: a random tiny model rarely
  closes a code block), so rewards vary within each group: right, void,
  wrong, right-after-output. With the trainer's old log-probs (the
  default) the run also logs the split gradient norms each iteration,
  and is the staleness-0 check of the staged loop
  (swirl_jax/simpletir/pipeline.py): its metrics.jsonl and rollouts
  files equal, record for record, those the synchronous loop wrote
  (tests/data/simpletir_sync), and it keeps no queue.
  """
  from swirl_jax.tools import sandbox  # pylint: disable=g-import-not-at-top
  c = simpletir_script.config(vocab="bundled")  # The figures' vocabulary.
  c.old_logprobs = old_logprobs
  if old_logprobs == "trainer":
    c.void_grad_every = 1
  ran = []
  real = sandbox.Sandbox.run_batch
  monkeypatch.setattr(sandbox.Sandbox, "run_batch", lambda self, s: (
      ran.extend(s), real(self, s))[1])
  simpletir_script.run(c, tmp_path, monkeypatch.setattr)
  assert any("final_answer" in s for s in ran)
  lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  # 3 iterations x (2 prompts x 4 rows // mini-batch 4) steps.
  np.testing.assert_allclose([l["grad_norm"] for l in lines],
                             _GRAD_NORMS[old_logprobs], rtol=2e-4)
  first = [l["ratio_mean"] for l in lines[::2]]  # Each iteration's first.
  if old_logprobs == "trainer":
    np.testing.assert_allclose(first, 1.0, atol=1e-5)
  else:
    assert all(abs(r - 1) > 0.5 for r in first)
  for l in lines:
    assert l["void_rate"] == pytest.approx(0.25)
    assert l["reward"] == pytest.approx(0.5)
  assert (tmp_path / "rollouts" / "iter_000002.jsonl").exists()
  rows = report.iterations(tmp_path)  # The run's own report reads them.
  assert [r["iteration"] for r in rows] == list(range(c.num_iterations))
  assert all(r["reward"] == pytest.approx(0.5) and r["updates"] >= 1
             for r in rows)
  assert "| 0 | 0.500 | 0.250 |" in (tmp_path / "report.md").read_text()
  if old_logprobs == "trainer":
    resume_checks.assert_same_records(
        testutil.read_jsonl(tmp_path / "metrics.jsonl"),
        testutil.read_jsonl(SYNC_GOLDEN / "metrics.jsonl"))
    for it in range(3):
      name = f"rollouts/iter_{it:06d}.jsonl"
      assert testutil.read_jsonl(tmp_path / name) == \
          testutil.read_jsonl(SYNC_GOLDEN / name), name
    assert not (tmp_path / "queue").exists()


def _metrics(path, lines):
  path.mkdir()
  (path / "metrics.jsonl").write_text(
      "".join(json.dumps(l) + "\n" for l in lines))
  return path


def test_validation_records_once_on_a_resume_and_a_rerun(tmp_path,
                                                        monkeypatch):
  """Validation every 2 iterations (before the first, at 2, after the
  last; scripted turns): each record carries its iteration, so a run
  stopped after 2 iterations and resumed to 3 (a resume at a multiple of
  `every`), or a finished run run again, writes each once: the same
  records as one straight run. Several runs: over a minute."""
  c = simpletir_script.config()
  c.validation.update(every=2, k=2, limit=2)
  read = lambda w: [json.loads(l) for l in open(w / "metrics.jsonl")]
  simpletir_script.run(c, tmp_path / "straight", monkeypatch.setattr)
  want = read(tmp_path / "straight")
  assert [(r["iteration"], r["val_iteration"]) for r in want
          if "val_iteration" in r] == [(0, 0.0), (2, 2.0), (3, 3.0)]
  assert [r["iteration"] for r in report.iterations(
      tmp_path / "straight")] == [0, 1, 2]
  simpletir_script.run(c, tmp_path / "straight", monkeypatch.setattr)
  assert read(tmp_path / "straight") == want  # A rerun of a finished run.
  c.num_iterations = 2
  simpletir_script.run(c, tmp_path / "resumed", monkeypatch.setattr)
  c.num_iterations = 3
  simpletir_script.run(c, tmp_path / "resumed", monkeypatch.setattr)
  assert read(tmp_path / "resumed") == want


def test_oversampled_rollouts_are_scored_once(tmp_path, monkeypatch):
  """2x oversampling, one host (scripted turns: every group passes): each
  iteration's 4 groups all run (32 cache rows) and each rollout is
  checked once; the first 2 groups are kept, in the statistics and the
  rollouts file alike."""
  from swirl_jax.tasks import checkers  # pylint: disable=g-import-not-at-top
  c = simpletir_script.config()
  c.oversample = 2.0
  checked, real = [], checkers.check_batch
  monkeypatch.setattr(checkers, "check_batch", lambda ts, answers: (
      checked.extend(answers), real(ts, answers))[1])
  simpletir_script.run(c, tmp_path, monkeypatch.setattr)
  assert len(checked) == 3 * 4 * 4
  for r in (json.loads(l) for l in open(tmp_path / "metrics.jsonl")):
    assert r["groups_run"] == 2 and r["reward"] == 0.5
  for it in range(3):
    rows = open(tmp_path / "rollouts" / f"iter_{it:06d}.jsonl").readlines()
    assert len(rows) == 2 * 4


def test_report_summarises_iterations_and_compares_runs(tmp_path):
  roll = dict(void_rate=0.5, turns=2.0, turn_cap_rate=0.0,
              response_len=10.0, rows_in_loss=4.0)
  on = _metrics(tmp_path / "on", [
      dict(step=1, iteration=0, reward=0.25, grad_norm=1.0, ratio_max=1.5,
           **roll),
      dict(step=2, iteration=0, reward=0.25, grad_norm=3.0, ratio_max=2.5,
           **roll),
      # Every group filtered: logged without an update.
      dict(step=2, iteration=1, reward=0.0, skipped_batch=1.0, **roll)])
  off = _metrics(tmp_path / "off", [
      dict(step=1, iteration=0, reward=0.5, grad_norm=8.0, ratio_max=4.0,
           **roll)])
  rows = report.iterations(on)
  assert [(r["updates"], r["grad_norm"], r["ratio_max"]) for r in rows] == [
      (2, 2.0, 2.5), (0, None, None)]
  s = report.summary(rows)
  assert s["updates"] == 2 and s["reward_mean"] == pytest.approx(0.125)
  assert s["grad_norm_max"] == 3.0
  report.main(["report", f"void_on={on}", f"void_off={off}"])
  text = (on / "compare.md").read_text()
  assert "| void_on | void_off |" in text
  assert "| grad_norm_mean | 2.000 | 8.000 |" in text
  with pytest.raises(FileNotFoundError, match="not a SimpleTIR"):
    report.iterations(tmp_path / "missing")


def test_grpo_iteration_with_real_tiny_model(tmp_path):
  """The sampler path: rollouts from the model itself, then a step; the
  code's validation before the first and after the last iteration (into
  metrics.jsonl and the report), and the policy exported at the end."""
  from swirl_jax.simpletir import train  # pylint: disable=g-import-not-at-top
  c = simpletir_script.config(temperature=1.0)
  c.num_iterations = 1
  c.grpo.drop_zero_variance = False  # Random rewards are mostly 0.
  c.grpo.filter_void = False
  c.validation.update(every=1, k=2, limit=2)
  train.run(c, str(tmp_path))
  lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  steps = [l for l in lines if "iteration" in l and "val_iteration" not in l]
  # The random tiny model answers nothing: every reward and so every GRPO
  # advantage is 0, and with no KL term (SimpleTIR) loss and gradient are 0.
  assert [(l["loss"], l["grad_norm"]) for l in steps] == [(0.0, 0.0)] * 2
  vals = report.validations(tmp_path)
  assert [v["val_iteration"] for v in vals] == [0.0, 1.0]
  assert all(v["val_synthetic_arith_test_avg@2"] == 0.0 for v in vals)
  assert "pass@2" in (tmp_path / "report.md").read_text()
  assert (tmp_path / "hf" / "config.json").exists()  # train.export_hf.
