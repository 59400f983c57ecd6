"""Diagnostics beside the updates: sampler-trainer mismatch, void-turn token
statistics, tool use, and the split gradient norms, on tiny hand-made
batches."""

import dataclasses
import math

import jax
import numpy as np
import optax
import pytest

from swirl_jax import config_lib
from swirl_jax import sharding as shd
from swirl_jax.models import loading
from swirl_jax.rollout import batching
from swirl_jax.rollout.records import Trajectory, Turn
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.simpletir import grpo, report, stages, void
from swirl_jax.training import probes
from swirl_jax.training import step as step_lib

OK, BAD = "```python\nprint(1)\n```", "```python\nprint(1"


def _traj(i, reward, turns):
  """`turns`: (text, action log-probs, tool) per turn."""
  return Trajectory(
      task_id=f"q{i // 4}", sample_index=i % 4, reward=reward,
      prompt_ids=[1, 2, 3],
      turns=[Turn(text=t, action_ids=[5 + i + k for k in range(len(lp))],
                  action_logprobs=lp, tool=tool) for t, lp, tool in turns])


def _batch_trajs():
  lo = math.log(1e-4)  # Below p = 1e-3.
  return [
      _traj(0, 1.0, [(OK, [-0.1, -0.2], "python"),
                     ("\\boxed{1}", [-0.3], None)]),
      _traj(1, 0.0, [(BAD, [lo, -0.5, -12.0], None)]),
      _traj(2, 0.0, [(OK, [-0.4, lo], "python")]),
      _traj(3, 1.0, [(BAD, [-0.6], None)]),
  ]


def test_token_stats_void_vs_nonvoid_by_hand():
  trajs = _batch_trajs()
  flags = [void.has_void_turn(t) for t in trajs]
  assert flags == [False, True, False, True]
  s = void.token_stats(trajs, flags)
  # Void tokens: log(1e-4), -0.5, -12.0, -0.6 -> 2 of 4 below log(1e-3).
  assert s["low_p_share_void"] == pytest.approx(2 / 4)
  assert s["min_logp_void"] == pytest.approx(-12.0)
  # Non-void: -0.1, -0.2, -0.3, -0.4, log(1e-4) -> 1 of 5.
  assert s["low_p_share_nonvoid"] == pytest.approx(1 / 5)
  assert s["min_logp_nonvoid"] == pytest.approx(math.log(1e-4))
  # No void rollout: no void entries (not a made-up 0).
  assert set(void.token_stats(trajs[:1], [False])) == {
      "low_p_share_nonvoid", "min_logp_nonvoid"}


def test_tool_stats_by_hand():
  s = void.tool_stats(_batch_trajs())
  # 5 turns, 2 call a tool; 4 trajectories, 3 of them single-turn.
  assert s == pytest.approx({"tool_call_rate": 2 / 5, "tool_calls": 2 / 4,
                             "single_turn_rate": 3 / 4})


def test_select_rows_logs_the_diagnostics_and_void_rows_keep_advantages():
  trajs = _batch_trajs()
  g = grpo.GroupConfig(group_size=4, accuracy_band=None)
  fig = grpo.figures(trajs, g)
  rows, adv, stats = grpo.select_rows(fig, g)
  assert rows.tolist() == [0, 2]
  assert stats["low_p_share_void"] == pytest.approx(0.5)
  assert stats["tool_call_rate"] == pytest.approx(0.4)
  r = np.array([1.0, 0.0, 0.0, 1.0])
  want = (r - r.mean()) / r.std(ddof=1)
  v_rows, v_adv = grpo.void_rows(fig, g)
  assert v_rows.tolist() == [1, 3]
  np.testing.assert_allclose(v_adv, want[[1, 3]], rtol=1e-5)
  np.testing.assert_allclose(adv, want[[0, 2]], rtol=1e-5)


@pytest.fixture(scope="module")
def tiny():
  cfg, params, tok = loading.load_policy(config_lib.model_config("tiny", ""))
  mesh = shd.make_mesh([("data", -1), ("fsdp", 1), ("tensor", 1)])
  shardings = jax.tree.map(lambda x: x.sharding, params)
  probe = probes.Probe(cfg, mesh, shardings, dict(kind="clipped_surrogate"))
  return cfg, params, tok, probe


