"""The HTTP judge: an OpenAI-compatible `/v1/chat/completions` endpoint.

Requests go through `requests` with urllib3's `Retry` on the adapter: 429,
500, 502, 503 and 504 replies, connection and read errors are retried
(POST included) with exponential backoff, honouring `Retry-After` up to
`max_backoff_s`; each retry is logged with its reason, at most once per
`retry_log_every_s` seconds. Readable replies are cached on disk (sqlite)
by a hash of the URL and request body, so a rerun or a resume after a kill
pays only for what it has not asked; unreadable ones are never cached.

The API key is read from the environment variable named `api_key_env`; it
never appears in a repr, a log line or an error message.
"""

import concurrent.futures
import hashlib
import json
import logging
import os
import threading
import time
from typing import Sequence

import requests
from requests import adapters
from urllib3.exceptions import MaxRetryError
from urllib3.util import Retry

from swirl_jax.judges import base, http_support, replies

RETRY_STATUS = (429, 500, 502, 503, 504)


class _Retry(Retry):
  """urllib3's Retry that reports each retry it grants to `on_retry` and
  waits no longer than `backoff_max` for a `Retry-After`."""

  def __init__(self, *args, on_retry=None, **kw):
    super().__init__(*args, **kw)
    self.on_retry = on_retry

  def new(self, **kw):
    kw.setdefault("on_retry", self.on_retry)
    return super().new(**kw)

  def parse_retry_after(self, retry_after: str) -> float:
    return min(super().parse_retry_after(retry_after), self.backoff_max)

  def increment(self, method=None, url=None, response=None, error=None,
                _pool=None, _stacktrace=None):
    new = super().increment(method, url, response, error, _pool, _stacktrace)
    if self.on_retry is not None:  # Past the raise: a retry will happen.
      self.on_retry(f"HTTP {response.status}" if response is not None and
                    response.status else f"{type(error).__name__}: {error}")
    return new


def chat_url(base_url: str) -> str:
  """'http://h:8000', '.../v1' or the full '.../v1/chat/completions'."""
  url = base_url.rstrip("/")
  if url.endswith("/chat/completions"):
    return url
  return url + ("/chat/completions" if url.endswith("/v1") else
                "/v1/chat/completions")


