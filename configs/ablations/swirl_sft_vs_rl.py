r"""SWiRL vs the SFT baseline on the same process-filtered steps.

  python -m swirl_jax.main \
      --config=configs/ablations/swirl_sft_vs_rl.py:data=gsm8k,model=gemma2_27b,checkpoint=/ckpt/gemma-2-27b-it \
      --workdir=/tmp/swirl_ablation

The experiment configs/swirl_<data>.py, every stage but the report: stage 2
and the SFT baseline (configs/swirl_base.py `sft_train`: 500 steps, lr
1e-6) train on the same filtered steps, and both are evaluated against the
base policy. Args: data (gsm8k | hotpotqa | synthetic_arith |
synthetic_multihop), model, checkpoint, judge, runlocal, seed. With
`runlocal` and the bundled model as judge both train on every step (the
filter `none`, configs/swirl_base.py), not on process-filtered ones.
"""

import os

from swirl_jax import config_lib


def get_config(arg=None):
  base = config_lib.load_config_module(os.path.join(
      os.path.dirname(__file__), "..", "swirl_base.py"))
  a = config_lib.parse_arg(arg, data="gsm8k", **base.ARGS)
  c = base.experiment(a.data).get_config(a)
  c.stages = ("stage1", "filter", "rl", "sft", "eval")
  c.eval.policies = ("base", "rl", "sft")
  return c
