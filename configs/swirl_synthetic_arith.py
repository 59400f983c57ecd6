r"""SWiRL on synthetic arithmetic word problems with the calculator.

  python -m swirl_jax.main --config=configs/swirl_synthetic_arith.py:runlocal \
      --workdir=/tmp/swirl_arith

The problems are generated (swirl_jax/tasks), each with its solution graph,
so the programmatic judge can label steps (`judge=programmatic`);
configs/demo.py builds its CPU demo on this file. SWiRL's own settings are
in configs/swirl_base.py. Args: model (preset), checkpoint, judge (model |
http | programmatic), runlocal, seed.
"""

import os

from swirl_jax import config_lib


def get_config(arg=None):
  c = config_lib.load_config_module(os.path.join(
      os.path.dirname(__file__), "swirl_base.py")).get_config(arg)
  c.data.update(train="synthetic_arith", eval="synthetic_arith",
                eval_split="test")
  c.tools.names = ("calculator",)
  c.stage1.max_turns = 6  # Problems take 2 to 4 steps, then the answer.
  return c
