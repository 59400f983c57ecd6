r"""SWiRL's generalization table: any trained policy on another dataset.

The paper evaluates a policy trained on one task on the others, each with
the tool its data needs (its Table: trained on HotPotQA -> GSM8K with the
calculator; trained on GSM8K -> HotPotQA with search; both on the held-out
QA sets). This is the evaluation stage of the experiment config of the
evaluated dataset (its tool, corpus, step cap and judge), run on the base
policy and on the trained one:

  # HotPotQA-trained policy on GSM8K (the calculator):
  python -m swirl_jax.main \
      --config=configs/swirl_transfer.py:eval=gsm8k,policy=/runs/swirl_hotpotqa/rl/hf,model=gemma2_27b,checkpoint=/ckpt/gemma-2-27b-it \
      --workdir=/runs/transfer_hotpotqa_to_gsm8k
  # GSM8K-trained policy on HotPotQA (search over the Wikipedia abstracts):
  python -m swirl_jax.main \
      --config=configs/swirl_transfer.py:eval=hotpotqa,policy=/runs/swirl_gsm8k/rl/hf,model=gemma2_27b,checkpoint=/ckpt/gemma-2-27b-it \
      --workdir=/runs/transfer_gsm8k_to_hotpotqa
  # On MuSiQue (the 100 offline questions, search over their paragraphs):
  python -m swirl_jax.main \
      --config=configs/swirl_transfer.py:eval=musique,policy=/runs/swirl_hotpotqa/rl/hf,runlocal \
      --workdir=/tmp/transfer_musique

`<workdir>/eval/results.{json,md}`: exact-match accuracy, the judge's
answer correctness (`llm_correct`, the paper's metric), F1 and process
correctness, per policy ('base' and 'trained'); `eval/weights.json`: the
weights each loaded. BeerQA and CofCA have no copy on the Hugging Face Hub
the data job could pin, so they are not here (the README's "Differences
from the papers").

Args: eval (gsm8k | hotpotqa | musique), policy (a trained policy's
Hugging Face directory, e.g. <run>/rl/hf; '' evaluates the base only),
model, checkpoint, judge, runlocal, seed.
"""

import os

from swirl_jax import config_lib

# Evaluated dataset -> (experiment config, split, search corpus override).
EVAL = {"gsm8k": ("gsm8k", "test", ""),
        "hotpotqa": ("hotpotqa", "dev", ""),
        # MuSiQue's offline copy: 100 train questions and their paragraphs.
        "musique": ("hotpotqa", "train", "musique:train")}


def get_config(arg=None):
  base = config_lib.load_config_module(
      os.path.join(os.path.dirname(__file__), "swirl_base.py"))
  a = config_lib.parse_arg(arg, eval="gsm8k", policy="", **base.ARGS)
  if a.eval not in EVAL:
    raise config_lib.ConfigError(f"eval={a.eval!r}; valid: "
                                 f"{', '.join(EVAL)}")
  experiment, split, corpus = EVAL[a.eval]
  args = config_lib.parse_arg("", **base.ARGS)
  args.update({k: a[k] for k in base.ARGS})
  c = base.experiment(experiment).get_config(args)
  c.job = "swirl_eval"
  c.stages = ("eval",)
  c.data.update(eval=a.eval, eval_split=split)
  if corpus:
    c.tools.search_corpus = corpus
    c.eval.search_corpus = corpus
  c.eval.policies = ("base",) + ((f"trained={a.policy}",) if a.policy
                                 else ())
  return c
