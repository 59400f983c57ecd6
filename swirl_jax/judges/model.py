"""The model judge: P(GOOD) from a loaded decoder's next-token distribution.

The forward pass is the training step's: `step.token_logprobs` (and the
chunked log-prob op under it) scores the reply words, so a judge over the
policy reads the same log-probs training does. Rows are left-padded to the
sampler's length buckets (powers of two up to `max_len`) and the batch to
`batch_size`, so a few shapes compile once each per scorer.
"""

import functools
import re
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from swirl_jax.judges import base
from swirl_jax.models import decoder
from swirl_jax.ops import logprobs as lp_ops
from swirl_jax.shapes import bucket
from swirl_jax.training import step as step_lib


def _next_token_logprobs(params, tokens_BT, mask_BT, label_ids_L, *, cfg):
  """log P(label | row) for each of `label_ids_L` as the next token: [B, L].

  `step.token_logprobs` scores the one token that follows each position;
  here L alternatives follow the same (last) position, so its hidden state
  is repeated L times into the same chunked log-prob op.
  """
  h_BTD, _ = decoder.hidden_states(params, cfg, tokens_BT, None, mask_BT)
  (B, _, D), L = h_BTD.shape, label_ids_L.shape[0]
  logp_BL, _ = lp_ops.token_logprobs(
      decoder.unembed_params(params, cfg),
      jnp.broadcast_to(h_BTD[:, -1:], (B, L, D)),
      jnp.broadcast_to(label_ids_L, (B, L)),
      lambda sub, h: decoder.unembed_with(sub, cfg, h))
  return logp_BL


def _token_logprobs(params, tokens_BT, mask_BT, *, cfg):
  """The step's log-probs, entry t scoring token t + 1: [B, T - 1]."""
  logp_BT, _ = step_lib.token_logprobs(
      params, cfg, dict(tokens=tokens_BT, attention_mask=mask_BT))
  return logp_BT


def truncate_middle(ids: list[int], limit: int) -> list[int]:
  """Keeps the head (instructions, question) and the tail (the step)."""
  if len(ids) <= limit:
    return ids
  head = limit // 4
  return ids[:head] + ids[len(ids) - (limit - head):]


def _log_sum(lp) -> float:
  """log of the summed probabilities of alternatives (variants of a word)."""
  return float(np.logaddexp.reduce(np.asarray(lp, np.float64)))


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
  A model's reply is always readable: `prob` never returns None.
  """

  def __init__(self, params, cfg, tokenizer, *, batch_size: int = 8,
               max_len: int = 2048, min_bucket: int = 64,
               scoring: str = "first_token"):
    if scoring not in ("first_token", "sequence"):
      raise ValueError(f"scoring {scoring!r}: 'first_token' or 'sequence'")
    self.params, self.cfg, self.tokenizer = params, cfg, tokenizer
    self.batch_size, self.max_len, self.scoring = batch_size, max_len, scoring
    self.length_buckets = tuple(
        b for b in (2 ** i for i in range(31)) if min_bucket <= b < max_len
    ) + (max_len,)
    self._next = jax.jit(functools.partial(_next_token_logprobs, cfg=cfg))
    self._tokens = jax.jit(functools.partial(_token_logprobs, cfg=cfg))
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

  def _batches(self, rows: list[list[int]]):
    """(row indices, tokens, mask): rows sorted by length, left-padded."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    for s in range(0, len(order), self.batch_size):
      idx = order[s:s + self.batch_size]
      t = bucket(max(len(rows[i]) for i in idx), self.length_buckets)
      tokens = np.full((self.batch_size, t), self.tokenizer.pad_id, np.int32)
      mask = np.zeros((self.batch_size, t), bool)
      mask[:, -1] = True  # Filler rows see one token: finite, then dropped.
      for r, i in enumerate(idx):
        tokens[r, t - len(rows[i]):] = rows[i]
        mask[r, t - len(rows[i]):] = True
      yield idx, tokens, mask

  def prob(self, chats: Sequence[list[dict]], positive: str,
           negative: str) -> list[float]:
    """P(reply starts with `positive` rather than `negative`), per chat."""
    if not chats:
      return []
    if self.scoring == "sequence":
      return self._prob_sequence(chats, positive, negative)
    pos, neg = self.label_token_ids(positive, negative)
    labels = np.asarray(pos + neg, np.int32)
    rows = [truncate_middle(self._prompt_ids(c), self.max_len)
            for c in chats]
    out = [0.0] * len(rows)
    for idx, tokens, mask in self._batches(rows):
      lp = jax.device_get(self._next(self.params, tokens, mask, labels))
      for r, i in enumerate(idx):
        out[i] = base.binary_prob(_log_sum(lp[r, :len(pos)]),
                                  _log_sum(lp[r, len(pos):]))
    return out

  def _prob_sequence(self, chats, positive, negative):
    cands = self.variants(positive) + self.variants(negative)
    n_pos, width = len(self.variants(positive)), max(map(len, cands))
    rows = []
    for c in chats:
      prompt = truncate_middle(self._prompt_ids(c), self.max_len - width)
      rows += [prompt + cand for cand in cands]
    word_lp = np.zeros(len(rows))
    for idx, tokens, mask in self._batches(rows):
      lp = jax.device_get(self._tokens(self.params, tokens, mask))
      for r, i in enumerate(idx):
        n = len(cands[i % len(cands)])
        word_lp[i] = lp[r, -n:].astype(np.float64).sum()
    return [base.binary_prob(_log_sum(w[:n_pos]), _log_sum(w[n_pos:]))
            for w in word_lp.reshape(len(chats), len(cands))]


class ModelJudge(base.ScorerJudge):
  """The GOOD/BAD prompt on a loaded model: `ModelJudge(params, cfg, tok)`.

  Keyword options go to `ModelScorer` (batch_size, max_len, scoring).
  """

  def __init__(self, params, cfg, tokenizer, *, threshold: float = 0.5,
               **scorer_kw):
    super().__init__(ModelScorer(params, cfg, tokenizer, **scorer_kw),
                     threshold)
