"""SWiRL: stage 1 resume, stage 2 plumbing and no tools, end to end."""

import json
import os
import pathlib

import jax
import numpy as np
import pytest

from swirl_jax.models import decoder, loading
from swirl_jax import config_lib
from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout import turns
from swirl_jax.evaluation import agent_eval
from swirl_jax.rollout.records import StepUnit, Trajectory, read_jsonl
from swirl_jax.rollout.scripted import ScriptedSampler
from swirl_jax.swirl import jobs, stage1, stage2
from swirl_jax.tasks import synthetic
from swirl_jax.tasks.records import Task
from swirl_jax.tools import registry
from swirl_jax.training import step as step_lib

import small_tokenizer  # pylint: disable=g-bad-import-order

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer():
  return loading.load_tokenizer("bundled")


class _Killed(Exception):
  pass


def test_stage1_resume_has_each_pair_once(tmp_path, tokenizer):
  tasks = synthetic.arithmetic_tasks(5, seed=2)
  refs = {t.id: synthetic.reference_turns(t) for t in tasks}
  calls = {"n": 0}

  class Loop(engine_lib.RolloutEngine):
    def run_pairs(self, pairs):
      calls["n"] += 1
      if calls["n"] == 3 and kill:
        raise _Killed  # The third batch dies in flight.
      return super().run_pairs(pairs)

  def script(row, turn):
    return "<answer>0</answer>"

  out = str(tmp_path / "stage1")
  tools = registry.build_tools(("calculator",))
  cfg = turns.RolloutConfig(fmt="swirl", max_turns=3)
  kill = True
  loop = Loop(ScriptedSampler(tokenizer, script), tokenizer, tools, cfg)
  with pytest.raises(_Killed):
    stage1.generate(loop, tasks, out, samples=2, tasks_per_batch=1)
  assert len(stage1.read_trajectories(out)) == 4  # Two whole batches.
  # A writer killed mid-line leaves a torn tail; the rerun must cope.
  shard = os.path.join(out, stage1.SHARD.format(0))
  with open(shard, "a") as f:
    f.write('{"task_id": "torn", "sample_')
  kill = False
  loop = Loop(ScriptedSampler(tokenizer, script), tokenizer, tools, cfg)
  trajs = stage1.generate(loop, tasks, out, samples=2, tasks_per_batch=1)
  on_disk = stage1.read_trajectories(out)
  pairs = [(t.task_id, t.sample_index) for t in on_disk]
  assert sorted(pairs) == sorted({(t.id, k) for t in tasks for k in range(2)})
  assert len(pairs) == len(set(pairs)) == len(trajs) == 10
  raw = [json.loads(l) for l in open(shard)]  # No torn or duplicate lines.
  assert len(raw) == 10
  del refs


def test_easy_tasks():
  from swirl_jax.rollout.records import Trajectory, Turn
  one = Trajectory(task_id="a", outcome=True, turns=[Turn(tool="search"),
                                                     Turn(answer="x")])
  two = Trajectory(task_id="b", outcome=True, turns=[
      Turn(tool="search"), Turn(tool="search"), Turn(answer="x")])
  wrong = Trajectory(task_id="c", outcome=False, turns=[Turn(answer="x")])
  trajs = [one, two, wrong]
  assert stage1.easy_tasks(trajs) == {"a"}
  # The bound is the argument's: two calls make "b" easy, none leaves "a".
  assert stage1.easy_tasks(trajs, max_calls=2) == {"a", "b"}
  assert stage1.easy_tasks(trajs, max_calls=0) == set()


def _units(n):
  rng = np.random.RandomState(0)
  return [StepUnit(trajectory_id=f"t{i}/0", step_index=0,
                   state_ids=rng.randint(3, 200, 5 + i).tolist(),
                   state_text=f"s{i}", action_ids=[7, 8], action_text="a")
          for i in range(n)]


