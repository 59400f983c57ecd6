"""The SWiRL config block shared by configs/swirl_*.py and the ablations."""

import ml_collections

from swirl_jax import config_lib
from swirl_jax import judges
from swirl_jax.training import trainer as trainer_lib

# Per dataset: tool, step cap (paper: 5 for QA, 10 for GSM8K), eval split.
DATASETS = {
    "gsm8k": dict(tools=("calculator",), max_turns=10, train_split="train",
                  eval="gsm8k", eval_split="test", search_corpus=""),
    "hotpotqa": dict(tools=("search",), max_turns=5, train_split="train",
                     eval="hotpotqa", eval_split="dev",
                     search_corpus="hotpotqa:train",
                     eval_search_corpus="hotpotqa:dev"),
    "synthetic_arith": dict(tools=("calculator",), max_turns=6,
                            train_split="train", eval="synthetic_arith",
                            eval_split="test", search_corpus=""),
    "synthetic_multihop": dict(tools=("search",), max_turns=5,
                               train_split="train", eval="synthetic_multihop",
                               eval_split="test",
                               search_corpus="synthetic_multihop:train"),
}


def _train(loss: str, lr: float, seed: int) -> ml_collections.ConfigDict:
  t = trainer_lib.default_config()
  t.seed = seed
  t.loss.kind = loss
  t.optim.lr = lr
  t.optim.schedule = "constant"
  t.optim.warmup_steps = 0
  t.checkpoint_every = 50
  return t


def swirl_config(dataset: str, *, model: str, checkpoint: str, judge: str,
                 runlocal: bool, seed: int = 0) -> ml_collections.ConfigDict:
  if dataset not in DATASETS:
    raise ValueError(f"unknown SWiRL dataset {dataset!r}; valid: "
                     f"{sorted(DATASETS)}")
  d = DATASETS[dataset]
  c = ml_collections.ConfigDict()
  c.job = "swirl_pipeline"
  c.stages = ("stage1", "filter", "rl", "sft", "eval")
  c.seed = seed
  c.model = config_lib.model_config(model, checkpoint or None,
                                    dtype="float32" if runlocal else
                                    "bfloat16")
  c.data = dict(train=dataset, train_split=d["train_split"], train_limit=0,
                eval=d["eval"], eval_split=d["eval_split"], eval_limit=500,
                data_dir=config_lib.data_dir())
  c.tools = dict(names=d["tools"], search_corpus=d["search_corpus"],
                 search_k=3)
  c.sampler = dict(max_cache_len=8192)
  c.stage1 = dict(samples=5, tasks_per_batch=64, temperature=1.0, top_p=1.0,
                  max_turns=d["max_turns"], max_new_tokens=512,
                  max_response_tokens=4096, drop_easy=dataset == "hotpotqa",
                  easy_max_calls=1)
  # The judge labels stage 1 steps; the reward model scores stage 2 actions
  # (the paper uses one model for both).
  c.judge = judges.default_config(judge)
  c.reward = judges.default_config(judge)
  c.calibration = dict(max_steps=0)  # judge_calibration: 0 = every step.
  c.filter = dict(strategy="process", granularity="trajectory")
  c.stage2 = dict(samples_per_state=4, states_per_step=64, max_new_tokens=512,
                  temperature=1.0, top_p=1.0, advantage="mean", max_len=8192)
  c.rl_iterations = 500
  c.rl_train = _train("stepwise_pg", 1e-6, seed)
  c.rl_train.mini_batch_size = 64
  c.sft_train = _train("sft", 1e-6, seed)
  c.sft_train.mini_batch_size = 64
  c.sft_train.num_steps = 500
  c.rl_name = "rl"  # Stage 2's directory (ablations: one per filter).
  c.eval = dict(policies=("base", "rl", "sft"), temperature=0.0,
                search_corpus=d.get("eval_search_corpus", ""))
  if runlocal:
    c.data.train_limit, c.data.eval_limit = 16, 16
    c.sampler.max_cache_len = 2048
    c.stage1.update(samples=2, tasks_per_batch=8, max_new_tokens=96,
                    max_response_tokens=512)
    c.stage2.update(samples_per_state=4, states_per_step=8,
                    max_new_tokens=96, max_len=2048)
    c.rl_iterations = 4
    c.rl_train.mini_batch_size = 8
    c.rl_train.optim.lr = 1e-5
    c.sft_train.mini_batch_size = 8
    c.sft_train.num_steps = 4
    c.sft_train.optim.lr = 1e-5
    c.rl_train.checkpoint_every = c.sft_train.checkpoint_every = 4
  rows = c.stage2.states_per_step * c.stage2.samples_per_state
  c.rl_train.num_steps = c.rl_iterations * max(
      1, rows // c.rl_train.mini_batch_size)
  return c
