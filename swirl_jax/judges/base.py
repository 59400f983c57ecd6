"""The judges' prompts, the `Judge` interface and labelling step units.

Every judge answers one batched question, `score(states, actions)`: the
probability that each action was a reasonable step given its state
(P(GOOD)), and `label(...)` thresholds it. The process judge never sees the
gold answer: it judges a decision at its state, which is what lets process
filtering keep well-reasoned trajectories that ended wrong.

A scorer (model or HTTP) answers `prob(chats, positive, negative)`: per chat
P(the reply starts with `positive` rather than `negative`), or None where a
reply could not be read. The judges here put the GOOD/BAD (process) and
YES/NO (outcome) prompts over a scorer.
"""

import abc
import dataclasses
import hashlib
import re
from typing import Sequence

import numpy as np
import tqdm

from swirl_jax import errors
from swirl_jax.rollout.records import StepUnit

PROCESS_SYSTEM = (
    "You review the work of an AI assistant that solves problems step by "
    "step. At each step the assistant may think, and then either calls a "
    "tool (a search engine with <search_query>...</search_query>, a "
    "calculator with <math_exp>...</math_exp>) or gives its final answer "
    "with <answer>...</answer>. Tool results come back as `QUERY -> RESULT`.")

PROCESS_PROMPT = """\
Here is the conversation so far, then the assistant's candidate next step.

<conversation>
{state}
</conversation>

<candidate_step>
{action}
</candidate_step>

Judge only the candidate step. Given everything before it, is it a \
reasonable next step towards solving the problem? A reasonable step makes \
progress: a relevant tool call with a sensible, well-formed argument, or a \
final answer that follows from what is known so far. A step is not \
reasonable if it repeats earlier work for no reason, ignores or misreads \
earlier results, calls a tool with an irrelevant or malformed argument, \
does several things at once, or answers without enough support. You are \
not told the correct final answer; judge the reasoning, not the result.

Answer with a single word: GOOD or BAD."""

OUTCOME_PROMPT = """\
Question: {question}

Gold answer: {gold}

Predicted answer: {prediction}

Does the predicted answer mean the same as the gold answer? Differences of \
wording, formatting, units or rounding that do not change the meaning are \
fine; a different value or entity, or an answer that hedges between \
several, is not.

Answer with a single word: YES or NO."""

# Names the process prompt's wording in a judge's identity (see
# `registry.identity`): labels made with another wording are not reused.
PROMPT_VERSION = hashlib.sha256(
    (PROCESS_SYSTEM + PROCESS_PROMPT).encode()).hexdigest()[:12]

# Chat-template markup (ChatML, Llama 3, Gemma) in a saved transcript; it is
# removed so the judge reads plain text and no turn boundary can be forged.
_MARKUP_RE = re.compile(r"<\|[A-Za-z0-9_.:-]{1,40}\|>|<(?:start|end)_of_turn>"
                        r"|<bos>|<eos>|<pad>")


def clean_transcript(text: str) -> str:
  return _MARKUP_RE.sub("", text)


def process_chat(state: str, action: str) -> list[dict[str, str]]:
  return [{"role": "system", "content": PROCESS_SYSTEM},
          {"role": "user", "content": PROCESS_PROMPT.format(
              state=clean_transcript(state).strip(),
              action=clean_transcript(action).strip())}]


def outcome_chat(question: str, prediction: str, gold: str):
  return [{"role": "user", "content": OUTCOME_PROMPT.format(
      question=clean_transcript(question).strip(),
      prediction=clean_transcript(str(prediction)).strip(),
      gold=str(gold).strip())}]


class JudgeError(errors.UserError, RuntimeError):
  """A judge failed for good: a request after its retries, a bad reply."""


def check_lengths(*seqs) -> None:
  if len({len(s) for s in seqs}) > 1:
    raise ValueError(f"batch lengths differ: {[len(s) for s in seqs]}")


def binary_prob(lp_pos: float, lp_neg: float) -> float:
  """Two-way softmax of two log-probs -> P(positive); 0.5 if both are -inf."""
  p = np.exp(lp_pos - np.logaddexp(lp_pos, lp_neg))
  return 0.5 if np.isnan(p) else float(p)


# ---------------------------------------------------------------- interface


