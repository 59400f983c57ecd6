r"""SWiRL filter ablation: stage 2 on steps kept by one of the four filters.

  for f in none process outcome process_outcome; do
    python -m swirl_jax.main \
        --config=configs/ablations/swirl_filter.py:filter=$f,data=gsm8k,model=gemma2_27b,checkpoint=/ckpt/gemma-2-27b-it \
        --workdir=/tmp/swirl_ablation
  done

The four runs share the workdir: stage 1 and the judge's labels are made
once and reused; each filter's stage 2 writes <workdir>/rl_<filter>. The
rest is the experiment configs/swirl_<data>.py. Args: filter, data (gsm8k |
hotpotqa | synthetic_arith | synthetic_multihop), model, checkpoint, judge,
runlocal, seed.

At CPU size (`runlocal`, data=gsm8k) the process and outcome filters keep
nothing: the bundled 135M judge calls every step BAD, and its stage 1
answers none of its questions right (0 of 32 samples). At CPU size the
filters are compared on the demo's synthetic problems, with their exact
judge (docs/results.md).
"""

import os

from swirl_jax import config_lib
from swirl_jax.swirl import filters


def get_config(arg=None):
  base = config_lib.load_config_module(os.path.join(
      os.path.dirname(__file__), "..", "swirl_base.py"))
  a = config_lib.parse_arg(arg, filter="process", data="gsm8k", **base.ARGS)
  if a.filter not in filters.STRATEGIES:
    raise config_lib.ConfigError(f"filter={a.filter!r}; valid: "
                                 f"{', '.join(filters.STRATEGIES)}")
  c = base.experiment(a.data).get_config(a)
  c.stages = ("stage1", "filter", "rl", "eval")
  c.filter.strategy = a.filter
  c.rl_name = f"rl_{a.filter}"
  c.eval.policies = ("base", c.rl_name)
  return c
