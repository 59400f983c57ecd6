"""SWiRL step decomposition: a trajectory with K actions -> K step units.

State is append-only: s(i+1) = s(i) + a(i) + o(i), so unit i's state is the
prompt plus every earlier action and observation, and its action is turn i
alone. Nothing is dropped: observations move into later states. One policy
serves every step; the step structure lives in the data.
"""

from typing import Iterable

from swirl_jax.rollout.records import StepUnit, Trajectory


def decompose(traj: Trajectory) -> list[StepUnit]:
  """The K (state, action) units of a trajectory with K turns."""
  units = []
  state_ids, state_text = list(traj.prompt_ids), traj.prompt
  for i, turn in enumerate(traj.turns):
    units.append(StepUnit(
        trajectory_id=traj.id, step_index=i,
        state_ids=list(state_ids), state_text=state_text,
        action_ids=list(turn.action_ids), action_text=turn.text,
        action_logprobs=list(turn.action_logprobs),
        outcome=traj.outcome, is_final=turn.answer is not None,
        meta={"num_steps": len(traj.turns), "void": turn.void,
              "source": traj.source}))
    state_ids += list(turn.action_ids) + list(turn.observation_ids)
    state_text += turn.text + turn.observation
  return units


def decompose_all(trajs: Iterable[Trajectory]) -> list[StepUnit]:
  return [u for t in trajs for u in decompose(t)]
