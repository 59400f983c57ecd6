r"""SWiRL on GSM8K with the calculator: stage 1 → filter → stage 2 → eval.

Accelerators (the paper's model; judge and reward model served over HTTP):

  python -m swirl_jax.main \
      --config=configs/swirl_gsm8k.py:model=gemma2_27b,checkpoint=/ckpt/gemma-2-27b-it,judge=http \
      --config.judge.model_name=JUDGE --config.reward.model_name=JUDGE \
      --workdir=/tmp/swirl_gsm8k

CPU (SmolLM2-135M-Instruct, the policy judging itself; tiny sizes):

  python -m swirl_jax.main --config=configs/swirl_gsm8k.py:runlocal \
      --workdir=/tmp/swirl_gsm8k_cpu

Args: model (preset), checkpoint, judge (model | http | programmatic),
runlocal, seed. Run one stage with `--config.stages=rl,eval`-style
overrides or the `swirl_<stage>` jobs.
"""

from swirl_jax import config_lib
from swirl_jax.swirl.configs import swirl_config


def get_config(arg=None):
  a = config_lib.parse_arg(arg, model="smollm2_135m", checkpoint="",
                           judge="model", runlocal=False, seed=0)
  return swirl_config("gsm8k", model=a.model, checkpoint=a.checkpoint,
                      judge=a.judge, runlocal=a.runlocal, seed=a.seed)
