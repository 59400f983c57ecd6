"""Step judges for SWiRL's process filter (and an optional outcome judge).

Every judge answers one batched question, `score(states, actions)`: the
probability that each action was a reasonable step given its state (P(GOOD)),
and `label(...)` thresholds it. Kinds:

  ModelJudge         a loaded decoder reads the GOOD/BAD prompt; P(GOOD)
                     from its next-token distribution, one forward per batch.
  HTTPJudge          an OpenAI-compatible `/v1/chat/completions` endpoint
                     (vLLM, hosted models): P(GOOD) from top log-probs, else
                     from the sampled word; retries, rate limit, disk cache.
  ProgrammaticJudge  synthetic tasks: checks the step against the task's
                     solution graph (no model at all).
  OutcomeJudge       the YES/NO prompt comparing a predicted with a gold
                     answer, over the model or HTTP backend (the default
                     outcome label comes from the answer checkers instead).

The process judge never sees the gold answer: it judges a decision at its
state, which is what lets process filtering keep well-reasoned trajectories
that ended wrong.
"""

import abc
import concurrent.futures
import dataclasses
import functools
import hashlib
import http.client
import json
import logging
import math
import os
import random
import re
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from swirl_jax import config_lib
from swirl_jax.models import decoder
from swirl_jax.rollout.records import StepUnit

# ------------------------------------------------------------------ prompts

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


# ---------------------------------------------------------------- interface


class Judge(abc.ABC):
  """P(GOOD) for (state, action) pairs; `label` is P(GOOD) > threshold.

  The comparison is strict, so an undecided 0.5 (an unreadable reply) is
  BAD: a filter should not keep what nobody vouched for.
  """
  threshold: float = 0.5

  @abc.abstractmethod
  def score(self, states: Sequence[str], actions: Sequence[str], *,
            task_ids: Sequence[str] | None = None) -> list[float]:
    """P(GOOD) per pair. `task_ids` is read only by judges that need it."""

  def label(self, states, actions, *, task_ids=None) -> list[bool]:
    return [p > self.threshold
            for p in self.score(states, actions, task_ids=task_ids)]


def label_units(judge: Judge, units: Sequence[StepUnit],
                chunk: int = 1024) -> list[StepUnit]:
  """Copies of `units` with `process_prob` / `process_good` filled in."""
  out = []
  for i in range(0, len(units), chunk):
    part = units[i:i + chunk]
    probs = judge.score([u.state_text for u in part],
                        [u.action_text for u in part],
                        task_ids=[u.task_id for u in part])
    out += [dataclasses.replace(u, process_prob=float(p),
                                process_good=bool(p > judge.threshold))
            for u, p in zip(part, probs)]
    logging.info("judged %d / %d steps", len(out), len(units))
  return out


def _check_lengths(*seqs):
  if len({len(s) for s in seqs}) > 1:
    raise ValueError(f"batch lengths differ: {[len(s) for s in seqs]}")


def _binary_prob(lp_pos: float, lp_neg: float) -> float:
  """softmax over the two log-probs -> P(positive)."""
  if lp_pos == -math.inf and lp_neg == -math.inf:
    return 0.5
  return float(1.0 / (1.0 + math.exp(min(700.0, lp_neg - lp_pos))))


# ------------------------------------------------------------ model backend


def _row_logprobs(params, tokens_BT, mask_BT, label_ids_L, *, cfg, tail):
  """What a scorer reads off one forward pass, not the whole vocabulary.

  Returns (label_BL, token_BK): log-probs of `label_ids_L` as the token
  after each row, and of each row's last `tail` tokens given their prefix.
  """
  h, _ = decoder.hidden_states(params, cfg, tokens_BT, None, mask_BT)
  logits = decoder.unembed_with(decoder.unembed_params(params, cfg), cfg,
                                h[:, -tail - 1:])
  lp = jax.nn.log_softmax(logits, axis=-1)  # [B, tail + 1, V]
  label = jnp.take(lp[:, -1], label_ids_L, axis=-1)
  targets = tokens_BT[:, -tail:, None]
  token = jnp.take_along_axis(lp[:, :-1], targets, axis=-1)[..., 0]
  return label, token


_JITTED = {}  # repr(cfg) -> jitted _row_logprobs


def _jitted_row_logprobs(cfg):
  """One jitted function per model config, shared by every scorer, so a new
  judge over the same model reuses compiled shapes. Keyed by repr: a config
  holding a dict (rope_scaling) is not hashable."""
  key = repr(cfg)
  if key not in _JITTED:
    _JITTED[key] = jax.jit(functools.partial(_row_logprobs, cfg=cfg),
                           static_argnames="tail")
  return _JITTED[key]


