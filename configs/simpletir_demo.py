r"""SimpleTIR on a CPU: GRPO with the Python sandbox, small.

  python -m swirl_jax.main --config=configs/simpletir_demo.py \
      --workdir=/tmp/simpletir_demo

Problems a small policy cannot answer without running code ("What is the
remainder of 47 * 86 divided by 51?", `synthetic.compute_tasks`). A
"mini" policy (4 layers, a vocabulary learnt for the task) is
warm-started on a mix of
demonstrations (`tasks/demonstrations.py`): half run the expression in a
```python block and box the printed value, the rest answer without code
(a guess), write code that fails, or leave a block unclosed (a void
turn). The base policy so solves some problems, and errs whenever it
skips the tool. Then SimpleTIR's loop runs as in the paper: G rollouts per
prompt at temperature 1 through the sandbox, 1/0 rewards, void-turn
filtering, GRPO advantages, group filters, and the clipped surrogate
(0.2 / 0.28, dual clip 3, no KL).

Outputs in the workdir: metrics.jsonl, report.md and reward.png (reward
and void rate per iteration), rollouts/, checkpoints, warmstart/ (with
criterion.json: the warm start's copy-rate checks), and the held-out
table of the base and trained policies (heldout.md, printed at the end;
eval/).

Args: filter_void, warmstart_from (a workdir whose warm start to reuse),
smoke (a 1-minute run, for tests), seed, seeds (> 0: seeds 0 .. seeds-1
in <workdir>/seed_<s>, each warm-started, trained and evaluated on 128
held-out problems, avg@4, with the base policy beside it; the table's
mean and spread in <workdir>/seeds.md; job `simpletir_seeds`,
swirl_jax/simpletir/seeds.py), first_seed (with seeds: seeds first_seed
.. first_seed+seeds-1; the table covers every finished seed in the
workdir, so a later run extends it), ablation ('void': with seeds, each
seed trains the void filter on and off from its one warm start):

  python -m swirl_jax.main --config=configs/simpletir_demo.py:seeds=3 \
      --workdir=/tmp/simpletir_seeds
  python -m swirl_jax.main \
      --config=configs/simpletir_demo.py:seeds=3,ablation=void \
      --workdir=/tmp/simpletir_void

single_turn ('never': the warm start's demonstrations end at their code
block, `demonstrations.py`'s `code_only`, or guess, so the policy has
never seen an execution result, SimpleTIR's regime for the void filter;
'rarely': a tenth of them show it):

  python -m swirl_jax.main \
      --config=configs/simpletir_demo.py:seeds=1,ablation=void,single_turn=never \
      --workdir=/tmp/simpletir_void_single

staleness (k > 0: rollouts sampled k policy versions behind the update,
while it runs; swirl_jax/simpletir/pipeline.py), with truncated importance
sampling (loss.tis_cap = TIS_CAP), which it needs with the trainer's old
log-probs. With seeds, each seed trains two arms from one warm start, the
synchronous loop ('sync') and staleness k ('staleness_k'), both with TIS,
and the table gives each one's held-out gain over the base with its
spread over the seeds:

  python -m swirl_jax.main \
      --config=configs/simpletir_demo.py:seeds=3,staleness=1 \
      --workdir=/tmp/simpletir_staleness
"""

import os

from swirl_jax import config_blocks, config_lib

ABLATIONS = {"": (), "void": (("void_filter", "grpo.filter_void", True),
                              ("no_void_filter", "grpo.filter_void", False))}


def _simpletir_math():
  return config_lib.load_config_module(
      os.path.join(os.path.dirname(__file__), "simpletir_math.py"))


# Warm starts whose demonstrations (nearly) never show an execution result
# (docs/results.md, "The void filter in the single-turn regime").
SINGLE_TURN = {"": None,
               "never": dict(code_only=0.5, direct=0.5),
               "rarely": dict(tool=0.1, code_only=0.65, direct=0.25)}

# Truncated importance sampling's cap with staleness (verl's TIS default).
TIS_CAP = 2.0