class _LengthJudge:
  """A reward model in miniature: P(GOOD) from the action's length."""

  def score(self, states, actions, *, task_ids=None):
    del task_ids
    return [len(s + a) % 7 / 7 for s, a in zip(states, actions)]


def test_stage2_samples_do_not_depend_on_the_batch_split():
  """What makes stage 2's split over hosts and generate calls exact: a
  state's G sampled actions and rewards are the same (log-probs to
  rounding) whether it is sampled with the whole step's states or with
  part of them."""
  from swirl_jax.models import presets  # pylint: disable=g-import-not-at-top
  from swirl_jax.sampling.sampler import Sampler, SamplerConfig  # pylint: disable=g-import-not-at-top
  cfg = presets.get_preset("tiny")
  params = decoder.init_params(cfg, jax.random.key(0))
  tok = loading.load_tokenizer("bundled")
  sampler = Sampler(params, cfg, tok, SamplerConfig(max_cache_len=64))
  c = stage2.Stage2Config(samples_per_state=3, max_new_tokens=6)
  units = _units(4)
  a1, r1 = stage2.sample_and_score(sampler, _LengthJudge(), units, c,
                                    seed=5)
  parts = [stage2.sample_and_score(sampler, _LengthJudge(), part, c, seed=5)
           for part in (units[:1], units[1:])]
  a2 = stage2.Actions(*(sum((getattr(a, f) for a, _ in parts), [])
                        for f in ("ids", "logprobs", "texts")))
  r2 = np.concatenate([r for _, r in parts])
  assert (a1.ids, a1.texts) == (a2.ids, a2.texts)
  np.testing.assert_array_equal(r1, r2)
  # Log-probs only to float rounding: a batch of other rows' shape is
  # another matmul program.
  np.testing.assert_allclose(np.concatenate(a1.logprobs),
                             np.concatenate(a2.logprobs), atol=1e-5)
  acts, rewards = a1, r1
  assert rewards.shape == (4, 3) and len(acts.ids) == len(acts.texts) == 12
  assert len({tuple(i) for i in acts.ids}) > 1  # Rows sample their own.
  direct = stage2.sample_actions(sampler, units, c, seed=5)
  assert acts.ids == [list(map(int, i)) for i in direct.ids]
  for got, want in zip(acts.logprobs, direct.logprobs):
    np.testing.assert_array_equal(got, np.asarray(want, np.float32))
  other = stage2.sample_and_score(sampler, _LengthJudge(), units, c,
                                  seed=6)[0]
  assert other.ids != acts.ids  # The step's seed matters.
  # In generate calls of at most 5 rows (12 rows: 5 + 5 + 2): the same.
  small = Sampler(params, cfg, tok, SamplerConfig(max_cache_len=64,
                                                  max_rows=5))
  split = stage2.sample_actions(small, units, c, seed=5)
  assert split.ids == direct.ids and split.texts == direct.texts


