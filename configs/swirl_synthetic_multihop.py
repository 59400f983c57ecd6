r"""SWiRL on synthetic multi-hop questions with BM25 search.

  python -m swirl_jax.main \
      --config=configs/swirl_synthetic_multihop.py:runlocal,judge=programmatic \
      --workdir=/tmp/swirl_multihop

Questions over a generated world (swirl_jax/tasks/synthetic.py), one search
a hop. Each split has a world of its own (its seed), so the held-out
questions search the test split's paragraphs. SWiRL's own settings are in configs/swirl_base.py.
Args: model (preset), checkpoint, judge (model | http | programmatic),
runlocal, seed.
"""

import os

from swirl_jax import config_lib


def get_config(arg=None):
  c = config_lib.load_config_module(os.path.join(
      os.path.dirname(__file__), "swirl_base.py")).get_config(arg)
  c.data.update(train="synthetic_multihop", eval="synthetic_multihop",
                eval_split="test")
  c.tools.update(names=("search",), search_corpus="synthetic_multihop:train")
  c.eval.search_corpus = "synthetic_multihop:test"
  c.stage1.max_turns = 5  # The paper's step cap for QA.
  return c
