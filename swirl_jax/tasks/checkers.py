"""Answer checkers: is a predicted final answer right?

- Maths (MATH, AIME): math-verify equivalence of the gold and predicted
  answers, each wrapped in `\\boxed{}` as the SimpleTIR reward does, with
  normalised string equality as the fallback. math-verify bounds its own
  time with `signal.alarm`, which works only in the main thread; from any
  other thread the check runs in a worker process (killed if it overruns),
  whose main thread can use the alarm.
- GSM8K-style numbers: the last number of the prediction (commas, `$`,
  `%` and units ignored) equals the gold number.
- QA (HotPotQA, MuSiQue): SQuAD / HotPotQA answer normalisation, exact
  match and token F1, best over the gold aliases.

`check(task, predicted)` picks the checker from `task.source`; `score`
also returns F1; `check_batch` checks many answers in parallel processes;
`score_trajectories` sets rollouts' outcomes and rewards.
"""

import collections
import fractions
import functools
import math
import os
import re
import string
import threading

import math_verify

from swirl_jax.tasks import records
from swirl_jax.tools import parsing
from swirl_jax.tools import workers

MATH_TIMEOUT_S = 5  # SimpleTIR's scoring timeout.


# ------------------------------------------------------------------ maths.


def _boxed(answer: str) -> str:
  inner = parsing.extract_boxed(answer)
  return "\\boxed{" + (answer if inner is None else inner) + "}"


def _plain(answer: str) -> str:
  """For the string fallback: no box, `$`, spaces or trailing period."""
  inner = parsing.extract_boxed(answer)
  text = answer if inner is None else inner
  return re.sub(r"\s+|\$", "", text).rstrip(".")


def _math_equal_here(args) -> bool:
  """math-verify in this process (a main thread), then string equality."""
  gold, predicted, timeout_s = args
  try:
    g = math_verify.parse(_boxed(gold), parsing_timeout=timeout_s)
    p = math_verify.parse(_boxed(predicted), parsing_timeout=timeout_s)
    if g and p and math_verify.verify(g, p, timeout_seconds=timeout_s):
      return True
  except Exception:  # pylint: disable=broad-except
    pass  # Unparsable answers still get the string comparison.
  return bool(_plain(gold)) and _plain(gold) == _plain(predicted)


_POOL_LOCK = threading.Lock()  # Threads' first calls make one pool.


def _pool() -> workers.WorkerPool:
  """The process's checker workers, one per CPU, made on first use (the
  same size whoever asks first)."""
  with _POOL_LOCK:
    return _new_pool()


@functools.cache
def _new_pool() -> workers.WorkerPool:
  return workers.WorkerPool(_math_equal_here, num_workers=os.cpu_count() or 2,
                            timeout_s=3 * MATH_TIMEOUT_S,
                            initializer=_warm_up)


def _warm_up():
  _math_equal_here(("1", "1", MATH_TIMEOUT_S))  # Imports and caches.


def math_equal(gold: str, predicted: str | None,
               timeout_s: int = MATH_TIMEOUT_S) -> bool:
  """Whether `predicted` is mathematically equivalent to `gold`."""
  if predicted is None or not str(predicted).strip():
    return False
  args = (str(gold), str(predicted), timeout_s)
  if threading.current_thread() is threading.main_thread():
    return _math_equal_here(args)
  ok, value = _pool().run(args, timeout_s=3 * timeout_s)
  return bool(ok and value)


# ---------------------------------------------------------------- numbers.

_NUMBER_RE = re.compile(r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+)?")


def extract_number(text: str) -> str | None:
  """The last number in text (in its box or after '####' if there is one),
  commas removed; None if there is none."""
  if text is None:
    return None
  text = str(text)
  boxed = parsing.extract_boxed(text)
  if boxed is not None:
    text = boxed
  elif "####" in text:
    text = text.rpartition("####")[2]
  found = _NUMBER_RE.findall(text.replace("$", ""))
  return found[-1].replace(",", "").replace(" ", "") if found else None


def _to_number(text):
  try:
    return fractions.Fraction(text)
  except (ValueError, ZeroDivisionError, TypeError):
    return None


