r"""SWiRL on HotPotQA with BM25 search: stage 1 → filter → stage 2 → eval.

Accelerators (the paper's model; judge and reward model served over HTTP):

  python -m swirl_jax.main \
      --config=configs/swirl_hotpotqa.py:model=gemma2_27b,checkpoint=/ckpt/gemma-2-27b-it \
      --workdir=/tmp/swirl_hotpotqa

The judge and reward model: configs/swirl_base.py JUDGE_MODEL served by
vLLM at judge.base_url (`vllm serve Qwen/Qwen2.5-72B-Instruct`), or any
OpenAI-compatible endpoint (--config.judge.model_name=...,
--config.reward.model_name=...). Search runs over the HotPotQA Wikipedia
abstracts (5.2M passages, hotpotqa:wiki), which the data job fetches and
indexes (configs/data.py:datasets=hotpotqa_wiki).

CPU (SmolLM2-135M-Instruct, the policy judging itself; tiny sizes; each
split searches its own questions' paragraphs, a closed corpus):

  python -m swirl_jax.main --config=configs/swirl_hotpotqa.py:runlocal \
      --workdir=/tmp/swirl_hotpotqa_cpu

SWiRL's own settings (sampling, judge, filter, stage 2, SFT, CPU sizes) are
in configs/swirl_base.py (what differs from the paper: the README's
"Differences from the papers"); this file adds the data, the search corpora
and the step cap. Args: model (preset), checkpoint, judge (model | http |
programmatic), runlocal, seed. Run one stage with `--config.stages=rl,eval`-
style overrides or the `swirl_<stage>` jobs.
"""

import os

from swirl_jax import config_lib


def get_config(arg=None):
  base = config_lib.load_config_module(os.path.join(
      os.path.dirname(__file__), "swirl_base.py"))
  a = base.args(arg)
  c = base.get_config(a)
  c.data.update(train="hotpotqa", eval="hotpotqa", eval_split="dev")
  # One open corpus for training and held-out questions: the Wikipedia
  # abstracts HotPotQA was built from, not the questions' own paragraphs.
  c.tools.update(names=("search",), search_corpus="hotpotqa:wiki")
  c.eval.search_corpus = ""
  if a.runlocal:  # CPU sizes: each split's own paragraphs.
    c.tools.search_corpus = "hotpotqa:train"
    c.eval.search_corpus = "hotpotqa:dev"
  c.stage1.max_turns = 5  # The paper's step cap for QA.
  # The paper drops questions answerable in one search (read off stage 1's
  # own samples: stage1.easy_max_calls).
  c.stage1.drop_easy = True
  return c
