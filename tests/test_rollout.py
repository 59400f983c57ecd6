"""Rollouts through the engine: scripted policies with live tools, and a
real model."""

import numpy as np
import pytest

from swirl_jax.models import loading
from swirl_jax import config_lib
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import prompts
from swirl_jax.rollout import turns
from swirl_jax.rollout.scripted import ScriptedSampler
from swirl_jax.sampling.device import Device
from swirl_jax.sampling.sampler import Sampler, SamplerConfig
from swirl_jax.tasks import checkers
from swirl_jax.tasks import synthetic
from swirl_jax.tasks.records import Task
from swirl_jax.tools import registry

import testutil  # pylint: disable=g-bad-import-order


@pytest.fixture(scope="module")
def tokenizer():
  return loading.load_tokenizer("bundled")


@pytest.fixture(scope="module")
def calc_tools():
  return registry.build_tools(("calculator",))


def _check_masks(traj):
  tokens, mask, logps = traj.token_sequence()
  actions = [i for t in traj.turns for i in t.action_ids]
  assert tokens[mask == 1].tolist() == actions
  obs = [i for t in traj.turns for i in t.observation_ids]
  assert tokens[mask == 0].tolist() == traj.prompt_ids + obs
  assert np.all(logps[mask == 0] == 0)


def test_scripted_swirl_with_calculator(tokenizer, calc_tools):
  tasks = synthetic.arithmetic_tasks(3, seed=1)
  refs = [synthetic.reference_turns(t) for t in tasks]
  sampler = ScriptedSampler(tokenizer, lambda r, k: refs[r][k]["action"])
  assert isinstance(sampler.device(4, 8), Device)
  loop = engine_lib.RolloutEngine(sampler, tokenizer, calc_tools,
                                  turns.RolloutConfig(fmt="swirl",
                                                      max_turns=10))
  trajs = loop.run(tasks)
  checkers.score_trajectories(trajs, tasks)
  for traj, task, ref in zip(trajs, tasks, refs):
    assert traj.final_answer == task.answer and traj.outcome
    assert len(traj.turns) == len(ref)
    for t, r in zip(traj.turns[:-1], ref[:-1]):
      assert t.tool == "calculator"
      # The live calculator agrees with the solution graph.
      assert r["observation"].split(" -> ")[1] in t.observation
      assert "<|im_start|>user" in t.observation
    _check_masks(traj)
  # The model never sees its observations as its own tokens.
  assert all(sampler.extended)


def test_invalid_and_void_turns(tokenizer, calc_tools):
  # Text after the first stop string is never sampled; a tool the task
  # does not offer gets an error observation, and the row goes on.
  script = {0: ["<search_query>1+1</search_query> and <answer>2</answer>",
                "<answer>2</answer>"],
            1: ["I am not sure what to do."]}
  sampler = ScriptedSampler(tokenizer, lambda r, k: script[r][k])
  tasks = [Task(f"t{i}", "1+1?", ("2",), "synthetic_arith") for i in range(2)]
  loop = engine_lib.RolloutEngine(sampler, tokenizer, calc_tools,
                                  turns.RolloutConfig(fmt="swirl"))
  a, b = loop.run(tasks)
  assert a.turns[0].text.endswith("</search_query>")
  assert "Error: no tool 'search'" in a.turns[0].observation
  assert a.final_answer == "2" and len(a.turns) == 2
  assert b.meta.get("void") and b.turns[0].void and b.final_answer is None
  _check_masks(a)


def test_scripted_simpletir_with_sandbox(tokenizer):
  tools = registry.build_tools(("python",))
  script = {
      0: ["Let me compute.\n```python\nprint(6*7)\n```\n",
          "So the answer is \\boxed{42}."],
      1: ["```python\nfinal_answer(6*7)\n```\n"],
      2: ["```python\nprint(1"],  # Unclosed: void.
  }
  sampler = ScriptedSampler(tokenizer, lambda r, k: script[r][k])
  tasks = [Task(f"m{i}", "6*7?", ("42",), "math") for i in range(3)]
  loop = engine_lib.RolloutEngine(sampler, tokenizer, tools,
                                  turns.RolloutConfig(fmt="simpletir"))
  trajs = loop.run(tasks)
  checkers.score_trajectories(trajs, tasks)
  a, b, c = trajs
  assert "Code execution result: 42" in a.turns[0].observation
  assert a.final_answer == "42" and a.outcome
  assert b.final_answer == "42" and len(b.turns) == 1 and b.outcome
  assert c.meta.get("void") and not c.outcome
  for t in trajs:
    _check_masks(t)


def test_real_tiny_model_rollout(tokenizer, calc_tools):
  """Behaviour log-probs recorded by the engine equal a teacher-forced
  pass over the token sequence built from the records."""
  cfg, params, tok = loading.load_policy(config_lib.model_config("tiny", ""))
  sampler = Sampler(params, cfg, tok, SamplerConfig(max_cache_len=1024))
  tasks = synthetic.arithmetic_tasks(2, seed=3)
  loop = engine_lib.RolloutEngine(sampler, tok, calc_tools,
                                  turns.RolloutConfig(
                                      fmt="swirl", max_turns=2,
                                      max_new_tokens=12, temperature=1.0))
  trajs = loop.run(tasks, samples_per_task=2)
  assert len(trajs) == 4
  for traj in trajs:
    _check_masks(traj)
  assert testutil.teacher_forced_gap(cfg, params, trajs) <= 2e-4


def test_observation_frame_reads_chat_template(tokenizer):
  before, after = prompts.observation_frame(tokenizer, "swirl")
  assert before == "<|im_end|>\n<|im_start|>user\n"
  assert after == "<|im_end|>\n<|im_start|>assistant\n"


def test_rows_out_of_context_room_end_cleanly(tokenizer, calc_tools):
  """An observation that leaves no room to answer ends its row (meta
  'context_full') instead of overflowing the row's context."""
  tasks = synthetic.arithmetic_tasks(2, seed=3)
  refs = [synthetic.reference_turns(t) for t in tasks]
  script = lambda r, k: refs[r][k]["action"]
  config = turns.RolloutConfig(fmt="swirl", max_turns=5)
  # Room for each first action and 3 tokens more: no calculator
  # observation fits.
  limit = 3 + max(
      len(prompts.prompt_ids(tokenizer, t, "swirl")[1])
      + len(tokenizer.encode_continuation(script(i, 0)))
      for i, t in enumerate(tasks))
  sampler = ScriptedSampler(tokenizer, script, limit=limit)
  trajs = engine_lib.RolloutEngine(sampler, tokenizer, calc_tools,
                                   config).run(tasks)
  for t in trajs:
    assert t.meta.get("context_full") and len(t.turns) == 1
    assert t.final_answer is None and not t.meta.get("turn_cap")
  assert not sampler.extended  # Nothing was appended past the room.
