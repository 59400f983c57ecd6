"""What the benchmark scripts share.

A script run as `python benchmarks/x.py` has this folder first on its path,
so it imports this file as `common`.
"""

import dataclasses
import time
from typing import Any, Callable, Optional

import jax
import numpy as np


def int_flags(parser, sep: str = "_", **defaults: int) -> None:
  """Adds an int flag --NAME for each NAME=DEFAULT, in order.

  `sep` stands for the underscores of NAME in the flag (its dest keeps
  them), for scripts whose flags are spelt with dashes.
  """
  for name, default in defaults.items():
    parser.add_argument("--" + name.replace("_", sep), type=int,
                        default=default)


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
  """Fastest of `repeats` timed calls of `fn` (the machine may be shared);
  `fn` blocks until its result is ready."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return min(times)


def train_flops(cfg, n_params: int, b: int, t: int, causal: bool) -> float:
  """Forward + backward of a train step: 6 N per token, plus attention.

  The attention term counts all t x t scores (PaLM's MFU convention), or,
  with `causal`, the lower half a causal model needs (MaxText's).
  """
  attn = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * t * t * b
  return 6 * n_params * b * t + (attn / 2 if causal else attn)


def fake_batch(b: int, t: int, vocab: int) -> dict:
  """A train batch of random tokens and advantages (seed 0)."""
  rng = np.random.default_rng(0)
  mask = np.zeros((b, t), np.float32)
  mask[:, t // 4:] = 1  # A prompt, then the policy's tokens.
  return dict(tokens=rng.integers(0, vocab, (b, t)), loss_mask=mask,
              advantages=rng.normal(size=(b,)).astype(np.float32),
              behaviour_logprobs=rng.normal(-2.0, 0.5, (b, t)).astype(
                  np.float32))


@dataclasses.dataclass
class StepTimes:
  """What `time_train_step` measured."""

  compile_s: float
  memory: Any  # The compiled step's `memory_analysis()`.
  times: list[float]  # Seconds of each timed step.
  metrics: dict  # The last step's.


def time_train_step(step, state, batch, steps: int,
                    after_step: Optional[Callable[[], Any]] = None
                    ) -> StepTimes:
  """Compiles a `TrainStep` for `batch`, runs it once, then times `steps`.

  Each timed step waits for its metrics, so it is timed whole. `after_step`,
  when given, runs after each timed step, outside its time.
  """
  t = time.perf_counter()
  compiled = step.lower(state, batch).compile()
  compile_s = time.perf_counter() - t
  memory = compiled.memory_analysis()
  placed = step.place(batch)  # Once: host-to-device copies are not timed.
  state, m = compiled(state, placed)  # Warm-up.
  jax.block_until_ready(m)
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    state, m = compiled(state, placed)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t)
    if after_step is not None:
      after_step()
  return StepTimes(compile_s, memory, times, m)
