"""Decomposition into step units, and the four SWiRL filters."""

import pytest

from swirl_jax.rollout.records import StepUnit, Trajectory, Turn
from swirl_jax.rollout import decompose
from swirl_jax.swirl import filters


def _traj(k=3, outcome=False):
  turns = [Turn(text=f"a{i}", action_ids=[100 + i, 200 + i],
                observation=f"o{i}", observation_ids=[300 + i],
                tool="search", argument=f"q{i}") for i in range(k - 1)]
  turns.append(Turn(text="ans", action_ids=[9], answer="x"))
  return Trajectory(task_id="t", sample_index=4, prompt="P",
                    prompt_ids=[1, 2], turns=turns, final_answer="x",
                    outcome=outcome)


def test_k_actions_give_k_units_with_append_only_states():
  t = _traj(k=3)
  units = decompose.decompose(t)
  assert len(units) == 3
  assert [u.step_index for u in units] == [0, 1, 2]
  assert all(u.trajectory_id == "t/4" for u in units)
  assert [u.is_final for u in units] == [False, False, True]
  assert units[0].state_ids == [1, 2]
  assert units[1].state_ids == [1, 2, 100, 200, 300]
  assert units[2].state_ids == [1, 2, 100, 200, 300, 101, 201, 301]
  assert units[2].state_text == "Pa0o0a1o1"
  for prev, nxt in zip(units, units[1:]):  # Each state extends the last.
    assert nxt.state_ids[:len(prev.state_ids)] == prev.state_ids
    assert nxt.state_ids[len(prev.state_ids):][:len(prev.action_ids)] == \
        prev.action_ids
  # State + action of the last unit is the whole trajectory's token sequence.
  tokens, _, _ = t.token_sequence()
  assert units[-1].state_ids + units[-1].action_ids == tokens.tolist()
  assert all(u.outcome is False for u in units)


def _units():
  """Four trajectories of two steps each, hand-labelled.

  t0: GOOD GOOD correct | t1: GOOD GOOD wrong | t2: GOOD BAD correct |
  t3: BAD BAD wrong.
  """
  spec = {"t0": (True, True, True), "t1": (True, True, False),
          "t2": (True, False, True), "t3": (False, False, False)}
  return [StepUnit(trajectory_id=f"{t}/0", step_index=i, process_good=g,
                   process_prob=float(g), outcome=o)
          for t, (g0, g1, o) in spec.items() for i, g in enumerate((g0, g1))]


@pytest.mark.parametrize("strategy,granularity,steps,trajs,wrong", [
    ("none", "trajectory", 8, 4, 2),
    ("process", "trajectory", 4, 2, 1),  # t0, t1 whole.
    ("process", "step", 5, 3, 1),  # + t2's first step.
    ("outcome", "trajectory", 4, 2, 0),  # t0, t2.
    ("process_outcome", "trajectory", 2, 1, 0),  # t0.
    ("process_outcome", "step", 3, 2, 0),  # t0 + t2's first step.
])
def test_filter_counts(strategy, granularity, steps, trajs, wrong):
  kept, report = filters.filter_units(_units(), strategy, granularity)
  assert len(kept) == steps == report["steps_kept"]
  assert report["trajectories_kept"] == trajs
  assert report["trajectories_kept_wrong"] == wrong
  assert report["steps_in"] == 8 and report["trajectories_in"] == 4
  assert report["steps_judged_good"] == 5


def test_process_filter_keeps_wrong_but_reasonable_trajectories():
  kept, report = filters.filter_units(_units(), "process")
  assert {u.trajectory_id for u in kept} == {"t0/0", "t1/0"}
  assert report["trajectories_kept_whole"] == 2


def test_filters_refuse_missing_labels_and_bad_names():
  units = [StepUnit(trajectory_id="a/0", outcome=True)]
  with pytest.raises(ValueError, match="process_good"):
    filters.filter_units(units, "process")
  assert filters.filter_units(units, "outcome")[1]["steps_kept"] == 1
  with pytest.raises(ValueError, match="strategy"):
    filters.filter_units(units, "best")
  with pytest.raises(ValueError, match="granularity"):
    filters.filter_units(units, "none", "token")
