"""Step judges for SWiRL's process filter (and an optional outcome judge).

Every judge answers one batched question, `score(states, actions)`: the
probability that each action was a reasonable step given its state (P(GOOD)),
and `label(...)` thresholds it. Kinds:

  ModelJudge         a loaded decoder reads the GOOD/BAD prompt; P(GOOD)
                     from its next-token distribution (`model`).
  HTTPJudge          an OpenAI-compatible `/v1/chat/completions` endpoint
                     (vLLM, hosted models): P(GOOD) from top log-probs, else
                     from the reply's word; retries, rate limit, disk cache
                     (`http_judge`, `replies`).
  ProgrammaticJudge  synthetic tasks: checks the step against the task's
                     solution graph, no model at all (`programmatic`).
  OutcomeJudge       the YES/NO prompt comparing a predicted with a gold
                     answer, over the model or HTTP backend (the default
                     outcome label comes from the answer checkers instead).

Prompts, the `Judge` interface and `label_units` live in `base`; config
blocks, `make_judge` and a judge's `identity` in `registry`. Evaluation uses
a judge for process correctness, so this package sits below `evaluation`
and imports nothing from `swirl`.
"""

from swirl_jax.judges.base import (OUTCOME_PROMPT, PROCESS_PROMPT,
                                   PROCESS_SYSTEM, PROMPT_VERSION, Judge,
                                   JudgeError, OutcomeJudge, ScorerJudge,
                                   clean_transcript, label_units,
                                   outcome_chat, process_chat)
from swirl_jax.judges.http_judge import HTTPJudge, HTTPScorer
from swirl_jax.judges.model import ModelJudge, ModelScorer
from swirl_jax.judges.programmatic import ProgrammaticJudge
from swirl_jax.judges.registry import (KINDS, default_config, identity,
                                       make_judge, validate)
