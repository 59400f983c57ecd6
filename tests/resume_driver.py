"""Runs one tiny job with a kill -9 at a chosen point, for test_resume.py.

  python tests/resume_driver.py SCENARIO WORKDIR [KILL_AT MODE]

SCENARIO: simpletir (GRPO iterations, scripted turns through the real
sandbox), stage1, stage2 (the `rl` stage, over stage 1 and filter outputs
already in WORKDIR) or eval. Kill points are the calls, in order, of the
functions that make a run's state: `jsonl.append` and `jsonl.write_bytes`
(every record and file written) and `distributed.run_shared` (every batch of
rollouts, samples or evaluation). At the KILL_AT-th call the process sends
itself SIGKILL: MODE 'before' the call, 'after' it, or 'torn' (half of the
bytes of an append written, then killed). Without KILL_AT it runs to the end
and prints the number of kill points it passed as its last line.
"""

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
from swirl_jax.simpletir import train as simpletir_train
from swirl_jax.swirl import jobs

_calls = {"n": 0}


def _die():
  os.kill(os.getpid(), signal.SIGKILL)


def _hook(module, name, kill_at: int, mode: str):
  real = getattr(module, name)

  def wrapped(*args, **kw):
    _calls["n"] += 1
    if _calls["n"] == kill_at:
      if mode == "before":
        _die()
      if mode == "torn" and name == "append":
        data, _ = jsonl._encode(args[1])  # pylint: disable=protected-access
        os.makedirs(os.path.dirname(os.path.abspath(args[0])), exist_ok=True)
        with open(args[0], "ab") as f:
          f.write(data[:max(1, len(data) // 2)])
        _die()
    out = real(*args, **kw)
    if _calls["n"] == kill_at:
      _die()
    return out

  setattr(module, name, wrapped)


def swirl_config():
  c = config_lib.load_config_module(
      os.path.join(ROOT, "configs", "swirl_synthetic_arith.py")).get_config(
          "model=tiny,judge=programmatic,runlocal")
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
    answers["it"] = self.config.seed - c.seed * 100003  # The iteration.
    return real(self, pairs, **kw)

  engine.run_pairs = run_pairs
  simpletir_train.run(c, workdir, make_sampler=_script_sampler(c, answers))


def main(argv):
  scenario, workdir = argv[1], argv[2]
  kill_at, mode = (int(argv[3]), argv[4]) if len(argv) > 4 else (0, "")
  for module, name in ((jsonl, "append"), (jsonl, "write_bytes"),
                       (distributed, "run_shared")):
    _hook(module, name, kill_at, mode)
  if scenario == "simpletir":
    run_simpletir(workdir)
  else:
    c = swirl_config()
    job = {"stage1": jobs.run_stage1_job, "stage2": jobs.run_rl_job,
           "eval": jobs.run_eval_job}[scenario]
    job(c, workdir)
  print(_calls["n"])


if __name__ == "__main__":
  main(sys.argv)