def _truncate_middle(ids: list[int], limit: int) -> list[int]:
  """Keeps the head (instructions, question) and the tail (the step)."""
  if len(ids) <= limit:
    return ids
  head = limit // 4
  return ids[:head] + ids[len(ids) - (limit - head):]


def _bucket(n: int, lo: int, hi: int) -> int:
  """Padded length: a power of two >= n (at least lo), capped at hi."""
  return min(hi, max(lo, 1 << max(0, n - 1).bit_length()))


class ModelScorer:
  """P(positive word) as the next reply of a loaded model, batched.

  Label ids. A word like GOOD may be several tokens, and which first token
  a model prefers depends on spacing ("GOOD" vs " GOOD"). scoring=
    'first_token' (one forward pass per batch): P of a word is the summed
        probability of the distinct first tokens of its variants ("GOOD",
        " GOOD"), each encoded as a continuation of the assistant header;
        P(GOOD) = P_good / (P_good + P_bad). For SmolLM2 these are
        {'GO', 'ĠGOOD'} vs {'B', 'ĠB'}. The first-token sets must not
        overlap (checked).
    'sequence' (one row per variant): P of a variant is the product of its
        tokens' probabilities (teacher forced), summed over variants; exact
        for multi-token words, at 4x the rows.
  Rows are left-padded to bucketed lengths (powers of two) and the batch to
  `batch_size`, so a few shapes compile once each.
  """

  def __init__(self, params, cfg, tokenizer, *, batch_size: int = 8,
               max_len: int = 2048, min_bucket: int = 64,
               scoring: str = "first_token"):
    if scoring not in ("first_token", "sequence"):
      raise ValueError(f"scoring {scoring!r}: 'first_token' or 'sequence'")
    self.params, self.cfg, self.tokenizer = params, cfg, tokenizer
    self.batch_size, self.max_len, self.min_bucket = (batch_size, max_len,
                                                      min_bucket)
    self.scoring = scoring
    self._fwd = _jitted_row_logprobs(cfg)
    specials = [tokenizer.id_to_piece(i) for i in tokenizer.special_ids]
    self._specials_re = re.compile("|".join(
        re.escape(s) for s in sorted(specials, key=len, reverse=True) if s))

  def variants(self, word: str) -> list[list[int]]:
    """Distinct token ids of `word` and ` word` as reply continuations."""
    out = []
    for v in (word, " " + word):
      ids = self.tokenizer.encode_continuation(v)
      if ids and ids not in out:
        out.append(ids)
    return out

  def label_token_ids(self, positive: str, negative: str):
    """(positive first-token ids, negative first-token ids), disjoint."""
    pos = sorted({v[0] for v in self.variants(positive)})
    neg = sorted({v[0] for v in self.variants(negative)})
    if set(pos) & set(neg):
      raise ValueError(f"{positive!r} and {negative!r} share a first token "
                       f"{sorted(set(pos) & set(neg))}; use scoring="
                       "'sequence'")
    return pos, neg

  def _prompt_ids(self, chat) -> list[int]:
    if self._specials_re.pattern:  # Content must not hold control tokens.
      chat = [dict(m, content=self._specials_re.sub("", m["content"]))
              for m in chat]
    return self.tokenizer.encode(self.tokenizer.apply_chat_template(
        chat, add_generation_prompt=True))

  def _run(self, rows: list[list[int]], label_ids: list[int], tail: int):
    """Per row: (log-probs of `label_ids` next, of its last `tail` tokens)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out = [None] * len(rows)
    labels = np.asarray(label_ids, np.int32)
    for s in range(0, len(order), self.batch_size):
      idx = order[s:s + self.batch_size]
      t = _bucket(max(len(rows[i]) for i in idx), self.min_bucket,
                  self.max_len)
      tokens = np.full((self.batch_size, t), self.tokenizer.pad_id, np.int32)
      mask = np.zeros((self.batch_size, t), bool)
      mask[:, -1] = True  # Filler rows see one token: finite, then dropped.
      for r, i in enumerate(idx):
        tokens[r, t - len(rows[i]):] = rows[i]
        mask[r, t - len(rows[i]):] = True
      label, token = jax.device_get(
          self._fwd(self.params, tokens, mask, labels, tail=tail))
      for r, i in enumerate(idx):
        out[i] = (label[r], token[r])
    return out

  def prob(self, chats: Sequence[list[dict]], positive: str,
           negative: str) -> list[float]:
    """P(reply starts with `positive` rather than `negative`), per chat."""
    if not chats:
      return []
    if self.scoring == "sequence":
      return self._prob_sequence(chats, positive, negative)
    pos, neg = self.label_token_ids(positive, negative)
    rows = [_truncate_middle(self._prompt_ids(c), self.max_len)
            for c in chats]
    res = self._run(rows, pos + neg, tail=1)
    return [_binary_prob(_lse(lab[:len(pos)]), _lse(lab[len(pos):]))
            for lab, _ in res]

  def _prob_sequence(self, chats, positive, negative):
    cands = self.variants(positive) + self.variants(negative)
    n_pos, width = len(self.variants(positive)), max(map(len, cands))
    rows = []
    for c in chats:
      prompt = _truncate_middle(self._prompt_ids(c), self.max_len - width)
      rows += [prompt + cand for cand in cands]
    res = self._run(rows, [], tail=width)
    out = []
    for k in range(len(chats)):
      word_lp = [float(res[k * len(cands) + j][1][width - len(cand):].sum())
                 for j, cand in enumerate(cands)]
      out.append(_binary_prob(_lse(word_lp[:n_pos]), _lse(word_lp[n_pos:])))
    return out


def _lse(x) -> float:
  x = np.asarray(x, np.float64)
  m = x.max()
  return float(m + np.log(np.exp(x - m).sum())) if np.isfinite(m) else float(m)


# ------------------------------------------------------------- HTTP backend


class JudgeError(RuntimeError):
  """A judge request failed for good (after retries, or not retryable)."""


class _RateLimiter:
  """At most `rate` acquisitions per second, across threads (0: no limit)."""

  def __init__(self, rate: float):
    self._interval = 1.0 / rate if rate > 0 else 0.0
    self._next = 0.0
    self._lock = threading.Lock()

  def acquire(self) -> None:
    if not self._interval:
      return
    with self._lock:
      now = time.monotonic()
      wait = self._next - now
      self._next = max(now, self._next) + self._interval
    if wait > 0:
      time.sleep(wait)


class _DiskCache:
  """sqlite key -> JSON value, shared by the worker threads."""

  def __init__(self, path: str):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    self._db = sqlite3.connect(path, check_same_thread=False, timeout=30)
    self._lock = threading.Lock()
    with self._lock:
      self._db.execute("CREATE TABLE IF NOT EXISTS judge "
                       "(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
      self._db.commit()

  def get(self, key: str):
    with self._lock:
      row = self._db.execute("SELECT value FROM judge WHERE key = ?",
                             (key,)).fetchone()
    return None if row is None else json.loads(row[0])

  def put(self, key: str, value) -> None:
    with self._lock:
      self._db.execute("INSERT OR REPLACE INTO judge VALUES (?, ?)",
                       (key, json.dumps(value)))
      self._db.commit()


def _chat_url(base_url: str) -> str:
  """'http://h:8000', '.../v1' or the full '.../v1/chat/completions'."""
  url = base_url.rstrip("/")
  if url.endswith("/chat/completions"):
    return url
  return url + ("/chat/completions" if url.endswith("/v1") else
                "/v1/chat/completions")


def _word_match(token: str, word: str) -> bool:
  """A reply token that starts (or is) `word`: 'GO' and 'Good' for GOOD."""
  t = token.strip().strip("*\"'`").upper()
  return bool(t) and (word.startswith(t) or t.startswith(word))


def _prob_from_logprobs(choice: dict, pos: str, neg: str) -> float | None:
  """P(pos) from the top log-probs of the reply's first non-blank token."""
  content = (choice.get("logprobs") or {}).get("content") or []
  for entry in content:
    if not entry.get("token", "").strip().strip("*\"'`"):
      continue  # Leading blanks or markdown: look at the next token.
    top = entry.get("top_logprobs") or [entry]
    p_pos = p_neg = 0.0
    for alt in top:
      a, b = _word_match(alt["token"], pos), _word_match(alt["token"], neg)
      if a != b:
        p = math.exp(alt["logprob"])
        p_pos, p_neg = p_pos + a * p, p_neg + b * p
    return p_pos / (p_pos + p_neg) if p_pos + p_neg > 0 else None
  return None


