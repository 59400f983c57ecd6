"""Runs one tiny job with a kill -9 at a chosen point, for test_resume.py.

  python tests/resume_driver.py SCENARIO WORKDIR [STAGE:K:MODE]

SCENARIO: simpletir (GRPO iterations with scripted turns through the real
sandbox; its one stage is 'train'), simpletir_async (the same at
staleness 1, with validation every 2 iterations; turns from
simpletir_script.py), simpletir_async2 (the same at staleness 2) or swirl
(the pipeline: stage1, filter, rl, eval). Kill points are the calls, in
order, of the functions that make a run's state: `jsonl.append` and
`jsonl.write_bytes` (every record and file written) and
`distributed.run_shared` / `run_local` (every batch of rollouts, samples or
evaluation), counted from the start of each stage. At the K-th point of
STAGE the process sends itself SIGKILL: MODE 'before' the call, 'after'
it, or 'torn' (half the bytes of an append written, then killed).

Two named kinds of point are counted over the whole run instead, with
STAGE 'queue' (the generator's `Queue.save` of an iteration's rollouts,
in its thread) or 'checkpoint' (a `Checkpointer.save` that writes one;
'after': once it is on disk). A run that ends prints, as its last line,
the JSON of each stage's kill points and of the named ones.
"""

import json
import os
import signal
import sys

import jax

jax.config.update("jax_default_matmul_precision", "highest")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from swirl_jax import config_lib, distributed, jsonl
from swirl_jax.rollout.scripted import ScriptedSampler
from swirl_jax.simpletir import pipeline
from swirl_jax.simpletir import train as simpletir_train
from swirl_jax.training import checkpoint
from swirl_jax.swirl import jobs

import simpletir_script
import small_tokenizer

_calls = {"stage": "", "n": 0, "counts": {}}
_kill = {"stage": "", "at": 0, "mode": ""}


def _die():
  os.kill(os.getpid(), signal.SIGKILL)


def _stage(name: str, run):
  def wrapped(*args, **kw):
    _calls["stage"], _calls["n"] = name, 0
    out = run(*args, **kw)
    _calls["counts"][name] = _calls["n"]
    return out
  return wrapped


