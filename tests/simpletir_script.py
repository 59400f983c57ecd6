"""SimpleTIR runs with scripted turns through the real sandbox, for the
tests (test_simpletir.py, test_async_simpletir.py, the multi-host worker).

Turns are replayed (a random tiny model rarely closes a code block), so
rewards vary within each group. Sample k of a group: right, void, wrong,
right after an output (`script`).
"""

import importlib.util
import pathlib

from swirl_jax.rollout import engine as engine_lib
from swirl_jax.rollout.scripted import ScriptedSampler
from swirl_jax.simpletir import train

import small_tokenizer  # pylint: disable=g-bad-import-order

ROOT = pathlib.Path(__file__).resolve().parents[1]


def config(vocab: str = "small", **rollout):
  """configs/simpletir_math.py, tiny: 3 iterations of 2 prompts x 4. With
  the tests' small vocabulary (tests/small_tokenizer.py), or SmolLM2's
  (`vocab='bundled'`: the runs whose figures were recorded with it)."""
  spec = importlib.util.spec_from_file_location(
      "simpletir_math", ROOT / "configs" / "simpletir_math.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config("model=tiny,runlocal,data=synthetic_arith")
  if vocab == "small":
    c.model.tokenizer = str(small_tokenizer.PATH)
  c.num_iterations = 3
  c.prompts_per_step = 2
  c.grpo.group_size = 4
  c.rollout.update(max_turns=2, max_new_tokens=24, max_response_tokens=48,
                   **rollout)
  c.sampler.max_cache_len = 512
  c.train.mini_batch_size = 4
  c.train.num_steps = 12
  c.train.progress = False
  return c


def script(gold: str, k: int, turn: int) -> str:
  """Sample k's turn `turn` for a task whose answer is `gold`."""
  return [f"```python\nfinal_answer({gold})\n```\n",
          "```python\nprint(1",
          "```python\nfinal_answer(-1)\n```\n",
          [f"```python\nprint({gold})\n```\n",
           f"It prints {gold}, so \\boxed{{{gold}}}."][min(turn, 1)]][k % 4]


def run(c, workdir, setattr_=setattr) -> None:
  """`train.run(c, workdir)` with scripted turns: each row plays its
  pair's (task, sample k) `script`. `setattr_` patches the engine
  (pytest's `monkeypatch.setattr` undoes it)."""
  current = {}  # Rollout (thread) -> its pairs.
  real = engine_lib.RolloutEngine.run_pairs

  def run_pairs(self, pairs, **kw):
    current["pairs"] = pairs
    return real(self, pairs, **kw)

  def make_sampler(params, cfg, tok):
    del params, cfg
    def turn(row, turn_no):
      task, k = current["pairs"][row]
      return script(task.answer, k, turn_no)
    return ScriptedSampler(tok, turn)

  setattr_(engine_lib.RolloutEngine, "run_pairs", run_pairs)
  train.run(c, str(workdir), make_sampler=make_sampler)
