r"""SimpleTIR: zero-RL multi-turn GRPO with a Python sandbox on MATH.

Accelerators (the paper's run; a local Qwen2.5-7B base directory):

  python -m swirl_jax.main \
      --config=configs/simpletir_math.py:model=qwen2_5_7b,checkpoint=/ckpt/Qwen2.5-7B \
      --workdir=/tmp/simpletir
  # Evaluate what it trained (<workdir>/hf; --config.eval.policy=base for
  # the base model, or a Hugging Face directory):
  python -m swirl_jax.main \
      --config=configs/simpletir_math.py:model=qwen2_5_7b,checkpoint=/ckpt/Qwen2.5-7B \
      --config.job=simpletir_eval --workdir=/tmp/simpletir

CPU (SmolLM2-135M-Instruct, bundled; small batches):

  python -m swirl_jax.main \
      --config=configs/simpletir_math.py:model=smollm2_135m,runlocal \
      --workdir=/tmp/simpletir_cpu

Every value of the paper config is SimpleTIR's (its paper's table, or its
public code where the two differ); the README's "Differences from the
papers" table lists each one with its source, and what stays different
and why. tests/test_paper_configs.py checks the table against this file.

Derived at job start (swirl_jax/simpletir/train.py `resolve`):
train.num_steps (0) = num_iterations × the mini-batches of one iteration.
train.mini_batch_size follows mini_batch_prompts × grpo.group_size (rows,
as verl counts a mini-batch of prompts); setting it overrides that.

Args: model (a preset), checkpoint ('' = bundled for smollm2_135m, random
init otherwise), runlocal (CPU sizes), filter_void (default true), data
(math | gsm8k | synthetic_arith), seed.
"""

import ml_collections

# The blocks' defaults without the modules that read them (seconds of
# imports in every process that loads this file).
from swirl_jax import config_blocks, config_lib