class HTTPScorer:
  """P(positive word) from an OpenAI-compatible chat endpoint.

  Each chat is one request (temperature 0, a few tokens, `logprobs=true,
  top_logprobs=k`), read by `replies`. `prob` gives None for a reply that
  says neither word (an error body, prose), counted in `unparsed`;
  `check_readable` is the judges' test that no more than `max_unparsable`
  of a batch was. A status outside `RETRY_STATUS` (400, 401, ...) raises
  JudgeError at once.
  """

  def __init__(self, base_url: str, model: str, *, api_key_env: str = "",
               max_concurrency: int = 8, requests_per_second: float = 0.0,
               max_retries: int = 5, backoff_s: float = 1.0,
               max_backoff_s: float = 60.0, timeout_s: float = 120.0,
               cache_path: str = "", logprobs: bool = True,
               top_logprobs: int = 20, max_tokens: int = 8,
               temperature: float = 0.0, max_unparsable: float = 0.1,
               retry_log_every_s: float = 30.0,
               extra_body: dict | None = None):
    self.url, self.model = chat_url(base_url), model
    self._api_key = ""
    if api_key_env:
      if api_key_env not in os.environ:
        raise base.JudgeError(f"environment variable {api_key_env} (the "
                              "judge's API key) is not set")
      self._api_key = os.environ[api_key_env]
    self.max_concurrency, self.max_retries = max_concurrency, max_retries
    self.timeout_s, self.max_unparsable = timeout_s, max_unparsable
    self.retry_log_every_s = retry_log_every_s
    self.settings = dict(temperature=temperature, max_tokens=max_tokens,
                         **({"logprobs": True, "top_logprobs": top_logprobs}
                            if logprobs else {}), **(extra_body or {}))
    retry = _Retry(
        total=max_retries, status_forcelist=RETRY_STATUS,
        allowed_methods=frozenset({"POST"}), backoff_factor=backoff_s,
        backoff_max=max_backoff_s, backoff_jitter=0.25 * backoff_s,
        on_retry=self._on_retry)
    self._adapter = adapters.HTTPAdapter(max_retries=retry,
                                         pool_maxsize=max_concurrency)
    self._local = threading.local()  # One requests.Session per thread.
    self._limiter = http_support.RateLimiter(requests_per_second)
    self._cache = http_support.DiskCache(cache_path) if cache_path else None
    self.cache_path = cache_path
    self.requests_sent = 0  # HTTP attempts, retries included.
    self.unparsed = 0  # Replies that said neither word.
    self.last_unreadable = ""  # One of them, cut to 200 characters.
    self._lock = threading.Lock()
    self._last_log, self._quiet_retries = -float("inf"), 0

  def __repr__(self):  # No key here, ever.
    return f"HTTPScorer(url={self.url!r}, model={self.model!r})"

  def _redact(self, text: str) -> str:
    return text.replace(self._api_key, "***") if self._api_key else text

  def _on_retry(self, reason: str) -> None:
    """Counts a retry; logs it unless one was logged < N seconds ago."""
    with self._lock:
      self.requests_sent += 1
      now = time.monotonic()
      if now - self._last_log < self.retry_log_every_s:
        self._quiet_retries += 1
        return
      quiet, self._quiet_retries, self._last_log = self._quiet_retries, 0, now
    logging.warning("judge %s: retrying after %s (%d more retries since the "
                    "last message)", self.url, self._redact(reason), quiet)

  def _session(self) -> requests.Session:
    s = getattr(self._local, "session", None)
    if s is None:
      s = self._local.session = requests.Session()
      s.mount("http://", self._adapter)
      s.mount("https://", self._adapter)
    return s

  def prob(self, chats: Sequence[list[dict]], positive: str,
           negative: str) -> list[float | None]:
    """P(positive) per chat; None where the reply says neither word."""
    if not chats:
      return []
    workers = max(1, min(self.max_concurrency, len(chats)))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      res = list(pool.map(lambda c: self._one(c, positive, negative), chats))
    bad = [raw for p, raw in res if p is None]
    if bad:
      self.last_unreadable = bad[0]
      logging.warning("judge %s: %d of %d replies are neither %s nor %s "
                      "(not cached); one: %r", self.url, len(bad), len(res),
                      positive, negative, bad[0])
    return [p for p, _ in res]

  def check_readable(self, unreadable: int, total: int, positive: str,
                     negative: str) -> None:
    """Raises when more than `max_unparsable` of `total` replies were
    unreadable, quoting the last call's first unreadable reply."""
    if unreadable > self.max_unparsable * total:
      raise base.JudgeError(
          f"{self.url}: {unreadable} of {total} replies are neither "
          f"{positive} nor {negative} (more than max_unparsable="
          f"{self.max_unparsable:g}); one reply: {self.last_unreadable!r}")

  def _one(self, chat, positive, negative) -> tuple[float | None, str]:
    """(P(positive) or None, the raw reply cut to 200 chars if unread)."""
    body = dict(model=self.model, messages=list(chat), **self.settings)
    key = hashlib.sha256(json.dumps([self.url, body], sort_keys=True)
                         .encode()).hexdigest()
    hit = self._cache.get(key) if self._cache else None
    p = replies.reply_prob(hit, positive, negative) if hit else None
    if p is not None:  # Unreadable entries (older caches) are asked again.
      return p, ""
    reply, raw = self._post(body)
    hit = replies.read_reply(reply, positive, negative)
    p = replies.reply_prob(hit, positive, negative)
    if p is None:
      with self._lock:
        self.unparsed += 1
      return None, self._redact(raw[:200])
    if self._cache:
      self._cache.put(key, hit)
    return p, ""

  def _post(self, body: dict):
    """(decoded JSON reply or None, raw text) of one request, retried."""
    headers = {"Authorization": "Bearer " + self._api_key} \
        if self._api_key else {}
    self._limiter.acquire()
    with self._lock:
      self.requests_sent += 1
    try:
      resp = self._session().post(self.url, json=body, headers=headers,
                                  timeout=self.timeout_s)
    except requests.RequestException as e:
      cause = e.args[0] if e.args else e
      if isinstance(cause, MaxRetryError):
        raise base.JudgeError(self._redact(
            f"{self.url}: gave up after {self.max_retries + 1} attempts "
            f"({cause.reason})")) from None
      raise base.JudgeError(self._redact(
          f"{self.url}: {type(e).__name__}: {e}")) from None
    if resp.status_code >= 400:
      raise base.JudgeError(self._redact(
          f"{self.url}: HTTP {resp.status_code}: {resp.text[:300]!r}"))
    try:
      return resp.json(), resp.text
    except ValueError:
      return None, resp.text


class HTTPJudge(base.ScorerJudge):
  """The GOOD/BAD prompt on an OpenAI-compatible endpoint (see HTTPScorer)."""

  def __init__(self, base_url: str, model: str, *, threshold: float = 0.5,
               **scorer_kw):
    super().__init__(HTTPScorer(base_url, model, **scorer_kw), threshold)
