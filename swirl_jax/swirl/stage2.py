"""SWiRL stage 2: offline step-wise RL over saved states (no live tools).

For a batch of saved states the current policy samples G actions each,
stopping at the end of one action; a generative reward model scores every
(state, action) without the gold answer; the advantage is the reward
itself, as the paper's objective E[R(a|s)] states it (`advantage='none'`),
or the reward minus a baseline over the state's G samples ('mean', the
CPU runs' and this module's default; 'leave_one_out'); the shared step
maximises the advantage-weighted log-prob of each whole action,
optionally with a KL term to the frozen initial policy. The SFT baseline
trains on the saved actions of the same units with cross-entropy.
"""

import dataclasses
from typing import Sequence

import numpy as np

from swirl_jax import config_lib, distributed
from swirl_jax.ops import advantages as adv_lib
from swirl_jax.rollout import batching
from swirl_jax.rollout.records import StepUnit
from swirl_jax.tools import parsing


@dataclasses.dataclass(frozen=True)
class Stage2Config(config_lib.FromConfig):
  samples_per_state: int = 4  # G.
  states_per_step: int = 16
  max_new_tokens: int = 256
  temperature: float = 1.0
  top_p: float = 1.0
  # none (the paper's; its configs set it) | mean | leave_one_out.
  advantage: str = "mean"
  max_len: int = 4096


@dataclasses.dataclass
class Actions:
  """G sampled actions per state, flattened state-major ([B*G])."""
  ids: list[list[int]]
  logprobs: list[np.ndarray]
  texts: list[str]


def row_seeds(units: Sequence[StepUnit], g: int, seed: int) -> list[int]:
  """A seed per (state, sample) from `seed` and the pair only, so a state's
  samples do not depend on the batch around it or on the host count."""
  return [distributed.pair_seed(seed, f"{u.trajectory_id}:{u.step_index}",
                                k) for u in units for k in range(g)]


def sample_actions(sampler, units: Sequence[StepUnit], c: Stage2Config,
                   seed: int) -> Actions:
  prompts = [u.state_ids for u in units for _ in range(c.samples_per_state)]
  seeds = row_seeds(units, c.samples_per_state, seed)
  # In calls of at most `max_rows` rows (the KV cache a call allocates);
  # each row's seed is its own, so the split does not change the samples.
  step = sampler.config.max_rows or len(prompts)
  out = Actions([], [], [])
  for lo in range(0, len(prompts), step):
    res = sampler.generate(prompts[lo:lo + step],
                           max_new_tokens=c.max_new_tokens,
                           stop_strings=tuple(parsing.stop_strings("swirl")),
                           temperature=c.temperature, top_p=c.top_p,
                           seed=seeds[lo:lo + step])
    out.ids.extend(res.tokens)
    out.logprobs.extend(res.logprobs)
    out.texts.extend(res.texts)
  return out


def score_actions(judge, units: Sequence[StepUnit], actions: Actions,
                  g: int) -> np.ndarray:
  """Rewards [B, G]: the reward model's P(GOOD) of each sampled action."""
  states = [u.state_text for u in units for _ in range(g)]
  task_ids = [u.task_id for u in units for _ in range(g)]
  scores = judge.score(states, actions.texts, task_ids=task_ids)
  return np.asarray(scores, np.float32).reshape(len(units), g)


def sample_and_score(sampler, judge, units: Sequence[StepUnit],
                     c: Stage2Config, seed: int
                     ) -> tuple[Actions, np.ndarray]:
  """(G sampled actions per state, rewards [B, G]). On many hosts each
  samples and scores its own share of a step's states and keeps them
  (`rl_batch` builds the global batch from every host's rows)."""
  acts = sample_actions(sampler, units, c, seed)
  return acts, score_actions(judge, units, acts, c.samples_per_state)


def reward_stats(rewards_BG) -> dict[str, float]:
  """The step's reward distribution, logged with its update: mean, std,
  10/50/90th percentiles, and the share of actions the reward model calls
  GOOD (P(GOOD) > 0.5), i.e. the process correctness of the samples."""
  r = np.asarray(rewards_BG, np.float64).reshape(-1)
  p10, p50, p90 = np.percentile(r, [10, 50, 90])
  return {"reward": float(r.mean()), "reward_std": float(r.std()),
          "reward_p10": float(p10), "reward_p50": float(p50),
          "reward_p90": float(p90), "reward_good_share": float(np.mean(r > 0.5))}


def rl_batch(units, actions: Actions, rewards_BG, c: Stage2Config, *,
             mini_batch_size: int):
  """The step's batch: state (mask 0) + sampled action (mask 1) per row,
  of every host's units end to end (each host passes its own)."""
  adv = adv_lib.stepwise_advantages(rewards_BG, c.advantage).reshape(-1)
  seqs = []
  for i, (ids, lps) in enumerate(zip(actions.ids, actions.logprobs)):
    u = units[i // c.samples_per_state]
    seqs.append(_sequence(u.state_ids, ids, lps))
  return batching.collate_over_hosts(seqs, adv, row_multiple=mini_batch_size,
                                    min_rows=mini_batch_size,
                                    max_len=c.max_len)


def sft_batch(units: Sequence[StepUnit], *, mini_batch_size: int,
              max_len: int = 4096):
  """Cross-entropy on each unit's saved action given its state."""
  seqs = [_sequence(u.state_ids, u.action_ids, u.action_logprobs or None)
          for u in units]
  return batching.collate(seqs, np.ones(len(seqs)),
                          row_multiple=mini_batch_size,
                          min_rows=mini_batch_size, max_len=max_len)


def _sequence(state_ids, action_ids, logprobs):
  n, m = len(state_ids), len(action_ids)
  tokens = np.asarray(list(state_ids) + list(action_ids), np.int32)
  mask = np.concatenate([np.zeros(n), np.ones(m)]).astype(np.int32)
  lp = np.zeros(n + m, np.float32)
  if logprobs is not None and len(logprobs) == m:
    lp[n:] = logprobs
  return tokens, mask, lp


def unit_batches(units: Sequence[StepUnit], per_step: int, seed: int,
                 start: int):
  """Step i's units: a seeded shuffle of the units, epoch by epoch."""
  i = start
  while True:
    epoch, off = divmod(i * per_step, len(units))
    order = np.random.default_rng(seed + epoch).permutation(len(units))
    yield i, [units[order[(off + k) % len(units)]] for k in range(per_step)]
    i += 1