def test_split_grad_norms_equal_a_direct_backward_on_each_side(tiny):
  cfg, params, _, probe = tiny
  trajs = _batch_trajs()
  g = grpo.GroupConfig(group_size=4, accuracy_band=None)
  fig = grpo.figures(trajs, g)
  rows, adv, _ = grpo.select_rows(fig, g)
  got = stages.split_grad_norms(probe, params, trajs, fig, rows, adv, g)
  loss_cfg = step_lib.default_loss_config()

  def direct(r, a):
    b = batching.collate([trajs[i].token_sequence() for i in r], a)
    b = {k: np.asarray(v) for k, v in b.items()}
    f = lambda p: step_lib.policy_loss(p, cfg, loss_cfg, b)[0]
    return float(optax.tree.norm(jax.jit(jax.grad(f))(params)))

  v_rows, v_adv = grpo.void_rows(fig, g)
  assert got["grad_norm_void"] == pytest.approx(direct(v_rows, v_adv),
                                                rel=1e-5)
  assert got["grad_norm_kept"] == pytest.approx(direct(rows, adv), rel=1e-5)
  assert got["grad_norm_void"] > 0 and got["grad_norm_kept"] > 0


def test_split_grad_norms_with_tis_weigh_by_the_trainers_logprobs(tiny):
  """With `loss.tis_cap` (staleness needs it) the probe's batches carry no
  old log-probs: it takes the trainer's under the params, as the update
  does, and each side's norm is that direct backward's."""
  cfg, params, _, _ = tiny
  mesh = shd.make_mesh([("data", -1), ("fsdp", 1), ("tensor", 1)])
  loss_cfg = step_lib.default_loss_config()
  loss_cfg.update(kind="clipped_surrogate", tis_cap=2.0)
  probe = probes.Probe(cfg, mesh, jax.tree.map(lambda x: x.sharding, params),
                       loss_cfg)
  trajs = _batch_trajs()
  g = grpo.GroupConfig(group_size=4, accuracy_band=None)
  fig = grpo.figures(trajs, g)
  rows, adv, _ = grpo.select_rows(fig, g)
  got = stages.split_grad_norms(probe, params, trajs, fig, rows, adv, g)
  b = grpo.make_batch(trajs, rows, adv, mini_batch_size=1)
  b = {k: np.asarray(v) for k, v in b.items()}
  b["old_logprobs"] = np.asarray(probe.logprobs(params, b))
  f = lambda p: step_lib.policy_loss(p, cfg, loss_cfg, b)[0]
  assert got["grad_norm_kept"] == pytest.approx(
      float(optax.tree.norm(jax.jit(jax.grad(f))(params))), rel=1e-5)
  assert got["grad_norm_void"] > 0


def _sampled_batch(params, cfg, tok, dtype):
  """Sampled continuations, scored by a sampler running in `dtype`."""
  sampler = Sampler(params, dataclasses.replace(cfg, dtype=dtype), tok,
                    SamplerConfig(max_cache_len=256))
  prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
  res = sampler.generate(prompts, max_new_tokens=16, temperature=1.0, seed=0)
  seqs = []
  for p, ids, lp in zip(prompts, res.tokens, res.logprobs):
    seqs.append((np.array(p + list(ids)),
                 np.r_[np.zeros(len(p)), np.ones(len(ids))],
                 np.r_[np.zeros(len(p)), lp]))
  return batching.collate(seqs)


def test_mismatch_near_zero_in_fp32_and_not_in_bf16(tiny):
  """Same params, same tokens: an fp32 sampler agrees with the fp32
  trainer to rounding; a bf16 sampler does not."""
  cfg, params, tok, probe = tiny
  fp32 = probe.mismatch(params, _sampled_batch(params, cfg, tok, "float32"))
  bf16 = probe.mismatch(params, _sampled_batch(params, cfg, tok, "bfloat16"))
  assert fp32["mismatch_abs_max"] < 1e-4 and fp32["mismatch_kl"] < 1e-8
  assert bf16["mismatch_abs_mean"] > 1e-4
  assert bf16["mismatch_abs_mean"] > 100 * fp32["mismatch_abs_mean"]
  assert bf16["mismatch_kl"] > 0


