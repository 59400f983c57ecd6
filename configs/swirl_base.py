r"""SWiRL's settings, shared by the experiments configs/swirl_<data>.py.

Every SWiRL hyperparameter but the data's: stage 1 sampling (5 samples a
question at temperature 1), the judge and the process filter, stage 2
(4 actions a state, the step-wise policy gradient, lr 1e-6) and the SFT
baseline; `runlocal` swaps in CPU sizes. An experiment config adds its data,
tools and step cap, e.g.

  python -m swirl_jax.main --config=configs/swirl_gsm8k.py:runlocal \
      --workdir=/tmp/swirl_gsm8k_cpu

Run an experiment config, not this file: it names no data.

Derived at job start (swirl_jax/swirl/jobs.py `resolve`), so a
`--config.` override of what they depend on never leaves them stale:
rl_train.num_steps (when 0) = rl_iterations × the mini-batches of one
iteration's stage2.states_per_step × stage2.samples_per_state rows.

The paper runs Gemma 2 27B with Gemini 1.5 Pro as judge and reward model;
here the judge and reward model of the paper settings are a strong open
model served over HTTP (`JUDGE_MODEL` on a vLLM server at
`judge.base_url`; any OpenAI-compatible endpoint with
`--config.judge.model_name=...`). The bundled SmolLM2-135M as judge
(judge=model; with the default policy, the policy judging itself) is the
CPU runs' default only: at that size it calls every step BAD, so with it
`runlocal` sets the filter to `none` (every step trained on) where the
paper's process filter would keep nothing. Stage 2's advantage is the
reward itself, as the paper's objective E[R(a|s)] states it; the CPU runs
keep the mean baseline over a state's samples. Every value that stays
different from the paper, and why: "Differences from the papers" in
docs/differences.md.

Args: model (preset), checkpoint, judge (model | http | programmatic; ''
= http with JUDGE_MODEL, or model with runlocal), runlocal, seed.
"""

import os

import ml_collections

# The blocks' defaults without the modules that read them (seconds of
# imports in every process that loads this file).
from swirl_jax import config_blocks, config_lib

ARGS = dict(model="smollm2_135m", checkpoint="", judge="",
            runlocal=False, seed=0)
# The paper settings' judge and reward model (docs/differences.md).
JUDGE_MODEL = "Qwen/Qwen2.5-72B-Instruct"
# configs/swirl_<data>.py, for the ablations' `data` arg.
DATA = ("gsm8k", "hotpotqa", "synthetic_arith", "synthetic_multihop")


def experiment(data: str):
  """The module of configs/swirl_<data>.py."""
  if data not in DATA:
    raise config_lib.ConfigError(f"data={data!r}; valid: {', '.join(DATA)}")
  return config_lib.load_config_module(
      os.path.join(os.path.dirname(__file__), f"swirl_{data}.py"))


def _train(loss: str, seed: int) -> ml_collections.ConfigDict:
  t = config_blocks.train_config()
  t.seed = seed
  t.loss.kind = loss
  t.optim.lr = 1e-6
  t.optim.schedule = "constant"
  t.optim.warmup_steps = 0
  t.mini_batch_size = 64
  t.checkpoint_every = 50
  return t


def _judge(kind: str) -> ml_collections.ConfigDict:
  j = config_blocks.judge_config(kind)
  j.model_name = JUDGE_MODEL  # Read by kind 'http' only.
  return j


def args(arg) -> ml_collections.ConfigDict:
  """The args string parsed, or args an ablation has parsed already."""
  return arg if isinstance(arg, ml_collections.ConfigDict) else \
      config_lib.parse_arg(arg, **ARGS)


