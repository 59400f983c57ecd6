r"""SWiRL on HotPotQA with BM25 search: stage 1 → filter → stage 2 → eval.

Accelerators (the paper's model; judge and reward model served over HTTP):

  python -m swirl_jax.main \
      --config=configs/swirl_hotpotqa.py:model=gemma2_27b,checkpoint=/ckpt/gemma-2-27b-it,judge=http \
      --config.judge.model_name=JUDGE --config.reward.model_name=JUDGE \
      --workdir=/tmp/swirl_hotpotqa

CPU (SmolLM2-135M-Instruct, the policy judging itself; tiny sizes):

  python -m swirl_jax.main --config=configs/swirl_hotpotqa.py:runlocal \
      --workdir=/tmp/swirl_hotpotqa_cpu

SWiRL's own settings (sampling, judge, filter, stage 2, SFT, CPU sizes) are
in configs/swirl_base.py; this file adds the data, the search corpora and
the step cap. Args: model (preset), checkpoint, judge (model | http |
programmatic), runlocal, seed. Run one stage with `--config.stages=rl,eval`-
style overrides or the `swirl_<stage>` jobs.
"""

import os

from swirl_jax import config_lib


def get_config(arg=None):
  c = config_lib.load_config_module(os.path.join(
      os.path.dirname(__file__), "swirl_base.py")).get_config(arg)
  c.data.update(train="hotpotqa", eval="hotpotqa", eval_split="dev")
  # Training questions search the train split's paragraphs; held-out ones
  # the dev split's.
  c.tools.update(names=("search",), search_corpus="hotpotqa:train")
  c.eval.search_corpus = "hotpotqa:dev"
  c.stage1.max_turns = 5  # The paper's step cap for QA.
  # The paper drops questions answerable in one search (read off stage 1's
  # own samples: stage1.easy_max_calls).
  c.stage1.drop_easy = True
  return c