def _hook(module, name):
  real = getattr(module, name)

  def wrapped(*args, **kw):
    _calls["n"] += 1
    now = _calls["stage"] == _kill["stage"] and _calls["n"] == _kill["at"]
    if now:
      if _kill["mode"] == "before":
        _die()
      if _kill["mode"] == "torn" and name == "append":
        data, _ = jsonl._encode(args[1])  # pylint: disable=protected-access
        os.makedirs(os.path.dirname(os.path.abspath(args[0])), exist_ok=True)
        with open(args[0], "ab") as f:
          f.write(data[:max(1, len(data) // 2)])
        _die()
    out = real(*args, **kw)
    if now:
      _die()
    return out

  setattr(module, name, wrapped)


NAMED = {"queue": 0, "checkpoint": 0}  # Named points reached so far.


def _named(kind: str, when: str) -> None:
  """The `kind` point being passed `when` ('before' counts it)."""
  if when == "before":
    NAMED[kind] += 1
  if _kill["stage"] == kind and NAMED[kind] == _kill["at"] and \
      _kill["mode"] == when:
    _die()


def _hook_named():
  real_save = pipeline.Queue.save

  def queue_save(self, it, version, trajs):
    _named("queue", "before")
    real_save(self, it, version, trajs)
    _named("queue", "after")
  pipeline.Queue.save = queue_save

  real_ckpt = checkpoint.Checkpointer.save

  def ckpt_save(self, state, *, force=False, extra=None):
    step, pos = int(jax.device_get(state.step)), int(
        jax.device_get(state.data_pos))
    if not self.due(step, force=force, data_pos=pos):
      return real_ckpt(self, state, force=force, extra=extra)
    _named("checkpoint", "before")
    out = real_ckpt(self, state, force=force, extra=extra)
    self.wait()  # On disk, then 'after'.
    _named("checkpoint", "after")
    return out
  checkpoint.Checkpointer.save = ckpt_save


def swirl_config():
  c = config_lib.load_config_module(
      os.path.join(ROOT, "configs", "swirl_synthetic_arith.py")).get_config(
          "model=tiny,judge=programmatic,runlocal")
  c.model.tokenizer = str(small_tokenizer.PATH)
  c.data.train_limit, c.data.eval_limit = 4, 2
  c.stage1.update(samples=2, tasks_per_batch=1, max_turns=2,
                  max_new_tokens=12, max_response_tokens=24)
  c.filter.strategy = "none"
  c.stage2.update(samples_per_state=2, states_per_step=4, max_new_tokens=8,
                  max_len=512)
  c.rl_iterations = 5
  c.rl_train.update(num_steps=5, mini_batch_size=8, checkpoint_every=2,
                    progress=False)
  c.sampler.max_cache_len = 512
  c.eval.policies = ("base", "rl")
  return c


def simpletir_config():
  c = config_lib.load_config_module(
      os.path.join(ROOT, "configs", "simpletir_math.py")).get_config(
          "model=tiny,runlocal,data=synthetic_arith")
  c.model.tokenizer = str(small_tokenizer.PATH)
  c.num_iterations, c.prompts_per_step, c.grpo.group_size = 5, 2, 4
  c.rollout.update(max_turns=2, max_new_tokens=24, max_response_tokens=48)
  c.sampler.max_cache_len = 512
  c.train.update(mini_batch_size=4, num_steps=10, checkpoint_every=3,
                 progress=False)
  return c


def _script_sampler(c, answers):
  """Scripted turns: right, void, wrong, right after output; iteration 2 is
  all void, so it is logged without an update."""
  def make(params, cfg, tok):
    del params, cfg

    def script(row, turn):
      gold = answers["gold"][row // 4]
      if answers["it"] == 2:
        return "```python\nprint(1"
      return [f"```python\nfinal_answer({gold})\n```\n",
              "```python\nprint(1",
              "```python\nfinal_answer(-1)\n```\n",
              [f"```python\nprint({gold})\n```\n",
               f"It prints {gold}, so \\boxed{{{gold}}}."][min(turn, 1)]
              ][row % 4]
    return ScriptedSampler(tok, script)
  del c
  return make


def run_simpletir(workdir):
  c = simpletir_config()
  answers = {"gold": [], "it": 0}
  engine = simpletir_train.engine_lib.RolloutEngine
  real = engine.run_pairs

  def run_pairs(self, pairs, **kw):
    answers["gold"] = [t.answer for t, _ in pairs[::4]]
    answers["it"] = next(i for i in range(c.num_iterations)  # The iteration.
                         if self.config.seed == distributed.mix_seed(
                             c.seed, "rollout", i))
    return real(self, pairs, **kw)

  engine.run_pairs = run_pairs
  _stage("train", simpletir_train.run)(
      c, workdir, make_sampler=_script_sampler(c, answers))


def run_simpletir_async(workdir, staleness=1):
  c = simpletir_config()
  c.staleness = staleness
  c.train.loss.tis_cap = 2.0
  c.validation.update(every=2, k=2, limit=2)
  _stage("train", lambda: simpletir_script.run(c, workdir))()


def main(argv):
  scenario, workdir = argv[1], argv[2]
  if len(argv) > 3:
    stage, at, mode = argv[3].split(":")
    _kill.update(stage=stage, at=int(at), mode=mode)
  for module, name in ((jsonl, "append"), (jsonl, "write_bytes"),
                       (distributed, "run_shared"),
                       (distributed, "run_local")):
    _hook(module, name)
  _hook_named()
  if scenario == "simpletir":
    run_simpletir(workdir)
  elif scenario == "simpletir_async":
    run_simpletir_async(workdir)
  elif scenario == "simpletir_async2":
    run_simpletir_async(workdir, staleness=2)
  else:
    run = jobs._RUN  # pylint: disable=protected-access
    for stage in ("stage1", "filter", "rl", "eval"):
      run[stage] = _stage(stage, run[stage])
    c = swirl_config()
    c.stages = ("stage1", "filter", "rl", "eval")
    jobs.run_pipeline(c, workdir)
  print(json.dumps({**_calls["counts"], **NAMED}))


if __name__ == "__main__":
  main(sys.argv)
