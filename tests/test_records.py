"""Records: lossless JSON, token masks from id segments, torn shards."""

import json
import math

import numpy as np
import pytest

from swirl_jax.rollout import records
from swirl_jax.rollout.records import StepUnit, Trajectory, Turn


def _traj(task_id="t1", sample_index=0, outcome=True):
  return Trajectory(
      task_id=task_id, sample_index=sample_index, prompt="Q: 2+3*4?",
      prompt_ids=[1, 2, 3],
      turns=[
          Turn(text="<math_exp>3*4</math_exp>", action_ids=[10, 11],
               action_logprobs=[-0.5, -1.25], observation="3*4 -> 12",
               observation_ids=[20, 21, 22], tool="calculator",
               argument="3*4", stop_reason="stop"),
          Turn(text="<answer>14</answer>", action_ids=[12, 13, 14],
               action_logprobs=[-0.1, -0.2, -math.inf], answer="14",
               stop_reason="stop"),
      ],
      final_answer="14", outcome=outcome, reward=None, source="gsm8k",
      meta={"temperature": 1.0, "tags": ["a", "é"]})


def test_json_round_trip_is_lossless():
  t = _traj()
  line = t.to_json()
  assert "\n" not in line
  assert Trajectory.from_json(line) == t
  u = StepUnit(trajectory_id="t1/0", step_index=1, state_ids=[1, 2],
               state_text="s", action_ids=[3], action_text="a",
               process_good=False, process_prob=0.125, outcome=None,
               is_final=True)
  assert StepUnit.from_json(u.to_json()) == u
  assert u.task_id == "t1"
  assert json.loads(line)["turns"][0]["tool"] == "calculator"


def test_token_sequence_masks_exactly_the_action_ids():
  t = _traj()
  tokens, mask, logps = t.token_sequence()
  assert tokens.tolist() == [1, 2, 3, 10, 11, 20, 21, 22, 12, 13, 14]
  assert mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]
  assert tokens[mask == 1].tolist() == [10, 11, 12, 13, 14]
  np.testing.assert_array_equal(logps[mask == 1],
                                np.float32([-0.5, -1.25, -0.1, -0.2, -np.inf]))
  assert (logps[mask == 0] == 0).all()
  assert tokens.dtype == np.int32 and logps.dtype == np.float32
  assert t.has_behaviour_logprobs


def test_logprob_length_is_checked():
  with pytest.raises(ValueError, match="action_logprobs"):
    Turn(action_ids=[1, 2], action_logprobs=[0.0])


def test_shard_append_and_torn_last_line(tmp_path, caplog):
  path = str(tmp_path / "shard.jsonl")
  assert records.write_jsonl(path, [_traj(sample_index=0),
                                    _traj(sample_index=1)]) == 2
  full = _traj(sample_index=2).to_json()
  with open(path, "a") as f:  # A writer killed mid-line.
    f.write(full[:len(full) // 2])
  got = records.read_jsonl(path, Trajectory)
  assert [t.sample_index for t in got] == [0, 1]
  assert "torn" in caplog.text
  # The next append cuts the fragment off instead of gluing onto it.
  records.write_jsonl(path, [_traj(sample_index=3)])
  got = records.read_jsonl(path, Trajectory)
  assert [t.sample_index for t in got] == [0, 1, 3]
  assert got[0] == _traj(sample_index=0)
  assert records.read_jsonl(path)[2]["sample_index"] == 3  # Plain dicts.


def test_bad_line_inside_a_shard_raises(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"task_id": "a"}\nnot json\n{"task_id": "b"}\n')
  with pytest.raises(ValueError, match=":2:"):
    records.read_jsonl(str(path), Trajectory)
