"""Group advantages and filters against plain per-group NumPy loops."""

import numpy as np
import pytest

from swirl_jax.ops import advantages

TOL = dict(rtol=1e-6, atol=1e-6)


def np_grpo(rewards, ids, use_std=True, floor=1e-6, eps=0.0, ddof=1):
  out = np.zeros(len(rewards))
  for g in set(ids):
    rows = [i for i, x in enumerate(ids) if x == g]
    r = np.array([rewards[i] for i in rows], np.float64)
    std = np.std(r, ddof=ddof) if len(r) > ddof else 0.0
    adv = r - r.mean()
    if use_std:
      adv = adv / (max(std, floor) + eps)
    out[rows] = adv
  return out


def _rewards(seed=0, groups=4, size=5):
  rng = np.random.RandomState(seed)
  return rng.binomial(1, 0.5, groups * size).astype(np.float32) \
      + 0.1 * rng.rand(groups * size).astype(np.float32)


@pytest.mark.parametrize("use_std", [True, False])
@pytest.mark.parametrize("ddof", [0, 1])
def test_grpo_matches_numpy(use_std, ddof):
  r = _rewards()
  ids = np.repeat(np.arange(4), 5)
  got = advantages.grpo_advantages(r, 5, use_std=use_std, ddof=ddof)
  assert got.dtype == np.float32 and got.shape == (20,)
  np.testing.assert_allclose(got, np_grpo(r, ids, use_std, ddof=ddof), **TOL)


def test_group_ids_in_any_order_equal_group_size():
  r = _rewards(seed=1)
  perm = np.random.RandomState(0).permutation(20)
  ids = np.array([f"q{i // 5}" for i in range(20)])
  by_size = advantages.grpo_advantages(r, 5)
  by_ids = advantages.grpo_advantages(r[perm], ids[perm])
  np.testing.assert_allclose(by_ids, by_size[perm], **TOL)
  with pytest.raises(ValueError):
    advantages.grpo_advantages(r, 3)


def test_std_floor_and_constant_groups():
  r = np.array([1, 1, 1, 1, 0.5, 0.5, 0.5, 0.5001, 3], np.float32)
  ids = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2])
  adv = advantages.grpo_advantages(r, ids)
  np.testing.assert_array_equal(adv[:4], 0)  # constant group: 0, not NaN
  assert adv[8] == 0  # singleton group
  # A tiny spread d normalised like any other: deviations -d/4 (x3) and
  # 3d/4 over a std of d/2, whatever d is.
  np.testing.assert_allclose(adv[4:8], [-0.5, -0.5, -0.5, 1.5], atol=1e-3)
  floored = advantages.grpo_advantages(r, ids, std_floor=0.5)
  np.testing.assert_allclose(floored, np_grpo(r, ids, floor=0.5), **TOL)
  assert np.abs(floored).max() < 1e-3
  verl = advantages.grpo_advantages(r, ids, std_floor=0.0, eps=1e-6)
  np.testing.assert_allclose(verl, np_grpo(r, ids, floor=0.0, eps=1e-6),
                             rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(verl))


def test_loss_masked_rows_still_shape_their_group():
  r = np.array([1, 0, 0, 1, 1, 0], np.float32)
  keep = np.array([1, 1, 0, 1, 1, 1])  # row 2: a void trajectory
  adv = advantages.grpo_advantages(r, 3, loss_row_mask_B=keep)
  np.testing.assert_allclose(adv, np_grpo(r, [0] * 3 + [1] * 3) * keep, **TOL)
  assert adv[2] == 0
  r2 = r.copy()
  r2[2] = 1.0  # its reward moves its group's mean and std ...
  adv2 = advantages.grpo_advantages(r2, 3, loss_row_mask_B=keep)
  assert not np.allclose(adv2[:2], adv[:2])
  np.testing.assert_array_equal(adv2[3:], adv[3:])
  assert adv2[2] == 0  # ... but it still gets no loss weight.
  loss_mask = np.ones((6, 4), np.int32)
  masked = advantages.mask_loss_rows(loss_mask, keep)
  assert masked.dtype == loss_mask.dtype
  np.testing.assert_array_equal(masked.sum(1), [4, 4, 0, 4, 4, 4])


def test_nonzero_variance_filter():
  r = np.array([1, 1, 1, 0, 1, 0, 0.1 + 0.2, 0.3, 0.3], np.float64)
  keep = advantages.nonzero_variance_filter(r, 3)
  np.testing.assert_array_equal(keep, [0, 0, 0, 1, 1, 1, 1, 1, 1])
  # 0.1 + 0.2 != 0.3 in floats; a tolerance treats the group as constant.
  keep = advantages.nonzero_variance_filter(r, 3, atol=1e-9)
  np.testing.assert_array_equal(keep, [0, 0, 0, 1, 1, 1, 0, 0, 0])


def test_accuracy_band_filter():
  # Group accuracies 0/10, 1/10, 5/10, 9/10, 10/10 (band is inclusive).
  correct = np.concatenate([np.arange(10) < k for k in (0, 1, 5, 9, 10)])
  ids = np.repeat(np.arange(5), 10)
  keep = advantages.accuracy_band_filter(correct, ids, lo=0.1, hi=0.9)
  np.testing.assert_array_equal(keep, np.repeat([0, 1, 1, 1, 0], 10))
  keep = advantages.accuracy_band_filter(correct, 10, lo=0.2, hi=0.8)
  np.testing.assert_array_equal(keep, np.repeat([0, 0, 1, 0, 0], 10))


def test_stepwise_advantages():
  r = np.array([[1.0, 0.0, 0.5, 0.5], [2.0, 2.0, 2.0, 2.0]])
  np.testing.assert_allclose(advantages.stepwise_advantages(r, "none"), r)
  np.testing.assert_allclose(advantages.stepwise_advantages(r, "mean"),
                             [[0.5, -0.5, 0, 0], [0, 0, 0, 0]], **TOL)
  loo = advantages.stepwise_advantages(r, "leave_one_out")
  want = [[r[b, i] - np.delete(r[b], i).mean() for i in range(4)]
          for b in range(2)]
  np.testing.assert_allclose(loo, want, **TOL)
  np.testing.assert_array_equal(
      advantages.stepwise_advantages(r[:, :1], "leave_one_out"), [[0], [0]])
  with pytest.raises(ValueError):
    advantages.stepwise_advantages(r, "median")
