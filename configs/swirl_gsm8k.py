r"""SWiRL on GSM8K with the calculator: stage 1 → filter → stage 2 → eval.

Accelerators (the paper's model; judge and reward model served over HTTP):

  python -m swirl_jax.main \
      --config=configs/swirl_gsm8k.py:model=gemma2_27b,checkpoint=/ckpt/gemma-2-27b-it \
      --workdir=/tmp/swirl_gsm8k

The judge and reward model: configs/swirl_base.py JUDGE_MODEL served by
vLLM at judge.base_url (`vllm serve Qwen/Qwen2.5-72B-Instruct`), or any
OpenAI-compatible endpoint (--config.judge.model_name=...,
--config.reward.model_name=...).

CPU (SmolLM2-135M-Instruct, the policy judging itself; tiny sizes; that
judge calls every step BAD, so stage 2 and SFT train on every step, filter
`none`):

  python -m swirl_jax.main --config=configs/swirl_gsm8k.py:runlocal \
      --workdir=/tmp/swirl_gsm8k_cpu

SWiRL's own settings (sampling, judge, filter, stage 2, SFT, CPU sizes) are
in configs/swirl_base.py (what differs from the paper: "Differences from
the papers", docs/differences.md); this file adds the data, the tool and the
step cap. Args: model (preset), checkpoint, judge (model | http | programmatic),
runlocal, seed. Run one stage with `--config.stages=rl,eval`-style
overrides or the `swirl_<stage>` jobs.
"""

import os

from swirl_jax import config_lib


def get_config(arg=None):
  c = config_lib.load_config_module(os.path.join(
      os.path.dirname(__file__), "swirl_base.py")).get_config(arg)
  c.data.update(train="gsm8k", eval="gsm8k", eval_split="test")
  c.tools.names = ("calculator",)
  c.stage1.max_turns = 10  # The paper's step cap for GSM8K.
  return c