class Judge(abc.ABC):
  """P(GOOD) for (state, action) pairs; `label` is P(GOOD) > threshold.

  `score_or_none` leaves None where the judge's reply could not be read (an
  HTTP judge's error body or prose). `score` fails when more than the
  judge's allowed share of a batch is unreadable (`check_readable`) and
  reads the rest as an undecided 0.5, which the strict comparison makes
  BAD: a filter should not keep what nobody vouched for.
  """
  threshold: float = 0.5

  @abc.abstractmethod
  def score_or_none(self, states: Sequence[str], actions: Sequence[str], *,
                    task_ids: Sequence[str] | None = None
                    ) -> list[float | None]:
    """P(GOOD) per pair. `task_ids` is read only by judges that need it."""

  def check_readable(self, unreadable: int, total: int) -> None:
    """Raises JudgeError if `unreadable` of `total` replies is too many."""
    if unreadable:  # Judges whose replies can be unreadable override this.
      raise JudgeError(f"{type(self).__name__}: {unreadable} of {total} "
                       "steps have no score")

  def score(self, states, actions, *, task_ids=None) -> list[float]:
    probs = self.score_or_none(states, actions, task_ids=task_ids)
    self.check_readable(sum(p is None for p in probs), len(probs))
    return [0.5 if p is None else p for p in probs]

  def label(self, states, actions, *, task_ids=None) -> list[bool]:
    return [p > self.threshold
            for p in self.score(states, actions, task_ids=task_ids)]


class ScorerJudge(Judge):
  """The GOOD/BAD process prompt over a scorer (model or HTTP)."""

  def __init__(self, scorer, threshold: float = 0.5):
    self.scorer, self.threshold = scorer, threshold

  def score_or_none(self, states, actions, *, task_ids=None):
    check_lengths(states, actions)
    return self.scorer.prob([process_chat(s, a)
                             for s, a in zip(states, actions)], "GOOD", "BAD")

  def check_readable(self, unreadable: int, total: int) -> None:
    if unreadable:  # Only a scorer that can return None gets here.
      self.scorer.check_readable(unreadable, total, "GOOD", "BAD")


class OutcomeJudge:
  """YES/NO: does a predicted answer match the gold one? (LLM as judge.)

  `backend` is a ModelJudge / HTTPJudge (its scorer is reused) or a scorer.
  Unreadable replies read as 0.5 (not a match), up to the scorer's share.
  """

  def __init__(self, backend, threshold: float = 0.5):
    self.scorer = getattr(backend, "scorer", backend)
    self.threshold = threshold

  def score(self, questions: Sequence[str], predictions: Sequence[str],
            golds: Sequence[str]) -> list[float]:
    check_lengths(questions, predictions, golds)
    probs = self.scorer.prob([outcome_chat(q, p, g) for q, p, g in
                              zip(questions, predictions, golds)], "YES", "NO")
    unreadable = sum(p is None for p in probs)
    if unreadable:
      self.scorer.check_readable(unreadable, len(probs), "YES", "NO")
    return [0.5 if p is None else p for p in probs]

  def label(self, questions, predictions, golds) -> list[bool]:
    return [p > self.threshold
            for p in self.score(questions, predictions, golds)]


def label_units(judge: Judge, units: Sequence[StepUnit], chunk: int = 64,
                *, total: int | None = None) -> list[StepUnit]:
  """Copies of `units` with `process_prob` / `process_good` filled in.

  A unit whose reply could not be read keeps both None (not judged), so
  nothing stores a label nobody gave. The unreadable share is checked over
  `total` steps (default: `units`; a filter judging what is left of its
  steps passes all of them), after each chunk so a broken judge stops early.
  A progress bar counts the judged steps.
  """
  with tqdm.tqdm(total=len(units), desc="judging", unit="step",
                 disable=not units) as bar:
    return _label_chunks(judge, units, chunk, total, bar)


def _label_chunks(judge, units, chunk, total, bar) -> list[StepUnit]:
  out, unreadable = [], 0
  for i in range(0, len(units), chunk):
    part = units[i:i + chunk]
    probs = judge.score_or_none([u.state_text for u in part],
                                [u.action_text for u in part],
                                task_ids=[u.task_id for u in part])
    unreadable += sum(p is None for p in probs)
    judge.check_readable(unreadable, max(total or 0, len(units)))
    out += [dataclasses.replace(
        u, process_prob=None if p is None else float(p),
        process_good=None if p is None else bool(p > judge.threshold))
            for u, p in zip(part, probs)]
    bar.update(len(part))
  return out
