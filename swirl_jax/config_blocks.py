"""The config blocks' defaults: the training core's (`train`, with its
`optim`, `lora` and `loss`), the warm start's, the fit job's and the
judges'.

Config files load in every `python -m swirl_jax.main` process, before the
job it runs, and many end at a one-line error before any job starts; the
modules that read these blocks import JAX programs, tokenizers, tools and
checkpointing (seconds). So the defaults live here, importing nothing
heavy, and those modules take theirs from here (`trainer.default_config`
is `train_config`, and so on): one definition each.
"""

import pathlib

import ml_collections

from swirl_jax import config_lib


def optim_config() -> ml_collections.ConfigDict:
  """`train.optim` (swirl_jax/training/optimizer.py)."""
  return ml_collections.ConfigDict(dict(
      lr=1e-6, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
      schedule="constant", warmup_steps=0, decay_steps=0, end_lr_ratio=0.0,
      grad_clip=1.0))


def lora_config() -> ml_collections.ConfigDict:
  """`train.lora` (swirl_jax/training/lora.py); rank 0: off."""
  return ml_collections.ConfigDict(dict(
      rank=0, alpha=16.0, targets=("q", "k", "v", "o", "gate", "up", "down")))


def loss_config() -> ml_collections.ConfigDict:
  """`train.loss` (swirl_jax/training/step.py)."""
  return ml_collections.ConfigDict(dict(
      kind="clipped_surrogate",
      agg="",  # '' = the loss's own default (token_mean; stepwise: per row).
      eps_low=0.2, eps_high=0.28,
      dual_clip_c=3.0,  # <= 0: off.
      kl_coef=0.0,  # weight of the k3 KL to `ref_logprobs`, when given.
      with_entropy=False,  # report entropy (one more pass over the logits).
      chunk_size=128,  # sequence positions per log-prob chunk.
      # > 0: truncated importance sampling, each token's loss times
      # min(pi_trainer / pi_sampler, tis_cap) (needs `old_logprobs`).
      tis_cap=0.0))


def train_config() -> ml_collections.ConfigDict:
  """Every field the training core reads, with its default."""
  return ml_collections.ConfigDict(dict(
      seed=0,
      # 'auto' (training/defaults.py: FSDP for >= 1B params, else data
      # parallel) or a list of (axis, size) with at most one size -1.
      mesh="auto",
      num_steps=100,  # optimizer steps.
      # Gradient accumulation inside one step; 0: from the token budget.
      micro_batches=0,
      tokens_per_device=8192,  # per micro-batch, when micro_batches is 0.
      ppo_epochs=1,  # passes over each rollout batch.
      mini_batch_size=0,  # rows per step within a batch; 0: the whole batch.
      optim=optim_config(),
      lora=lora_config(),
      loss=loss_config(),
      checkpoint_every=100, keep_checkpoints=3, async_checkpoints=True,
      export_hf=False,  # write <workdir>/hf (LoRA merged) at the end.
      tensorboard=True, progress=True))


def fit_config() -> ml_collections.ConfigDict:
  """`config.fit`: the fit job's fields (swirl_jax/fit.py)."""
  return ml_collections.ConfigDict(dict(
      chip="h100", devices=8,
      num_layers_override=0,  # > 0: extrapolate from n and n + 1 layers.
      train_block="",  # '' = the first of train, rl_train, sft_train.
      train_rows=0,  # 0 = the block's mini_batch_size.
      seq_len=0,  # 0 = max_seq_len, stage2.max_len or the cache length.
      sampler_rows=64,  # generate's rows where sampler.max_rows is 0.
      prompt_len=1024, decode_steps=1024,
      # 'target': what the chip runs, compiled here as a stand-in of the
      # same memory: TPU splash, or for cuDNN's flash attention (GPUs) the
      # splash kernel too, both in Pallas' interpreter; Gemma 2 on a GPU
      # (soft-cap: no cuDNN) the block attention. Or any attention_impl.
      attention_impl="target",
      # Decode attention over the pages: 'target' compiles 'xla_pages' (the
      # pages read each step, nothing held: a kernel's memory) for a GPU or
      # TPU; or any paged_attention_impl.
      paged_attention_impl="target",
      hbm_fraction=0.9,
      # Capacity: context lengths from a rollouts file (each trajectory's
      # whole context), or else rows of this share of the cache length.
      rollouts="", mean_live_fraction=0.25))


