"""Advantages and group filters, in NumPy, on the host.

Rewards come from Python (answer checkers, reward models) and filters change
which rows enter the batch, so all of this runs before the jitted step.

A group (GRPO: the samples of one prompt) is given either as an int
`group_size` (rows `[k*G, (k+1)*G)` form group k) or as an array of group
ids `[B]` (any hashable-by-numpy values, in any order).
"""

import numpy as np

STEPWISE_MODES = ("none", "mean", "leave_one_out")


def group_index(groups, batch_size: int):
  """`(group_of_row_B, num_groups)`: dense group numbers 0..num_groups-1."""
  if isinstance(groups, (int, np.integer)):
    if groups <= 0 or batch_size % groups:
      raise ValueError(f"batch {batch_size} is not a multiple of group size "
                       f"{groups}")
    return np.arange(batch_size) // groups, batch_size // groups
  ids_B = np.asarray(groups)
  if ids_B.shape != (batch_size,):
    raise ValueError(f"group ids {ids_B.shape} != ({batch_size},)")
  uniq, group_of_row_B = np.unique(ids_B, return_inverse=True)
  return group_of_row_B.reshape(-1), len(uniq)


def _group_mean_std(x_B, group_of_row_B, num_groups, ddof):
  """Per-group mean and std (float64); a singleton group has std 0."""
  count_G = np.bincount(group_of_row_B, minlength=num_groups)
  mean_G = np.bincount(group_of_row_B, x_B, minlength=num_groups) / count_G
  dev_B = x_B - mean_G[group_of_row_B]
  var_G = (np.bincount(group_of_row_B, dev_B**2, minlength=num_groups)
           / np.maximum(count_G - ddof, 1))
  return mean_G, np.sqrt(var_G)


def grpo_advantages(rewards_B, groups, *, use_std: bool = True,
                    std_floor: float = 1e-6, eps: float = 0.0, ddof: int = 1,
                    loss_row_mask_B=None) -> np.ndarray:
  """GRPO advantages: `(r - mean_g) / (max(std_g, std_floor) + eps)`.

  Args:
    rewards_B: one scalar reward per row.
    groups: group size (int) or group ids `[B]`.
    use_std: False gives `r - mean_g` (no std division, as in Dr. GRPO).
    std_floor: lower bound on the std, so a near-constant group cannot
      blow its advantages up; a constant group gets advantage 0.
    eps: added to the denominator; `std_floor=0, eps=1e-6` reproduces verl.
    ddof: 1 is the unbiased std (torch.std, as verl/SimpleTIR use).
    loss_row_mask_B: rows with 0 here (e.g. SimpleTIR void trajectories)
      still count in their group's mean and std but get advantage 0. Also
      zero their tokens with `mask_loss_rows`, or they would still count in
      a token-mean denominator.

  Returns:
    float32 `[B]`.
  """
  r_B = np.asarray(rewards_B, np.float64)
  group_of_row_B, num_groups = group_index(groups, r_B.shape[0])
  mean_G, std_G = _group_mean_std(r_B, group_of_row_B, num_groups, ddof)
  adv_B = r_B - mean_G[group_of_row_B]
  if use_std:
    adv_B = adv_B / (np.maximum(std_G, std_floor) + eps)[group_of_row_B]
  if loss_row_mask_B is not None:
    adv_B = np.where(np.asarray(loss_row_mask_B) != 0, adv_B, 0.0)
  return adv_B.astype(np.float32)


def mask_loss_rows(loss_mask_BT, loss_row_mask_B):
  """Zeroes the loss mask of whole rows (e.g. void trajectories)."""
  loss_mask_BT = np.asarray(loss_mask_BT)
  row_B1 = (np.asarray(loss_row_mask_B) != 0)[:, None]
  return np.where(row_B1, loss_mask_BT, 0).astype(loss_mask_BT.dtype)


def _per_group(reduce_fn, x_B, groups, initial):
  x_B = np.asarray(x_B, np.float64)
  group_of_row_B, num_groups = group_index(groups, x_B.shape[0])
  out_G = np.full(num_groups, initial)
  reduce_fn.at(out_G, group_of_row_B, x_B)
  return out_G[group_of_row_B]


def nonzero_variance_filter(rewards_B, groups, *, atol: float = 0.0):
  """Keep-mask `[B]`: rows of groups whose rewards are not all equal.

  Such groups have zero advantage everywhere, so they only dilute the batch.
  Uses max - min > atol (exact, unlike a float std of equal values).
  """
  hi_B = _per_group(np.maximum, rewards_B, groups, -np.inf)
  lo_B = _per_group(np.minimum, rewards_B, groups, np.inf)
  return (hi_B - lo_B) > atol


def accuracy_band_filter(correct_B, groups, *, lo: float = 0.1,
                         hi: float = 0.9):
  """Keep-mask `[B]`: rows of groups whose mean accuracy is in [lo, hi].

  SimpleTIR drops groups that are almost always or almost never right.
  """
  correct_B = np.asarray(correct_B, np.float64)
  group_of_row_B, num_groups = group_index(groups, correct_B.shape[0])
  mean_G, _ = _group_mean_std(correct_B, group_of_row_B, num_groups, 0)
  acc_B = mean_G[group_of_row_B]
  # A small tolerance so that, e.g., 0.1 computed as 3/30 counts as 0.1.
  return (acc_B >= lo - 1e-9) & (acc_B <= hi + 1e-9)


def stepwise_advantages(rewards_BG, mode: str = "mean") -> np.ndarray:
  """SWiRL stage 2: G sampled actions per saved state, baseline per state.

  none: the reward itself (plain REINFORCE, as the paper states it).
  mean: reward - mean over the state's G samples.
  leave_one_out: reward - mean of the other G-1 samples (unbiased: the
    baseline does not depend on the sample it is subtracted from);
    0 when G = 1.

  Returns float32 `[B, G]`.
  """
  r_BG = np.asarray(rewards_BG, np.float64)
  if r_BG.ndim != 2:
    raise ValueError(f"rewards_BG must be [B, G], got {r_BG.shape}")
  G = r_BG.shape[1]
  centred_BG = r_BG - r_BG.mean(axis=1, keepdims=True)
  if mode == "none":
    adv_BG = r_BG
  elif mode == "mean":
    adv_BG = centred_BG
  elif mode == "leave_one_out":
    # r_i - (sum - r_i) / (G - 1) == (r_i - mean) * G / (G - 1).
    adv_BG = centred_BG * G / (G - 1) if G > 1 else np.zeros_like(r_BG)
  else:
    raise ValueError(f"mode must be one of {STEPWISE_MODES}, got {mode!r}")
  return adv_BG.astype(np.float32)