def test_stage2_batch_and_loss_equal_the_formulas():
  units = _units(2)
  c = stage2.Stage2Config(samples_per_state=3, advantage="mean")
  acts = stage2.Actions(
      ids=[[10 + k, 20 + k] for k in range(6)],
      logprobs=[np.full(2, -1.0, np.float32)] * 6, texts=["x"] * 6)
  rewards = np.array([[1.0, 0.0, 0.5], [0.2, 0.2, 0.8]], np.float32)
  batch = stage2.rl_batch(units, acts, rewards, c, mini_batch_size=1)
  want_adv = (rewards - rewards.mean(1, keepdims=True)).reshape(-1)
  np.testing.assert_allclose(batch["advantages"][:6], want_adv, atol=1e-6)
  for r in range(6):
    u = units[r // 3]
    n = len(u.state_ids)
    assert batch["tokens"][r, :n].tolist() == u.state_ids
    assert batch["tokens"][r, n:n + 2].tolist() == acts.ids[r]
    assert batch["loss_mask"][r].tolist() == [0] * n + [1, 1] + [0] * (
        batch["loss_mask"].shape[1] - n - 2)
  # The step's loss: -mean over rows of advantage * sum of action log-probs.
  mc = config_lib.model_config("tiny", "")
  cfg, params, _ = loading.load_policy(mc)
  loss_cfg = step_lib.default_loss_config()
  loss_cfg.kind = "stepwise_pg"
  b = {k: jax.numpy.asarray(v[:6]) for k, v in batch.items()}
  loss, _ = step_lib.policy_loss(params, cfg, loss_cfg, b)
  logits, _ = decoder.forward(params, cfg, b["tokens"],
                              mask_BT=b["attention_mask"])
  lp = jax.nn.log_softmax(logits[:, :-1], -1)
  tok_lp = np.take_along_axis(np.asarray(lp), np.asarray(b["tokens"])[:, 1:,
                                                                     None],
                              2)[..., 0]
  action_lp = (tok_lp * np.asarray(b["loss_mask"])[:, 1:]).sum(1)
  want = -np.mean(want_adv * action_lp)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)


def _tiny_config(workdir_filter="none"):
  c = config_lib.load_config_module(
      str(ROOT / "configs" / "swirl_synthetic_arith.py")).get_config(
          "model=tiny,judge=programmatic,runlocal")
  c.model.tokenizer = str(small_tokenizer.PATH)
  c.data.train_limit, c.data.eval_limit = 3, 2
  c.stage1.update(samples=2, tasks_per_batch=3, max_turns=2,
                  max_new_tokens=12, max_response_tokens=24)
  c.stage2.update(samples_per_state=2, states_per_step=4, max_new_tokens=8,
                  max_len=512)
  c.rl_iterations = 2
  c.rl_train.num_steps = 2
  c.rl_train.mini_batch_size = 8
  c.sft_train.num_steps = 2
  c.sft_train.mini_batch_size = 8
  c.rl_train.progress = c.sft_train.progress = False
  c.sampler.max_cache_len = 512
  c.filter.strategy = workdir_filter
  return c


def test_stage2_with_the_policy_as_reward_model(tmp_path):
  """A model reward judge without a checkpoint is the initial policy,
  frozen: it keeps scoring after the trainer's steps have donated the
  weights it started from."""
  c = _tiny_config()
  c.stages = ("stage1", "filter", "rl")
  c.reward.kind = "model"
  c.reward.model.checkpoint = ""
  jobs.run_pipeline(c, str(tmp_path))
  lines = [json.loads(l) for l in open(tmp_path / "rl" / "metrics.jsonl")]
  assert len(lines) == 2
  # P(GOOD) from a random tiny model: strictly between 0 and 1.
  assert all(0 < l["reward"] < 1 for l in lines)