def _prob_from_text(text: str, pos: str, neg: str) -> float | None:
  words = re.findall(r"[A-Za-z]+", text.upper())
  has_pos, has_neg = pos in words, neg in words
  if words and words[0] in (pos, neg):
    return 1.0 if words[0] == pos else 0.0
  if has_pos != has_neg:
    return 1.0 if has_pos else 0.0
  return None


class HTTPScorer:
  """P(positive word) from an OpenAI-compatible chat endpoint.

  Each chat is one request (temperature 0, a few tokens, `logprobs=true,
  top_logprobs=k`). P comes from the first reply token's top log-probs
  when the server returns them, else from the reply text (positive -> 1,
  negative -> 0, neither -> 0.5, counted in `unparsed`). 429, 408, 5xx and
  connection errors are retried with exponential backoff and jitter
  (honouring Retry-After); other errors raise JudgeError. Replies are cached
  on disk by a hash of the request body (model + messages + settings), so a
  rerun pays only for what it has not asked before. The API key is read
  from the environment variable named `api_key_env` and never logged.
  """

  def __init__(self, base_url: str, model: str, *, api_key_env: str = "",
               max_concurrency: int = 8, requests_per_second: float = 0.0,
               max_retries: int = 5, backoff_s: float = 1.0,
               max_backoff_s: float = 60.0, timeout_s: float = 120.0,
               cache_path: str = "", logprobs: bool = True,
               top_logprobs: int = 5, max_tokens: int = 4,
               temperature: float = 0.0, extra_body: dict | None = None):
    self.url, self.model = _chat_url(base_url), model
    self._api_key = ""
    if api_key_env:
      if api_key_env not in os.environ:
        raise JudgeError(f"environment variable {api_key_env} (the judge's "
                         "API key) is not set")
      self._api_key = os.environ[api_key_env]
    self.max_concurrency, self.max_retries = max_concurrency, max_retries
    self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
    self.timeout_s = timeout_s
    self.settings = dict(temperature=temperature, max_tokens=max_tokens,
                         **({"logprobs": True, "top_logprobs": top_logprobs}
                            if logprobs else {}), **(extra_body or {}))
    self._limiter = _RateLimiter(requests_per_second)
    self._cache = _DiskCache(cache_path) if cache_path else None
    self.requests_sent = 0  # HTTP attempts, retries included.
    self.unparsed = 0  # Replies read as 0.5.
    self._count_lock = threading.Lock()

  def __repr__(self):  # No key here, ever.
    return f"HTTPScorer(url={self.url!r}, model={self.model!r})"

  def prob(self, chats: Sequence[list[dict]], positive: str,
           negative: str) -> list[float]:
    if not chats:
      return []
    workers = max(1, min(self.max_concurrency, len(chats)))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      return list(pool.map(lambda c: self._one(c, positive, negative), chats))

  def _one(self, chat, positive, negative) -> float:
    body = dict(model=self.model, messages=list(chat), **self.settings)
    key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    hit = self._cache.get(key) if self._cache else None
    if hit is None:
      reply = self._post(body)
      choice = (reply.get("choices") or [{}])[0]
      hit = dict(text=(choice.get("message") or {}).get("content") or "",
                 lp=_prob_from_logprobs(choice, positive, negative))
      if self._cache:
        self._cache.put(key, hit)
    p = hit["lp"] if hit["lp"] is not None else _prob_from_text(
        hit["text"], positive, negative)
    if p is None:
      with self._count_lock:
        self.unparsed += 1
      logging.warning("judge reply is neither %s nor %s (%d so far): %.80r",
                      positive, negative, self.unparsed, hit["text"])
      return 0.5
    return float(p)

  def _post(self, body: dict) -> dict:
    data = json.dumps(body).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if self._api_key:
      headers["Authorization"] = "Bearer " + self._api_key
    for attempt in range(self.max_retries + 1):
      self._limiter.acquire()
      with self._count_lock:
        self.requests_sent += 1
      retry_after, why = None, ""
      try:
        req = urllib.request.Request(self.url, data=data, headers=headers,
                                     method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
          return json.loads(resp.read().decode("utf-8"))
      except urllib.error.HTTPError as e:
        detail = e.read(300).decode("utf-8", "replace")
        if e.code not in (408, 429) and e.code < 500:
          raise JudgeError(f"{self.url}: HTTP {e.code}: {detail}") from None
        why, retry_after = f"HTTP {e.code}", e.headers.get("Retry-After")
      except (urllib.error.URLError, ConnectionError, TimeoutError,
              http.client.HTTPException, json.JSONDecodeError) as e:
        why = f"{type(e).__name__}: {e}"
      if attempt == self.max_retries:
        raise JudgeError(f"{self.url}: gave up after {attempt + 1} attempts "
                         f"({why})")
      time.sleep(self._delay(attempt, retry_after))
    raise AssertionError("unreachable")

  def _delay(self, attempt: int, retry_after) -> float:
    delay = self.backoff_s * 2 ** attempt * (1 + 0.25 * random.random())
    try:
      delay = max(delay, float(retry_after))
    except (TypeError, ValueError):
      pass
    return min(delay, self.max_backoff_s)


# ------------------------------------------------------------------- judges


class _ScorerJudge(Judge):
  """The GOOD/BAD process prompt over a scorer (model or HTTP)."""

  def __init__(self, scorer, threshold: float = 0.5):
    self.scorer, self.threshold = scorer, threshold

  def score(self, states, actions, *, task_ids=None) -> list[float]:
    _check_lengths(states, actions)
    return self.scorer.prob([process_chat(s, a)
                             for s, a in zip(states, actions)], "GOOD", "BAD")


class ModelJudge(_ScorerJudge):
  """The GOOD/BAD prompt on a loaded model: `ModelJudge(params, cfg, tok)`.

  Keyword options go to `ModelScorer` (batch_size, max_len, scoring).
  """

  def __init__(self, params, cfg, tokenizer, *, threshold: float = 0.5,
               **scorer_kw):
    super().__init__(ModelScorer(params, cfg, tokenizer, **scorer_kw),
                     threshold)


class HTTPJudge(_ScorerJudge):
  """The GOOD/BAD prompt on an OpenAI-compatible endpoint (see HTTPScorer)."""

  def __init__(self, base_url: str, model: str, *, threshold: float = 0.5,
               **scorer_kw):
    super().__init__(HTTPScorer(base_url, model, **scorer_kw), threshold)


class OutcomeJudge:
  """YES/NO: does a predicted answer match the gold one? (LLM as judge.)

  `backend` is a ModelJudge / HTTPJudge (its scorer is reused) or a scorer.
  """

  def __init__(self, backend, threshold: float = 0.5):
    self.scorer = getattr(backend, "scorer", backend)
    self.threshold = threshold

  def score(self, questions: Sequence[str], predictions: Sequence[str],
            golds: Sequence[str]) -> list[float]:
    _check_lengths(questions, predictions, golds)
    return self.scorer.prob([outcome_chat(q, p, g) for q, p, g in
                             zip(questions, predictions, golds)], "YES", "NO")

  def label(self, questions, predictions, golds) -> list[bool]:
    return [p > self.threshold
            for p in self.score(questions, predictions, golds)]


# ---------------------------------------------------- synthetic tasks, exact


def _solution(task) -> dict[str, Any]:
  """The one place that reads `tasks/synthetic.py`'s solution graphs.

  Returns {'kind': 'arith', 'values': every step's value} or
  {'kind': 'multihop', 'hops': [(entity, answer), ...]}.
  """
  graph = task.metadata.get("solution_graph")
  if graph is None:
    raise ValueError(f"task {task.id} has no metadata['solution_graph']")
  if task.source == "synthetic_arith":
    return {"kind": "arith", "values": [float(s["value"]) for s in graph]}
  if task.source == "synthetic_multihop":
    return {"kind": "multihop",
            "hops": [(h["entity"], h["answer"]) for h in graph]}
  raise ValueError(f"no programmatic judge for source {task.source!r}")


def _calculator_value(expression: str) -> float | None:
  """The number the calculator tool would return, or None."""
  from swirl_jax.tools import calculator  # pylint: disable=g-import-not-at-top
  try:  # In-process: the walker bounds powers and factorials itself.
    text = calculator.evaluate(expression)
    return float(text.split("≈")[-1])
  except Exception:  # pylint: disable=broad-except
    return None


def _norm(text: str) -> str:
  return " ".join(text.lower().split())


class ProgrammaticJudge(Judge):
  """Exact step labels for synthetic tasks, from their solution graphs.

  GOOD (1.0) when the step (parsed in the SWiRL format) is
    arithmetic: a `<math_exp>` whose value is one of the graph's values
        (an intermediate or the final one), or the right `<answer>`;
    multi-hop: a `<search_query>` naming the entity of a hop not yet
        resolved (its answer does not appear in the state), or the right
        `<answer>`.
  Anything else (void or invalid turns, the wrong tool, a wrong answer) is
  BAD (0.0). Tasks are found by `task_ids`, else by their question text
  appearing in the state.
  """

  def __init__(self, tasks: Sequence[Any], threshold: float = 0.5):
    self.tasks = {t.id: t for t in tasks}
    self.threshold = threshold

  def _task(self, state: str, task_id: str | None):
    if task_id is not None and task_id in self.tasks:
      return self.tasks[task_id]
    found = [t for t in self.tasks.values() if t.question in state]
    if not found:
      raise ValueError(f"no task for id {task_id!r} or the state's question")
    return max(found, key=lambda t: len(t.question))

  def score(self, states, actions, *, task_ids=None) -> list[float]:
    _check_lengths(states, actions)
    ids = list(task_ids) if task_ids is not None else [None] * len(states)
    return [self.score_one(self._task(s, i), s, a)
            for s, a, i in zip(states, actions, ids)]

  def score_one(self, task, state: str, action: str) -> float:
    from swirl_jax.tasks import checkers  # pylint: disable=g-import-not-at-top
    from swirl_jax.tools import parsing  # pylint: disable=g-import-not-at-top
    turn = parsing.parse_turn(action, "swirl")
    if turn.is_answer:
      return float(checkers.check(task, turn.answer))
    if not turn.is_call:
      return 0.0
    sol = _solution(task)
    if sol["kind"] == "arith" and turn.tool == "calculator":
      v = _calculator_value(turn.argument)
      return float(v is not None and any(
          math.isclose(v, x, rel_tol=1e-9, abs_tol=1e-6)
          for x in sol["values"]))
    if sol["kind"] == "multihop" and turn.tool == "search":
      seen, query = _norm(state), _norm(turn.argument)
      return float(any(_norm(e) in query and _norm(a) not in seen
                       for e, a in sol["hops"]))
    return 0.0


# ----------------------------------------------------------------- registry

KINDS = ("model", "http", "programmatic")


def default_config(kind: str = "http") -> ml_collections.ConfigDict:
  """A judge config block with every field of `kind` at its default."""
  common = dict(kind=kind, threshold=0.5)
  if kind == "model":
    return ml_collections.ConfigDict(dict(
        common, model=config_lib.model_config(), batch_size=8, max_len=2048,
        scoring="first_token"))
  if kind == "http":
    return ml_collections.ConfigDict(dict(
        common, base_url="http://127.0.0.1:8000", model_name="",
        api_key_env="", max_concurrency=8, requests_per_second=0.0,
        max_retries=5, backoff_s=1.0, max_backoff_s=60.0, timeout_s=120.0,
        cache_path="", logprobs=True, top_logprobs=5, max_tokens=4,
        temperature=0.0))
  if kind == "programmatic":
    return ml_collections.ConfigDict(common)
  raise ValueError(f"judge kind {kind!r}; valid: {KINDS}")


def make_judge(config, tasks: Sequence[Any] | None = None,
               model: tuple | None = None) -> Judge:
  """The judge a config block describes (see `default_config`).

  Args:
    config: ConfigDict with `kind` and that kind's fields.
    tasks: the tasks being judged (required by 'programmatic').
    model: an already loaded (cfg, params, tokenizer) for 'model', e.g. the
      policy itself; else `config.model` is loaded.
  """
  c = config
  if c.kind == "model":
    if model is None:
      from swirl_jax.models import loading  # pylint: disable=g-import-not-at-top
      model = loading.load_policy(c.model)
    cfg, params, tok = model
    return ModelJudge(params, cfg, tok, threshold=c.threshold,
                      batch_size=c.batch_size, max_len=c.max_len,
                      scoring=c.scoring)
  if c.kind == "http":
    if not c.model_name:
      raise ValueError("judge.model_name is empty: name the served model")
    return HTTPJudge(
        c.base_url, c.model_name, threshold=c.threshold,
        api_key_env=c.api_key_env, max_concurrency=c.max_concurrency,
        requests_per_second=c.requests_per_second,
        max_retries=c.max_retries, backoff_s=c.backoff_s,
        max_backoff_s=c.max_backoff_s, timeout_s=c.timeout_s,
        cache_path=c.cache_path, logprobs=c.logprobs,
        top_logprobs=c.top_logprobs, max_tokens=c.max_tokens,
        temperature=c.temperature)
  if c.kind == "programmatic":
    if tasks is None:
      raise ValueError("a programmatic judge needs the tasks")
    return ProgrammaticJudge(tasks, threshold=c.threshold)
  raise ValueError(f"judge kind {c.kind!r}; valid: {KINDS}")