def test_report_table_and_compare_carry_the_diagnostics(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  roll = dict(reward=0.5, void_rate=0.5, turns=1.25, tool_call_rate=0.4,
              rows_in_loss=2.0, low_p_share_void=0.5,
              low_p_share_nonvoid=0.2, min_logp_void=-9.0,
              min_logp_nonvoid=-9.21, grad_norm_void=3.0,
              grad_norm_kept=1.5, mismatch_kl=1e-3)
  (tmp_path / "metrics.jsonl").write_text(
      json.dumps(dict(step=1, iteration=0, grad_norm=2.0, ratio_max=1.1,
                      **roll)) + "\n" +
      json.dumps(dict(step=2, iteration=1, grad_norm=4.0, ratio_max=1.2,
                      **dict(roll, grad_norm_void=None,
                             grad_norm_kept=None))) + "\n")
  table = report.write(tmp_path)
  head = table.splitlines()[0]
  for col in ("tool_call_rate", "low_p_share_void", "grad_norm_void",
              "grad_norm_kept", "mismatch_kl"):
    assert col in head
  assert "| 0 | 0.500 | 0.500 | 1.250 | 0.400 |" in table
  assert "| 3.000 | 1.500 | 0.001 |" in table
  assert (tmp_path / "reward.png").exists()
  s = report.summary(report.iterations(tmp_path))
  assert s["grad_norm_void_mean"] == 3.0 and s["grad_norm_kept_mean"] == 1.5
  assert s["low_p_share_void_mean"] == 0.5


@pytest.mark.parametrize("kind", ["clipped_surrogate", "stepwise_pg"])
def test_tis_is_a_loss_option_of_both_losses_off_by_default(tiny, kind):
  """`loss.tis_cap` > 0: the probe's forward leaves the trainer's log-probs
  in the batch and the step weights each token's loss by
  min(pi_trainer / pi_sampler, cap) (NumPy reference). Off by default."""
  cfg, params, tok, _ = tiny
  assert step_lib.default_loss_config().tis_cap == 0.0
  batch = _sampled_batch(params, cfg, tok, "bfloat16")
  batch["advantages"] = np.array([1.0, -0.5, 2.0, -1.0], np.float32)
  mesh = shd.make_mesh([("data", -1), ("fsdp", 1), ("tensor", 1)])
  shardings = jax.tree.map(lambda x: x.sharding, params)
  cap = 1.001
  loss_cfg = step_lib.default_loss_config()
  loss_cfg.update(kind=kind, tis_cap=cap)
  probe = probes.Probe(cfg, mesh, shardings, loss_cfg)
  m = probe.mismatch(params, batch)
  b = {k: np.asarray(v) for k, v in batch.items()}
  old, beh = b["old_logprobs"][:, 1:], b["behaviour_logprobs"][:, 1:]
  mask, adv = b["loss_mask"][:, 1:], b["advantages"][:, None]
  w = np.minimum(np.exp(np.float64(old) - beh), cap) * mask
  assert 0 < (w[mask > 0] >= cap).mean() < 1  # Some tokens truncated.
  loss, metrics = step_lib.policy_loss(params, cfg, loss_cfg, b)
  if kind == "clipped_surrogate":  # Same params: ratio 1, token mean.
    want = (-adv * w).sum() / mask.sum()
  else:  # Per row: -A * sum_t logp * w, then the row mean.
    want = (-adv * old * w).sum(-1).mean()
  assert float(loss) == pytest.approx(want, rel=1e-4)
  assert float(metrics["tis_weight_mean"]) == pytest.approx(
      w[mask > 0].mean(), rel=1e-5)
  assert float(metrics["mismatch_abs_mean"]) == pytest.approx(
      m["mismatch_abs_mean"], rel=1e-4)
  loss_cfg.tis_cap = 0.0  # Off: no weights, and the plain loss.
  plain, metrics = step_lib.policy_loss(params, cfg, loss_cfg, b)
  assert "tis_weight_mean" not in metrics
  assert float(plain) != pytest.approx(want, rel=1e-4)


def test_swirl_reward_stats_by_hand():
  from swirl_jax.swirl import stage2  # pylint: disable=g-import-not-at-top
  r_BG = np.array([[0.9, 0.2], [0.6, 0.4], [1.0, 0.0]])
  s = stage2.reward_stats(r_BG)
  # Sorted: 0, .2, .4, .6, .9, 1; numpy's linear percentiles at
  # (n-1) q = 0.5, 2.5, 4.5 positions.
  assert s["reward"] == pytest.approx(3.1 / 6)
  assert s["reward_std"] == pytest.approx(np.sqrt(np.mean(
      (np.array([0.9, 0.2, 0.6, 0.4, 1.0, 0.0]) - 3.1 / 6) ** 2)))
  assert s["reward_p10"] == pytest.approx(0.1)
  assert s["reward_p50"] == pytest.approx(0.5)
  assert s["reward_p90"] == pytest.approx(0.95)
  assert s["reward_good_share"] == pytest.approx(0.5)  # .9, .6, 1.0


def test_swirl_report_per_step_distribution_and_split_shares(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  from swirl_jax.swirl import report as swirl_report  # pylint: disable=g-import-not-at-top
  (tmp_path / "rl").mkdir()
  (tmp_path / "filter").mkdir()
  dist = dict(reward_std=0.1, reward_p10=0.2, reward_p50=0.5,
              reward_p90=0.9, reward_good_share=0.5, mismatch_kl=2e-6)
  lines = [dict(step=1, iteration=0, reward=0.4, grad_norm=1.0, **dist),
           dict(step=2, iteration=0, reward=0.4, grad_norm=3.0, **dist),
           dict(step=3, iteration=1, reward=0.6, grad_norm=2.0,
                **dict(dist, reward_good_share=0.75))]
  (tmp_path / "rl" / "metrics.jsonl").write_text(
      "".join(json.dumps(m) + "\n" for m in lines))
  (tmp_path / "filter" / "report.json").write_text(json.dumps(dict(
      process=dict(steps_in=10, steps_judged_good=4, steps_kept=4),
      none=dict(steps_in=10, steps_judged_good=4, steps_kept=10))))
  rows = swirl_report.stage2_steps(tmp_path)
  # One row an optimizer step, numbered as metrics.jsonl and TensorBoard.
  assert [(r["step"], r["reward"], r["grad_norm"]) for r in rows] == [
      (1, 0.4, 1.0), (2, 0.4, 3.0), (3, 0.6, 2.0)]
  assert swirl_report.judged_shares(tmp_path) == {
      "judged GOOD": {"stage 1 (all)": 0.4},
      "kept": {"process": 0.4, "none": 1.0}}
  text = swirl_report.write(tmp_path)
  assert "| 3 | 0.600 | 0.100 | 0.200 | 0.500 | 0.900 | 0.750 | 2.00e-06 " \
         "| 2.000 |" in text
  assert "| kept | none | 1.000 |" in text
  assert "| judged GOOD | stage 1 (all) | 0.400 |" in text
  for name in ("reward.png", "judged_steps.png"):
    assert (tmp_path / name).stat().st_size > 0
  # Two steps: a default locator would tick 0, 0.2, ..., 1.
  plot = swirl_report._plot_steps  # pylint: disable=protected-access
  fig = plot(rows[1:], tmp_path / "r2.png")
  assert len(fig.axes) == 4  # reward, GOOD share, mismatch, grad-norm.
  for ax in fig.axes:
    assert all(float(t).is_integer() for t in ax.get_xticks())
    assert ax.get_xlabel() and ax.get_ylabel()  # Every axis labelled.
  # Rewards and shares on a fixed range with 0 and 1 inside the frame.
  lo, hi = fig.axes[0].get_ylim()
  assert lo < 0 and 1 < hi < 1.1
  assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
      "mean", "mean ± std", "median"]
  # A constant series (the KL): from 0, not +-4% around its value.
  lo, hi = fig.axes[2].get_ylim()
  assert -1e-7 < lo < 0 and 2e-6 < hi < 3e-6