def get_config(arg=None):
  """`arg`: the args string, or args an ablation has parsed already."""
  a = args(arg)
  c = ml_collections.ConfigDict()
  c.job = "swirl_pipeline"
  c.stages = ("stage1", "filter", "rl", "sft", "eval")
  c.seed = a.seed
  c.model = config_lib.model_config(
      a.model, a.checkpoint or None,
      dtype="float32" if a.runlocal else "bfloat16")
  # train / eval: set by the experiment.
  c.data = dict(train="", train_split="train", train_limit=0, eval="",
                eval_split="test", eval_limit=500,
                data_dir=config_lib.data_dir())
  c.tools = dict(names=(), search_corpus="", search_k=3)
  # 0, 0: decode from 1B params on all of a host's devices, as data groups
  # of tensor-parallel devices (`sampler.decode_layout`).
  # max_rows: stage 2 samples 32 rows a generate call.
  c.sampler = dict(max_cache_len=8192, tensor_parallel=0,
                   data_parallel=0, max_rows=32)
  # The rollout engine, per data group of the decode mesh: cache rows
  # (trajectories in flight), rows decoded together, steps per chunk.
  # Sized for Gemma 2 27B on a v5p host's 4 chips (the fit job: 81 of 95
  # GiB with the train state); smaller models can take more.
  c.engine = dict(slots=16, decode_batch=8, chunk_steps=8)
  c.stage1 = dict(samples=5, tasks_per_batch=64, temperature=1.0, top_p=1.0,
                  max_turns=10, max_new_tokens=512, max_response_tokens=4096,
                  drop_easy=False, easy_max_calls=1)
  # The judge labels stage 1 steps; the reward model scores stage 2 actions
  # (the paper uses one model for both).
  judge = a.judge or ("model" if a.runlocal else "http")
  c.judge = _judge(judge)
  c.reward = _judge(judge)
  c.calibration = dict(max_steps=0)  # judge_calibration: 0 = every step.
  c.filter = dict(strategy="process", granularity="trajectory")
  # advantage 'none': the reward as the paper's objective has it.
  c.stage2 = dict(samples_per_state=4, states_per_step=64, max_new_tokens=512,
                  temperature=1.0, top_p=1.0, advantage="none", max_len=8192)
  c.rl_iterations = 500
  c.rl_train = _train("stepwise_pg", a.seed)
  c.rl_train.num_steps = 0  # Derived at job start (see above).
  c.sft_train = _train("sft", a.seed)
  c.sft_train.num_steps = 500
  c.rl_name = "rl"  # Stage 2's directory (ablations: one per filter).
  # eval.search_corpus: held-out questions' own corpus ('' = tools').
  # policies: stage names (<workdir>/<name>/hf), 'base', or 'label=DIR'
  # for any Hugging Face directory. llm_correct: the judge's YES/NO on
  # each answer against the gold one, beside exact match (the paper's
  # metric; a model or HTTP judge).
  c.eval = dict(policies=("base", "rl", "sft"), temperature=0.0,
                search_corpus="", llm_correct=True)
  if a.runlocal:
    _cpu_sizes(c)
  # --config.job=fit: the memory fit on a target (swirl_jax/fit.py).
  c.fit = config_blocks.fit_config()
  return c


def _cpu_sizes(c) -> None:
  c.data.train_limit, c.data.eval_limit = 16, 16
  c.stage2.advantage = "mean"  # A baseline over a state's samples.
  if c.judge.kind == "model":
    # The bundled 135M model judging its own steps calls every one BAD, so
    # the process filter would keep none: stage 2 and SFT take every step
    # (the judge's labels still go to filter/report.json).
    c.filter.strategy = "none"
  c.sampler.max_cache_len = 2048
  c.stage1.update(samples=2, tasks_per_batch=8, max_new_tokens=96,
                  max_response_tokens=512)
  c.stage2.update(samples_per_state=4, states_per_step=8,
                  max_new_tokens=96, max_len=2048)
  c.rl_iterations = 4
  for t in (c.rl_train, c.sft_train):
    t.mini_batch_size = 8
    t.optim.lr = 1e-5
    t.checkpoint_every = 4
  c.sft_train.num_steps = 4
