r"""SimpleTIR: zero-RL multi-turn GRPO with a Python sandbox on MATH.

Accelerators (paper setting; a local Qwen2.5-7B base directory):

  python -m swirl_jax.main \
      --config=configs/simpletir_math.py:model=qwen2_5_7b,checkpoint=/ckpt/Qwen2.5-7B \
      --workdir=/tmp/simpletir

CPU (SmolLM2-135M-Instruct, bundled; small batches):

  python -m swirl_jax.main \
      --config=configs/simpletir_math.py:model=smollm2_135m,runlocal \
      --workdir=/tmp/simpletir_cpu

Args: model (a preset), checkpoint ('' = bundled for smollm2_135m, random
init otherwise), runlocal (CPU sizes), filter_void (default true), data
(math | gsm8k | synthetic_arith), seed.
"""

import ml_collections

from swirl_jax import config_lib, fit_programs
from swirl_jax.training import trainer as trainer_lib


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
  # SimpleTIR: 512 prompts x 16 samples, mini-batch 128, 5 turns.
  c.prompts_per_step = 512
  c.num_iterations = 200
  c.max_seq_len = 16384
  c.rollout = dict(fmt="simpletir", max_turns=5, max_new_tokens=2048,
                   max_response_tokens=8192, temperature=1.0, top_p=1.0,
                   top_k=0)
  c.grpo = dict(group_size=16, filter_void=arg.filter_void,
                mask_overlong=True, drop_zero_variance=True,
                accuracy_band=(0.1, 0.9), use_std=True)
  # 0, 0: decode from 1B params on all of a host's devices, as data groups
  # of tensor-parallel devices (`sampler.decode_layout`).
  c.sampler = dict(max_cache_len=16384, tensor_parallel=0,
                   data_parallel=0)
  # The rollout engine, per data group of the decode mesh: cache rows
  # (trajectories in flight), rows decoded together, steps per chunk.
  c.engine = dict(slots=32, decode_batch=16, chunk_steps=8)
  # Every N iterations (0: off), the gradient norm of the void rows alone
  # vs the kept rows alone: one extra backward on the iteration's batch.
  c.void_grad_every = 0
  # Job `simpletir_eval` (--config.job=simpletir_eval): 10 turns, k samples.
  c.eval = dict(datasets=("math500", "aime:2024", "aime:2025", "gsm8k:test"),
                k=16, max_turns=10, temperature=1.0, limit=0)
  t = trainer_lib.default_config()
  t.seed = arg.seed
  t.mini_batch_size = 128
  t.ppo_epochs = 1
  t.optim.lr = 1e-6
  t.optim.grad_clip = 1.0
  t.loss.kind = "clipped_surrogate"
  t.loss.eps_low, t.loss.eps_high, t.loss.dual_clip_c = 0.2, 0.28, 3.0
  t.loss.kl_coef = 0.0  # No KL, no entropy bonus.
  t.loss.agg = "token_mean"
  t.loss.with_entropy = True  # Reported only.
  t.checkpoint_every = 10
  if arg.runlocal:
    c.prompts_per_step = 4
    c.num_iterations = 8
    c.max_seq_len = 2048
    c.rollout.update(max_turns=3, max_new_tokens=96, max_response_tokens=256)
    c.grpo.group_size = 4
    c.grpo.accuracy_band = (0.0, 1.0)
    c.sampler.max_cache_len = 2048
    c.eval.update(k=2, max_turns=4, limit=8)
    t.mini_batch_size = 8
    t.optim.lr = 2e-5
    t.checkpoint_every = 4
  # 0: one optimizer step per mini-batch of each iteration's rows, set at
  # job start (simpletir.train.resolve) so overrides never leave it stale.
  t.num_steps = 0
  c.train = t
  # --config.job=fit: the memory fit on a target (swirl_jax/fit.py).
  c.fit = fit_programs.default_config()
  return c
