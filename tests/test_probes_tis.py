"""The probe's old log-probs under truncated importance sampling: with
`old_logprobs='sampler'` the ratio's old log-probs are the sampler's (the
batch's behaviour log-probs), not the trainer's forward (which made
'sampler' act as 'trainer' whenever `loss.tis_cap` > 0)."""

import jax
import numpy as np
import pytest

from swirl_jax import config_lib
from swirl_jax import sharding as shd
from swirl_jax.models import loading
from swirl_jax.training import probes
from swirl_jax.training import step as step_lib

from test_diagnostics import _sampled_batch


@pytest.fixture(scope="module")
def tiny():
  cfg, params, tok = loading.load_policy(config_lib.model_config("tiny", ""))
  mesh = shd.make_mesh([("data", -1), ("fsdp", 1), ("tensor", 1)])
  shardings = jax.tree.map(lambda x: x.sharding, params)
  # bf16 sampling: the sampler's log-probs differ from the trainer's.
  batch = _sampled_batch(params, cfg, tok, "bfloat16")
  batch["advantages"] = np.array([1.0, -0.5, 2.0, -1.0], np.float32)
  return cfg, params, mesh, shardings, batch


def _probe(tiny, old_logprobs, cap=2.0):
  cfg, _, mesh, shardings, _ = tiny
  loss_cfg = step_lib.default_loss_config()
  loss_cfg.update(kind="clipped_surrogate", tis_cap=cap)
  return probes.Probe(cfg, mesh, shardings, loss_cfg,
                      old_logprobs=old_logprobs), loss_cfg


def test_sampler_old_logprobs_stay_the_samplers_with_tis(tiny):
  """'sampler': the probe leaves the behaviour log-probs as the old ones,
  so the step's loss is the plain clip against the sampler (TIS's ratio
  is 1); 'trainer': its forward's, as before."""
  cfg, params, _, _, batch = tiny
  beh = np.asarray(batch["behaviour_logprobs"])
  probe, loss_cfg = _probe(tiny, "sampler")
  b = dict(batch)
  m = probe.mismatch(params, b)
  assert m["mismatch_abs_mean"] > 1e-4  # The two sides differ.
  np.testing.assert_array_equal(np.asarray(b["old_logprobs"]), beh)
  b = {k: np.asarray(v) for k, v in b.items()}
  loss, metrics = step_lib.policy_loss(params, cfg, loss_cfg, b)
  plain = step_lib.default_loss_config()
  plain.update(kind="clipped_surrogate")
  want, _ = step_lib.policy_loss(
      params, cfg, plain, {k: v for k, v in b.items() if k != "old_logprobs"})
  assert float(loss) == pytest.approx(float(want), rel=1e-6)
  assert float(metrics["tis_weight_mean"]) == pytest.approx(1.0)

  trainer, _ = _probe(tiny, "trainer")
  b = dict(batch)
  trainer.mismatch(params, b)
  np.testing.assert_allclose(np.asarray(b["old_logprobs"]),
                             np.asarray(trainer.logprobs(params, batch)))
  assert not np.allclose(np.asarray(b["old_logprobs"]), beh)


def test_grad_norm_takes_the_samplers_old_logprobs(tiny):
  """With TIS and a batch without old log-probs, `grad_norm` under
  'sampler' is the norm of the loss against the sampler's log-probs,
  not against the trainer's. (At the params that sampled the two differ
  only by clipping: a cap below some tokens' ratios truncates them.)"""
  _, params, _, _, batch = tiny
  sampler, _ = _probe(tiny, "sampler", cap=1.001)
  trainer, _ = _probe(tiny, "trainer", cap=1.001)
  with_beh = dict(batch, old_logprobs=batch["behaviour_logprobs"])
  with_trainer = dict(batch, old_logprobs=trainer.logprobs(params, batch))
  got = sampler.grad_norm(params, dict(batch))
  assert got == pytest.approx(sampler.grad_norm(params, with_beh), rel=1e-6)
  assert got != pytest.approx(sampler.grad_norm(params, with_trainer),
                              rel=1e-4)
  assert trainer.grad_norm(params, dict(batch)) == pytest.approx(
      trainer.grad_norm(params, with_trainer), rel=1e-6)


def test_old_logprobs_is_checked(tiny):
  with pytest.raises(ValueError, match="old_logprobs"):
    _probe(tiny, "proximal")