# Held-out sets of job simpletir_eval (and what validation can name).
MATH_EVAL = ("math500", "aime:2024", "aime:2025", "amc23", "gsm8k:test")


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, model="qwen2_5_7b", checkpoint="",
                             runlocal=False, filter_void=True, data="math",
                             seed=0)
  c = ml_collections.ConfigDict()
  c.job = "simpletir_train"
  c.seed = arg.seed
  c.model = config_lib.model_config(
      arg.model, arg.checkpoint or None,
      dtype="float32" if arg.runlocal else "bfloat16")
  c.data = dict(train=arg.data, train_split="train", train_limit=0,
                data_dir=config_lib.data_dir())
  c.tools = dict(names=("python",), sandbox_timeout_s=3.0,
                 sandbox_memory_mb=512)
  # Sizes and values: README "Differences from the papers" (SimpleTIR).
  # 512 prompts trained an iteration, after the group filters; 3x as many
  # drawn (the public run's --oversample 3), groups taken as they pass.
  c.prompts_per_step = 512
  c.oversample = 3.0
  # A mini-batch counts prompts, as verl's ppo_mini_batch_size: 128 x 16 =
  # 2,048 rows an optimizer step, so 4 steps an iteration at most.
  c.mini_batch_prompts = 128
  c.num_iterations = 200
  # Per turn 8,000 tokens (the public run), 16,384 a trajectory (paper);
  # the cache and the train rows add room for the prompt and tool output.
  c.max_seq_len = 18432
  c.rollout = dict(fmt="simpletir", max_turns=5, max_new_tokens=8000,
                   max_response_tokens=16384, temperature=1.0, top_p=1.0,
                   top_k=0)
  c.grpo = dict(group_size=16, filter_void=arg.filter_void,
                mask_overlong=True, drop_zero_variance=True,
                accuracy_band=(0.1, 0.9), use_std=True)
  # The PPO ratio's old log-probs: 'trainer' recomputes them with the
  # trainer before the update (SimpleTIR's code); 'sampler' takes the
  # sampler's. The sampler's always feed the mismatch metrics.
  c.old_logprobs = "trainer"
  c.log_mismatch = True  # Sampler-trainer mismatch metrics each iteration.
  # Bounded staleness (swirl_jax/simpletir/pipeline.py): 0 samples each
  # iteration with the policy it updates, then trains (SimpleTIR's loop);
  # k >= 1 samples iteration i with the policy after i - k iterations
  # while the trainer updates. With old_logprobs='trainer' it needs
  # train.loss.tis_cap > 0 (the behaviour ratio of the version sampled).
  c.staleness = 0
  # 0, 0: decode from 1B params on all of a host's devices, as data groups
  # of tensor-parallel devices (`sampler.decode_layout`).
  c.sampler = dict(max_cache_len=18432, tensor_parallel=0,
                   data_parallel=0)
  # The rollout engine, per data group of the decode mesh: cache rows
  # (trajectories in flight), rows decoded together, steps per chunk.
  c.engine = dict(slots=32, decode_batch=16, chunk_steps=8)
  # Every N iterations (0: off), the gradient norm of the void rows alone
  # vs the kept rows alone: one extra backward on the iteration's batch.
  c.void_grad_every = 0
  # CPU runs warm-start a small policy first (configs/simpletir_demo.py).
  c.warmstart = config_blocks.warmstart_config()
  # During training, every `every` iterations (and before the first and
  # after the last): avg@k and pass@k on `datasets` into metrics.jsonl
  # (`val_<set>_avg@k`), and the policy exported to <workdir>/hf. The
  # code's validation: n=16, temperature 1.0, top-p 0.7, training's turns
  # and token budget.
  c.validation = dict(every=10, datasets=("aime:2024",), k=16, max_turns=5,
                      temperature=1.0, top_p=0.7, max_new_tokens=8000,
                      max_response_tokens=16384, limit=0)
  # Job `simpletir_eval` (--config.job=simpletir_eval): the code's
  # evaluation, 10 turns, 32 samples (avg@32, pass@32), temperature 1.0,
  # top-p 0.7, 12,000 tokens a turn in a 36,000-token context. policy: ''
  # = the workdir's trained export (<workdir>/hf), 'base' = config.model
  # (or the warm start), or a Hugging Face directory.
  c.eval = dict(policy="", datasets=MATH_EVAL, k=32, max_turns=10,
                temperature=1.0, top_p=0.7, max_new_tokens=12000,
                max_response_tokens=36000, max_cache_len=36000, limit=0)
  t = config_blocks.train_config()
  t.seed = arg.seed
  t.mini_batch_size = c.get_ref("mini_batch_prompts") * \
      c.grpo.get_ref("group_size")
  t.ppo_epochs = 1
  t.optim.lr = 1e-6
  t.optim.b2, t.optim.weight_decay = 0.99, 0.01  # verl's AdamW.
  t.optim.grad_clip = 1.0
  t.loss.kind = "clipped_surrogate"
  t.loss.eps_low, t.loss.eps_high, t.loss.dual_clip_c = 0.2, 0.28, 3.0
  t.loss.kl_coef = 0.0  # No KL, no entropy bonus.
  t.loss.agg = "token_mean"
  t.loss.with_entropy = True  # Reported only.
  t.checkpoint_every = 10
  t.export_hf = True  # <workdir>/hf at the end: what simpletir_eval loads.
  if arg.runlocal:
    c.prompts_per_step = 4
    c.oversample = 1.0
    c.mini_batch_prompts = 2
    c.num_iterations = 8
    c.max_seq_len = 2048
    c.rollout.update(max_turns=3, max_new_tokens=96, max_response_tokens=256)
    c.grpo.group_size = 4
    c.grpo.accuracy_band = (0.0, 1.0)
    c.sampler.max_cache_len = 2048
    c.validation.update(every=0, k=2, max_turns=3, max_new_tokens=96,
                        max_response_tokens=256, limit=8)
    c.eval.update(k=2, max_turns=4, max_new_tokens=96,
                  max_response_tokens=256, max_cache_len=2048, limit=8)
    t.optim.lr = 2e-5
    t.checkpoint_every = 4
  if arg.data != "math":  # Held out from the training set's own data.
    c.eval.datasets = (f"{arg.data}:test",)
    c.validation.datasets = (f"{arg.data}:test",)
  # 0: one optimizer step per mini-batch of each iteration's rows, set at
  # job start (simpletir.train.resolve) so overrides never leave it stale.
  t.num_steps = 0
  c.train = t
  # --config.job=fit: the memory fit on a target (swirl_jax/fit.py).
  c.fit = config_blocks.fit_config()
  return c
