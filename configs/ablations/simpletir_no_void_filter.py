r"""SimpleTIR with void-turn filtering off (the ablation of the paper).

  python -m swirl_jax.main \
      --config=configs/ablations/simpletir_no_void_filter.py:model=smollm2_135m,runlocal \
      --workdir=/tmp/simpletir_novoid

Same args as configs/simpletir_math.py; `filter_void` is forced off.
"""

import os

from swirl_jax import config_lib


def _base():
  return config_lib.load_config_module(
      os.path.join(os.path.dirname(__file__), "..", "simpletir_math.py"))


def get_config(arg=None):
  c = _base().get_config(arg)
  c.grpo.filter_void = False
  return c