def numeric_equal(gold: str, predicted: str | None) -> bool:
  """GSM8K-style: the prediction's last number equals the gold number."""
  g = _to_number(extract_number(gold))
  p = _to_number(extract_number(predicted))
  if g is None or p is None:
    return False
  return math.isclose(float(g), float(p), rel_tol=1e-9, abs_tol=1e-9)


# --------------------------------------------------------------------- QA.


def normalize_answer(s: str) -> str:
  """SQuAD / HotPotQA normalisation: lower case, no punctuation, no
  articles, single spaces."""
  s = str(s).lower()
  s = "".join(ch for ch in s if ch not in set(string.punctuation))
  s = re.sub(r"\b(a|an|the)\b", " ", s)
  return " ".join(s.split())


def exact_match(gold: str, predicted: str | None) -> bool:
  return predicted is not None and (
      normalize_answer(gold) == normalize_answer(predicted))


def f1_score(gold: str, predicted: str | None) -> float:
  """Token F1 after normalisation (HotPotQA: yes/no must match exactly)."""
  if predicted is None:
    return 0.0
  g, p = normalize_answer(gold), normalize_answer(predicted)
  if (g in ("yes", "no", "noanswer") or p in ("yes", "no", "noanswer")) and (
      g != p):
    return 0.0
  common = collections.Counter(g.split()) & collections.Counter(p.split())
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(p.split()), same / len(g.split())
  return 2 * precision * recall / (precision + recall)


def qa_exact_match(golds, predicted) -> bool:
  return any(exact_match(g, predicted) for g in golds)


def qa_f1(golds, predicted) -> float:
  return max((f1_score(g, predicted) for g in golds), default=0.0)


# --------------------------------------------------------------- dispatch.

_KIND = {"gsm8k": "number", "synthetic_arith": "number", "math": "math",
         "aime": "math", "hotpotqa": "qa", "musique": "qa",
         "synthetic_multihop": "qa"}


def answer_kind(source: str) -> str:
  """'number', 'math' or 'qa': how answers of `source` are compared."""
  if source not in _KIND:
    raise ValueError(f"no answer checker for source {source!r}; known: "
                     f"{sorted(_KIND)}")
  return _KIND[source]


def check(task: records.Task, predicted: str | None) -> bool:
  """Whether `predicted` answers `task` correctly."""
  kind = answer_kind(task.source)
  if predicted is None:
    return False
  if kind == "number":
    return any(numeric_equal(g, predicted) for g in task.answers)
  if kind == "math":
    return any(math_equal(g, predicted) for g in task.answers)
  return qa_exact_match(task.answers, predicted)


def score(task: records.Task, predicted: str | None) -> dict[str, float]:
  """`correct` (0/1) and `f1` (token F1 for QA, else equal to correct)."""
  correct = float(check(task, predicted))
  if answer_kind(task.source) == "qa":
    return {"correct": correct, "f1": qa_f1(task.answers, predicted)}
  return {"correct": correct, "f1": correct}


def check_batch(tasks, predictions) -> list[bool]:
  """`check` over pairs; maths answers run in parallel worker processes."""
  tasks, predictions = list(tasks), list(predictions)
  if len(tasks) != len(predictions):
    raise ValueError(f"{len(tasks)} tasks but {len(predictions)} predictions")
  out = [None] * len(tasks)
  jobs = []
  for i, (t, p) in enumerate(zip(tasks, predictions)):
    if answer_kind(t.source) == "math" and p is not None and str(p).strip():
      jobs.extend((i, (g, str(p), MATH_TIMEOUT_S)) for g in t.answers)
    else:
      out[i] = check(t, p)
  if jobs:
    results = _pool().map([args for _, args in jobs],
                                      timeout_s=3 * MATH_TIMEOUT_S)
    for (i, _), (ok, value) in zip(jobs, results):
      out[i] = bool(out[i]) or bool(ok and value)
  return [bool(x) for x in out]


def score_trajectories(trajectories, tasks) -> None:
  """Sets each trajectory's `outcome` and `reward` (1/0) from its task's
  checker (`check_batch` on the final answers)."""
  by_id = {t.id: t for t in tasks}
  trajs = list(trajectories)
  ok = check_batch([by_id[t.task_id] for t in trajs],
                   [t.final_answer for t in trajs])
  for t, o in zip(trajs, ok):
    t.outcome, t.reward = bool(o), float(o)