def get_config(arg=None):
  a = config_lib.parse_arg(arg, filter_void=True, warmstart_from="",
                           smoke=False, seed=0, seeds=0, first_seed=0,
                           ablation="", staleness=0, single_turn="")
  if a.ablation not in ABLATIONS:
    raise config_lib.ConfigError(f"ablation {a.ablation!r}; valid: "
                                 f"{', '.join(map(repr, ABLATIONS))}")
  if a.ablation and a.staleness:
    raise config_lib.ConfigError("ablation and staleness are two seed "
                                 "comparisons: give one of them")
  c = _simpletir_math().get_config(
      f"model=mini,data=synthetic_compute,runlocal=True,"
      f"filter_void={a.filter_void},seed={a.seed}")
  c.model.tokenizer = "bundled"  # The base vocabulary's special tokens.
  w = c.warmstart = config_blocks.warmstart_cpu_demo("simpletir", a.seed)
  # Half the demonstrations run code; the rest err in the ways GRPO and
  # the void filter are about (module docstring).
  w.mix = dict(tool=0.5, direct=0.25, bad_code=0.1, void=0.15)
  if a.single_turn not in SINGLE_TURN:
    raise config_lib.ConfigError(f"single_turn {a.single_turn!r}; valid: "
                                 f"{', '.join(map(repr, SINGLE_TURN))}")
  w.mix = SINGLE_TURN[a.single_turn] or w.mix
  # Until its samples copy the problem's numbers into code a quarter of
  # the time (warmstart.py: the criterion), checked every 40 steps, by
  # step 960 at most; the cosine decays over 480 steps, then holds. At a
  # fixed 480 steps, seed 0 stopped where copying had only begun (sampled
  # copy rate 0.09; 0.27 at 720, 0.33 at 840), and float rounding (one
  # CPU's sums against another's) decided how far it got: held-out avg@4
  # of the base 0.02 on one instruction set, 0.20 on another.
  w.train.num_steps = 960
  w.train.optim.decay_steps = 480
  w.criterion.update(min_copy_rate=0.25, every=40)
  if a.warmstart_from:
    w.enabled = False
    c.model.checkpoint = c.model.tokenizer = str(
        config_blocks.warmstart_hf_dir(a.warmstart_from))
  c.prompts_per_step, c.grpo.group_size = 16, 8
  c.grpo.accuracy_band = (0.1, 0.9)  # SimpleTIR's.
  c.num_iterations = 10
  c.void_grad_every = 2  # The void rows' gradient vs the kept rows'.
  c.rollout.update(max_turns=3, max_new_tokens=32, max_response_tokens=96)
  c.max_seq_len = c.sampler.max_cache_len = 256
  # Held out: 128 problems no training or demonstration split holds,
  # 4 samples each at the training temperature (avg@4, pass@4).
  c.eval.update(limit=128, k=4, max_turns=3, temperature=1.0, top_p=1.0,
                max_new_tokens=32, max_response_tokens=96, max_cache_len=256)
  t = c.train
  t.mini_batch_size = 64
  t.optim.lr = 2e-4  # Tool use near 0.9 in 5 iterations (1e-4: in 10).
  t.checkpoint_every = 5
  c.seeds, c.first_seed = a.seeds, a.first_seed
  c.arms = ABLATIONS[a.ablation]
  # Without seeds: one run in the workdir, then the base and trained
  # policies on the held-out problems (simpletir/seeds.py:run_heldout).
  c.job = "simpletir_seeds" if a.seeds else "simpletir_heldout"
  if a.staleness:
    c.staleness = a.staleness
    t.loss.tis_cap = TIS_CAP
    if a.seeds:  # Both arms from one warm start, both with TIS.
      c.arms = (("sync", "staleness", 0),
                (f"staleness_{a.staleness}", "staleness", a.staleness))
  if a.smoke:
    w.update(tasks=32)
    w.train.update(num_steps=4)
    w.train.optim.decay_steps = 0
    w.criterion.min_copy_rate = 0.0  # 4 steps: a fixed count.
    w.train.optim.warmup_steps = 0
    c.prompts_per_step, c.grpo.group_size = 2, 4
    c.grpo.update(accuracy_band=(0.0, 1.0), drop_zero_variance=False)
    c.num_iterations = 2
    c.void_grad_every = 0
    c.rollout.update(max_turns=2, max_new_tokens=24)
    c.eval.update(limit=4, k=2)
    t.mini_batch_size = 8
  t.num_steps = 0  # Derived at job start (simpletir.train.resolve).
  return c
