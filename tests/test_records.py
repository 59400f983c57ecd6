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


# GSM8K train line 424; '€' is 3 bytes in UTF-8 (shards keep it unescaped).
EURO_QUESTION = ("Mom went shopping at the market. She left with €55. She "
                 "bought 2 packs of bananas for €4 each, pears for €2, "
                 "asparagus for €6 and finally a chicken for €11. How much "
                 "money does Mom have left?")


def _euro(sample_index):
  t = _traj(sample_index=sample_index)
  t.prompt = EURO_QUESTION
  return t


def _torn_recovery(path, tail: bytes, caplog):
  """Two records, then `tail` without its newline: the read drops the tail
  and keeps both; the next append cuts it off and keeps all three."""
  records.write_jsonl(str(path), [_euro(0), _euro(1)])
  with open(path, "ab") as f:
    f.write(tail)
  assert records.read_jsonl(str(path), Trajectory) == [_euro(0), _euro(1)]
  assert (f"{path}:3: skipping a torn last line ({len(tail)} bytes)"
          in caplog.text)
  records.write_jsonl(str(path), [_euro(2)])
  assert records.read_jsonl(str(path), Trajectory) == [_euro(0), _euro(1),
                                                       _euro(2)]


def test_torn_tail_cut_inside_a_multibyte_character(tmp_path, caplog):
  line = _euro(9).to_json().encode()
  cut = line.index("€".encode()) + 1  # One of the three bytes of '€'.
  _torn_recovery(tmp_path / "shard.jsonl", line[:cut], caplog)


def test_torn_tail_of_garbage_bytes(tmp_path, caplog):
  _torn_recovery(tmp_path / "shard.jsonl", b"\xff\xfe\x00garbage", caplog)


@pytest.mark.parametrize("bad,reason", [
    (b"\xffgarbage", "not UTF-8 (byte 0xff at column 1)"),
    (b'{"task_id": "a",', "bad JSON (Expecting property name enclosed in "
                          "double quotes at column 17)"),
    (b'{"task_id": "a", "bogus": 1}',
     "bad record (Trajectory: unknown fields ['bogus'])"),
    (b'{"turns": [{"action_ids": [1, 2], "action_logprobs": [0.5]}]}',
     "bad record (Turn: 1 action_logprobs for 2 action_ids)"),
    (b"[1, 2]", "bad record (Trajectory: unknown fields [1, 2])"),
    (b"   ", "empty line inside a record file"),
])
def test_bad_line_inside_a_shard_fails_with_file_and_line(tmp_path, bad,
                                                          reason):
  path = tmp_path / "bad.jsonl"
  records.write_jsonl(str(path), [_euro(0)])
  with open(path, "ab") as f:
    f.write(bad + b"\n")
  records.write_jsonl(str(path), [_euro(1)])
  before = path.read_bytes()
  with pytest.raises(ValueError) as e:
    records.read_jsonl(str(path), Trajectory)
  assert str(e.value) == f"{path}:2: {reason}"
  assert path.read_bytes() == before  # Reading never changes a shard.
  # Line 1 was read before the bad line stopped the reader.
  assert next(records.iter_jsonl(str(path), Trajectory)) == _euro(0)


def test_filter_units_with_a_bad_line(tmp_path):
  path = tmp_path / "units_process.jsonl"
  unit = StepUnit(trajectory_id="t1/0", step_index=0, action_text="a")
  records.write_jsonl(str(path), [unit])
  with open(path, "ab") as f:
    f.write(b'{"trajectory_id": "t1/1", "step_index": 0, "state": 1}\n')
  with pytest.raises(ValueError) as e:
    records.read_jsonl(str(path), StepUnit)
  assert str(e.value) == (f"{path}:2: bad record (StepUnit: unknown fields "
                          "['state'])")


def test_whole_record_without_its_newline_counts_as_torn(tmp_path, caplog):
  """Only a newline commits a record: resume redoes it rather than count
  it done and have the next append cut it off."""
  path = tmp_path / "shard.jsonl"
  records.write_jsonl(str(path), [_euro(0)])
  with open(path, "ab") as f:
    f.write(_euro(1).to_json().encode())
  assert records.read_jsonl(str(path), Trajectory) == [_euro(0)]
  records.write_jsonl(str(path), [_euro(2)])
  assert records.read_jsonl(str(path), Trajectory) == [_euro(0), _euro(2)]