def warmstart_config() -> ml_collections.ConfigDict:
  """`config.warmstart` (swirl_jax/warmstart.py); off by default."""
  t = train_config()
  t.loss.kind = "sft"
  t.optim.update(lr=3e-3, warmup_steps=20, schedule="cosine",
                 end_lr_ratio=0.1, weight_decay=0.0)
  t.num_steps = 200
  t.checkpoint_every = 100
  t.export_hf = True
  return ml_collections.ConfigDict(dict(
      enabled=False, split="demo", tasks=1024, vocab_size=1024,
      batch_size=16,
      # 'actions': the model's turns only (SFT); 'all': every token, tool
      # results and question included, which teaches a model from scratch
      # to copy (numbers into expressions, results into answers) sooner.
      loss_on="actions",
      # The tokenizer keeps each number whole (no one-digit-per-token rule)
      # and demonstrations space numbers as the questions do, so copying a
      # number is copying one token.
      whole_numbers=False,
      # The prompt's fixed text (system turn, instruction) as one token
      # each (`prompt_phrases`): same text, far shorter sequences.
      prompt_tokens=False,
      # 'swirl' (tags, the chat template's turns) or 'simpletir' (```python
      # blocks, tool output inline in one assistant message).
      fmt="swirl",
      # {style: weight} of `tasks/demonstrations.py` (styles that err at
      # known rates), every demonstration trained on; empty: gold
      # trajectories only, the correct ones trained on.
      mix={}, train=t,
      # 0: train num_steps steps. > 0: stop at the first check (every
      # `every` steps) where the copy rate on `tasks` held-out
      # demonstration prompts, one sample each at `temperature`, reaches
      # it (module docstring).
      criterion=dict(min_copy_rate=0.0, every=60, tasks=128,
                     temperature=1.0, max_new_tokens=40)))


def warmstart_cpu_demo(fmt: str = "swirl", seed: int = 0
                    ) -> ml_collections.ConfigDict:
  """The warm start of the CPU demos (configs/demo.py, simpletir_demo.py).

  Small batches, many steps, a high learning rate: copying numbers from
  the question into expressions is learnt suddenly, after a few hundred
  updates, and the number of updates (not tokens) is what buys it.
  """
  w = warmstart_config()
  w.update(enabled=True, fmt=fmt, vocab_size=2048, whole_numbers=True,
           prompt_tokens=True, loss_on="all", batch_size=8)
  w.train.update(num_steps=480, seed=seed)
  w.train.optim.lr = 8e-3
  return w


def warmstart_hf_dir(workdir) -> pathlib.Path:
  """Where the warm start exports its policy."""
  return pathlib.Path(workdir) / "warmstart" / "hf"


JUDGE_KINDS = ("model", "http", "programmatic")

# The fields each kind reads, at their defaults; `kind` and `threshold` are
# common to all.
JUDGE_FIELDS = {
    "model": lambda: dict(model=config_lib.model_config(), batch_size=8,
                          max_len=2048, scoring="first_token"),
    "http": lambda: dict(
        base_url="http://127.0.0.1:8000", model_name="", api_key_env="",
        max_concurrency=8, requests_per_second=0.0, max_retries=5,
        backoff_s=1.0, max_backoff_s=60.0, timeout_s=120.0,
        cache_path="",  # '': the job's default (in the workdir); 'off'.
        # The prompt asks for one word; 8 tokens fit it with markup or a
        # short negation ("**GOOD**", "Not good."), read as a judge means.
        logprobs=True, top_logprobs=20, max_tokens=8, temperature=0.0,
        max_unparsable=0.1,  # Share of a batch; more fails the stage.
        retry_log_every_s=30.0),
    "programmatic": dict,
}


def check_judge_kind(kind: str, name: str) -> None:
  if kind not in JUDGE_KINDS:
    raise config_lib.ConfigError(
        f"{name}.kind {kind!r}; valid: {JUDGE_KINDS}")


def judge_config(kind: str = "http") -> ml_collections.ConfigDict:
  """A judge config block of kind `kind`, with every kind's fields."""
  check_judge_kind(kind, "judge")
  fields = dict(kind=kind, threshold=0.5)
  for k in JUDGE_KINDS:
    fields.update(JUDGE_FIELDS[k]())
  return ml_collections.ConfigDict(fields)