def test_end_to_end_tiny(tmp_path, monkeypatch):
  """Every job in one workdir: stage 1, filter, stage 2, SFT, evaluation;
  stage 2 and SFT run no tool."""
  c = _tiny_config()
  c.stages = ("stage1", "filter")
  jobs.run_pipeline(c, str(tmp_path))
  from swirl_jax.tools import calculator, sandbox, search  # pylint: disable=g-import-not-at-top
  def boom(*a, **k):
    raise AssertionError("a tool ran in stage 2")
  with monkeypatch.context() as m:
    for cls, name in ((calculator.Calculator, "batch"),
                      (search.SearchTool, "batch"),
                      (sandbox.Sandbox, "run_batch")):
      m.setattr(cls, name, boom)
    built = []
    real = registry.build_tools
    m.setattr(registry, "build_tools",
              lambda *a, **k: built.append(a) or real(*a, **k))
    c.stages = ("rl", "sft")
    jobs.run_pipeline(c, str(tmp_path))
    assert not built
  with registry.forbidden("test"), pytest.raises(RuntimeError, match="test"):
    registry.build_tools(("calculator",))
  c.stages = ("eval",)
  jobs.run_pipeline(c, str(tmp_path))
  report = json.loads((tmp_path / "filter" / "report.json").read_text())
  assert set(report) >= {"none", "process", "outcome", "process_outcome"}
  units = read_jsonl(str(tmp_path / "filter" / "units.jsonl"), StepUnit)
  assert units and all(u.process_good is not None for u in units)
  for name in ("rl", "sft"):
    assert (tmp_path / name / "hf" / "config.json").exists()
    assert (tmp_path / name / "metrics.jsonl").exists()
  res = json.loads((tmp_path / "eval" / "results.json").read_text())
  assert set(res) == {"base", "rl", "sft"}
  # A random tiny policy writes 12 tokens and no step or answer: one void
  # turn a question, the same for all three (recorded from two runs).
  want = dict(n=2.0, accuracy=0.0, f1=0.0, answered=0.0, steps=2.0,
              process_correctness=0.0, turns=1.0, response_len=12.0,
              void_rate=1.0, turn_cap_rate=0.0, overlong_rate=0.0,
              tool_use_rate=0.0, tool_solved_rate=0.0)
  assert res == {"base": want, "rl": want, "sft": want}
  assert json.loads((tmp_path / "eval" / "weights.json").read_text()) == {
      "base": "", "rl": str(tmp_path / "rl" / "hf"),
      "sft": str(tmp_path / "sft" / "hf")}
  assert (tmp_path / "eval" / "results.md").read_text().startswith("| policy")
  # Any trained policy by directory ('label=DIR'), judged by a model with
  # its own checkpoint: the base policy is not loaded at all.
  loaded = []
  real_load = loading.load_policy
  monkeypatch.setattr(loading, "load_policy", lambda m, **kw: (
      loaded.append(m.checkpoint), real_load(m, **kw))[1])
  c.eval.policies = (f"other={tmp_path / 'rl' / 'hf'}",)
  c.judge.kind = "model"
  c.judge.model.checkpoint = str(tmp_path / "sft" / "hf")
  jobs.run_pipeline(c, str(tmp_path / "other"))
  assert loaded == [str(tmp_path / "rl" / "hf"), str(tmp_path / "sft" / "hf")]
  res = json.loads((tmp_path / "other" / "eval" / "results.json")
                   .read_text())
  assert json.loads((tmp_path / "other" / "eval" / "weights.json")
                    .read_text()) == {"other": str(tmp_path / "rl" / "hf")}
  assert res["other"]["llm_correct"] == 0.0  # No answer: never asked.
  c.eval.policies = (f"other={tmp_path / 'nothing'}",)
  with pytest.raises(FileNotFoundError, match="no exported policy"):
    jobs.run_pipeline(c, str(tmp_path / "other"))


class _Outcome:
  """An outcome judge that matches answers by their digits."""

  def __init__(self):
    self.asked = []

  def label(self, questions, predictions, golds):
    self.asked += list(zip(questions, predictions, golds))
    return [p.strip("$ ") == g for p, g in zip(predictions, golds)]


def test_llm_correct_asks_the_judge_about_each_answer():
  tasks = [Task(id=f"t{i}", question=f"q{i}", answers=(str(i),),
                source="gsm8k")
           for i in range(3)]
  trajs = [Trajectory(task_id="t0", final_answer="$0"),
           Trajectory(task_id="t1", final_answer="7"),
           Trajectory(task_id="t2")]  # No answer: wrong, not asked.
  judge = _Outcome()
  out = agent_eval.summarize(trajs, tasks, outcome_judge=judge)
  assert out["llm_correct"] == pytest.approx(1 / 3)
  assert out["accuracy"] == pytest.approx(1 / 3)
  assert judge.asked == [("q0", "$0", "0"), ("q1", "7", "1")]
