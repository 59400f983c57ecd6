r"""Download the datasets the configs use into a data directory.

  python -m swirl_jax.main \
      --config=configs/data.py:datasets=gsm8k,hotpotqa,math

The workdir is the data directory. Without --workdir it is the one runs
read: `$SWIRL_JAX_DATA`, else `~/.cache/swirl_jax/data` (under
`$XDG_CACHE_HOME` if set). With another --workdir, point runs at it:
`export SWIRL_JAX_DATA=<workdir>`. Files come from pinned Hugging Face Hub
revisions (swirl_jax/tasks/prepare.py lists them) and are recorded in
`<workdir>/manifest.json`; a rerun fetches only what is missing or changed.

The defaults fetch what the paper configs run on: all of GSM8K, 10,000
HotPotQA train questions (SWiRL's), the HotPotQA Wikipedia abstracts as
the search corpus with its BM25 index (hotpotqa_wiki: a 643 MB download,
5.2M passages), and MATH with MATH500, AIME 24/25 and AMC23 (SimpleTIR's).
Smaller runs take limits, e.g.

  python -m swirl_jax.main \
      --config=configs/data.py:datasets=gsm8k,hotpotqa,hotpotqa_train=100 \
      --workdir=$HOME/swirl_data_small

Args: datasets (any of gsm8k, hotpotqa, hotpotqa_wiki, math; default all;
math includes MATH500, AIME 24/25 and AMC23), hotpotqa_train (HotPotQA
train questions to sample, default 10,000), hotpotqa_dev (dev distractor
questions, default 500), seed (of both samples), overwrite (fetch and
convert again).
"""

import ml_collections

from swirl_jax import config_lib
from swirl_jax.tasks import prepare


def get_config(arg=None):
  # 'datasets=gsm8k,hotpotqa,math': the names after the first come as bare
  # parts of the comma-separated arg.
  names, rest = [], []
  for part in (arg or "").split(","):
    key, eq, value = part.partition("=")
    if key.strip() == "datasets" and eq:
      names.append(value.strip())
    elif not eq and part.strip() in prepare.PRODUCTS:
      names.append(part.strip())
    else:
      rest.append(part)
  unknown = [n for n in names if n not in prepare.PRODUCTS]
  if unknown:
    raise config_lib.ConfigError(
        f"data job: unknown datasets {unknown}; valid: "
        f"{', '.join(prepare.PRODUCTS)}")
  a = config_lib.parse_arg(",".join(rest), hotpotqa_train=10000,
                           hotpotqa_dev=500, seed=0, overwrite=False)
  c = ml_collections.ConfigDict()
  c.job = "data"
  c.datasets = tuple(names or prepare.PRODUCTS)
  c.hotpotqa_train = a.hotpotqa_train  # SWiRL: 10,000 questions.
  c.hotpotqa_dev = a.hotpotqa_dev
  c.seed = a.seed
  c.overwrite = a.overwrite
  return c
