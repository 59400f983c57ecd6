r"""SWiRL vs the SFT baseline on the same process-filtered steps.

  python -m swirl_jax.main \
      --config=configs/ablations/swirl_sft_vs_rl.py:data=gsm8k,runlocal \
      --workdir=/tmp/swirl_ablation

Args: data, model, checkpoint, judge, runlocal, seed (as the filter
ablations).
"""

from swirl_jax import config_lib
from swirl_jax.swirl.configs import swirl_config


def get_config(arg=None):
  a = config_lib.parse_arg(arg, data="gsm8k", model="smollm2_135m",
                           checkpoint="", judge="model", runlocal=False,
                           seed=0)
  c = swirl_config(a.data, model=a.model, checkpoint=a.checkpoint,
                   judge=a.judge, runlocal=a.runlocal, seed=a.seed)
  c.stages = ("stage1", "filter", "rl", "sft", "eval")
  c.eval.policies = ("base", "rl", "sft")
  return c
