"""Reading P(positive word) off a chat-completion reply (OpenAI format).

P comes from the first reply token's top log-probs when the server returns
them, else from the reply text (positive -> 1, negative -> 0); None when
neither says (an error body, prose, an empty reply).
"""

import math
import re


def _word_match(token: str, word: str) -> bool:
  """A reply token that starts (or is) `word`: 'GO' and 'Good' for GOOD."""
  t = token.strip().strip("*\"'`").upper()
  return bool(t) and (word.startswith(t) or t.startswith(word))


def prob_from_logprobs(choice: dict, pos: str, neg: str) -> float | None:
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


def prob_from_text(text: str, pos: str, neg: str) -> float | None:
  words = re.findall(r"[A-Za-z]+", text.upper())
  has_pos, has_neg = pos in words, neg in words
  if words and words[0] in (pos, neg):
    return 1.0 if words[0] == pos else 0.0
  if has_pos != has_neg:
    return 1.0 if has_pos else 0.0
  return None


def read_reply(reply, pos: str, neg: str) -> dict:
  """{'text', 'lp'} of a decoded reply body (any JSON value, or None)."""
  choices = reply.get("choices") if isinstance(reply, dict) else None
  choice = choices[0] if isinstance(choices, list) and choices and \
      isinstance(choices[0], dict) else {}
  message = choice.get("message") if isinstance(choice.get("message"),
                                                dict) else {}
  text = message.get("content") or ""
  try:
    lp = prob_from_logprobs(choice, pos, neg)
  except (AttributeError, KeyError, TypeError, ValueError):
    lp = None  # A malformed logprobs block: fall back to the text.
  return dict(text=text if isinstance(text, str) else "", lp=lp)


def reply_prob(hit: dict, pos: str, neg: str) -> float | None:
  """P(pos) of a read reply: its log-probs, else its text, else None."""
  if hit.get("lp") is not None:
    return float(hit["lp"])
  return prob_from_text(hit.get("text") or "", pos, neg)
