r"""The rollout viewer of a run: rebuilds `<workdir>/rollouts.html`.

  python -m swirl_jax.main --config=configs/view.py \
      --workdir=/tmp/simpletir_demo

Every SimpleTIR training run and SWiRL pipeline writes the page at its
end; this rebuilds it in any workdir (one still running, copied, or
older than the viewer), then prints its file:// address to open in a
browser. It reads SimpleTIR's rollouts/iter_*.jsonl, SWiRL's stage1/
shards with the filter stage's judged steps, and both methods' eval/
trajectories, in the workdir and any directory below it (a seeds job's
seed_<s>/). docs/viewer.md: the page, its filters and what it costs.

Args: compare (other workdirs, 'DIR' or 'label=DIR', joined by '+'; the
page then goes to compare.html and its Compare tab pairs any two
policies), tokenizer (a tokenizer directory, .gguf file or 'bundled',
when the workdir holds none), out (the page's path), iterations (at
most this many training iterations per run, evenly spaced; 0, the
default: all), inline_mb (chunks
up to this size go inside the page), wandb ('offline' or 'online': also
export the metrics and sample trajectory tables to W&B; needs the wandb
extra), wandb_project, samples (trajectories per W&B table):

  python -m swirl_jax.main --config=configs/view.py:compare=off=/tmp/st_off \
      --workdir=/tmp/st_on
  python -m swirl_jax.main --config=configs/view.py:wandb=offline \
      --workdir=/tmp/simpletir_demo
"""

import ml_collections

from swirl_jax import config_lib


def get_config(arg=None):
  a = config_lib.parse_arg(arg, compare="", tokenizer="", out="",
                           iterations=0, inline_mb=24.0, wandb="",
                           wandb_project="swirl_jax", samples=16)
  cfg = ml_collections.ConfigDict()
  cfg.job = "view"
  cfg.compare = a.compare
  cfg.tokenizer = a.tokenizer
  cfg.out = a.out
  cfg.iterations = a.iterations  # Per place; 0: every iteration.
  cfg.inline_mb = a.inline_mb
  cfg.wandb = ml_collections.ConfigDict(dict(
      mode=a.wandb, project=a.wandb_project, samples=a.samples))
  return cfg
