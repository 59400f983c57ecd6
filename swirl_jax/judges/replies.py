"""Reading P(positive word) off a chat-completion reply (OpenAI format).

P comes from the first reply token's top log-probs when the server returns
them (as the model judge reads it off the first token's distribution), else
from the reply text as a judge means it: the word as the first word or in
the closing sentence ("Verdict: BAD"), a negated positive ("not good",
"isn't GOOD", "No, bad") read as negative; None when the text gives no
verdict (an error body, prose, "not bad", both words, an empty reply).
"""

import math
import re


def _prefix(token: str, word: str) -> str | None:
  """The variant ('W' or ' W') whose start `token` spells (a non-empty
  prefix of `word` in its case, after at most one leading space), else
  None: 'GO' and ' GOOD' for GOOD, 'B' and ' B' for BAD."""
  space, t = (" ", token[1:]) if token[:1] == " " else ("", token)
  return space if t and word.startswith(t) else None


def _mass(top: list[dict], word: str) -> float:
  """P of the tokens a reply of `word` begins with, as the model judge
  counts them: per variant ('W', ' W') the longest listed prefix token (a
  tokenizer starts the word with its longest piece: 'GO' for GOOD; a
  listed 'G' then begins other words)."""
  best = {}  # variant -> (length, probability)
  for alt in top:
    v = _prefix(alt["token"], word)
    if v is not None and len(alt["token"]) > best.get(v, (0, 0.0))[0]:
      best[v] = (len(alt["token"]), math.exp(alt["logprob"]))
  return sum(p for _, p in best.values())


def _first_token_prob(entry: dict, pos: str, neg: str) -> float | None:
  top = [a for a in entry.get("top_logprobs") or [entry]
         if not (_prefix(a["token"], pos) is not None and
                 _prefix(a["token"], neg) is not None)]
  p_pos, p_neg = _mass(top, pos), _mass(top, neg)
  if (p_pos > 0) != (p_neg > 0) and len(top) > 1:
    # The other word is past the listed alternatives: its P is at most the
    # least listed one's, so P(pos) is taken at that bound (the least sure
    # value the list allows), not at 0 or 1.
    floor = min(math.exp(a["logprob"]) for a in top)
    p_pos, p_neg = max(p_pos, floor), max(p_neg, floor)
  return p_pos / (p_pos + p_neg) if p_pos + p_neg > 0 else None


def prob_from_logprobs(choice: dict, pos: str, neg: str) -> float | None:
  """P(pos) = P(pos tokens) / P(pos or neg tokens) among the top log-probs
  of the reply's first token, as the model judge reads its next-token
  distribution; past leading blanks whose alternatives name neither word.
  None when the first other token's alternatives name neither. The fewer
  alternatives a server lists (`top_logprobs`), the more often a word's
  first token is past them for a judge that rarely says it."""
  content = (choice.get("logprobs") or {}).get("content") or []
  for entry in content:
    p = _first_token_prob(entry, pos, neg)
    if p is not None or entry.get("token", "").strip():
      return p
  return None


# Words that turn "good" into a refusal of it ("not good", "isn't good").
_NEGATORS = frozenset({"not", "no", "never", "hardly", "neither", "nor",
                       "isnt", "wasnt", "arent", "dont", "doesnt", "cannot",
                       "cant", "wouldnt", "nothing", "none"})
# A verdict's label before its word: "Verdict: GOOD", "Final answer - BAD".
_LABEL = re.compile(r"^(?:(?:final|my|the)\s+)?(?:verdict|answer|judge?ment|"
                    r"rating|decision|label|assessment|conclusion)\s*[:\-]\s*",
                    re.I)
_MARKUP = re.compile(r"[*_`#>\"']+")
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")
_CLAUSE_END = re.compile(r"[,;:()]")


def _words(text: str) -> list[str]:
  return [w.replace("'", "").replace("\u2019", "") for w in
          re.findall(r"[a-z]+(?:['\u2019][a-z]+)?", text.lower())]


def _negated(clause: str, k: int) -> bool:
  """Whether one of the 3 words before word `k` of `clause` negates it."""
  return any(w in _NEGATORS for w in _words(clause)[max(0, k - 3):k])


def _verdict(clause: str, k: int, pos: str, neg: str) -> float | None:
  """1 / 0 for the verdict word `k` of `clause`; negated: 0 for `pos`
  ("not good"), None for `neg` ("not bad" says no verdict)."""
  word = _words(clause)[k]
  if _negated(clause, k):
    return 0.0 if word == pos else None
  return 1.0 if word == pos else 0.0


def _clean(sentence: str) -> str:
  return _LABEL.sub("", _MARKUP.sub("", sentence).strip()).strip()


def _first_word_verdict(sentence: str, pos: str, neg: str) -> float | None:
  """GOOD / BAD as the reply's first word, or negated there ("Not good",
  "No, bad", "Yes, good"); None when the sentence names both words."""
  text = _clean(sentence)
  words = _words(text)
  if pos in words and neg in words:
    return None  # "GOOD or BAD? ..." echoes the question.
  clause = _CLAUSE_END.split(text, maxsplit=1)
  first = _words(clause[0])
  if first and first[0] in (pos, neg):
    return 1.0 if first[0] == pos else 0.0
  if len(first) in (2, 3) and first[-1] in (pos, neg) and \
      all(w in _NEGATORS for w in first[:-1]):  # "Not good", "isn't good".
    return _verdict(clause[0], len(first) - 1, pos, neg)
  if first in (["yes"], ["no"]) and len(clause) > 1:  # "No, bad."
    rest = _words(clause[1])
    want = pos if first == ["yes"] else neg
    if rest and rest[0] == want and pos != "yes" and neg != "no":
      return 1.0 if want == pos else 0.0
  return None


def _last_sentence_verdict(sentence: str, pos: str, neg: str
                           ) -> float | None:
  """The verdict of a closing sentence that ends in its word ("Verdict:
  BAD", "So the step is GOOD.", "This step is not good.")."""
  text = _clean(sentence)
  words = _words(text)
  if not words or words[-1] not in (pos, neg) or \
      (pos in words[:-1] or neg in words[:-1]):
    return None
  clause = _CLAUSE_END.split(text)[-1]
  return _verdict(clause, len(_words(clause)) - 1, pos, neg)


def prob_from_text(text: str, pos: str, neg: str) -> float | None:
  """1.0 / 0.0 for a reply whose text gives the verdict `pos` / `neg`, as
  its first word or in its closing sentence; a negated `pos` ("not good",
  "isn't GOOD") reads as `neg`. None for anything else (no verdict, "not
  bad", both words, or a first word and a closing sentence that disagree).
  """
  pos, neg = pos.lower(), neg.lower()
  sentences = [s for s in _SENTENCES.split(text.strip()) if _words(s)]
  if not sentences:
    return None
  first = _first_word_verdict(sentences[0], pos, neg)
  last = _last_sentence_verdict(sentences[-1], pos, neg)
  if first is not None and last is not None and first != last:
    return None
  return first if first is not None else last


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
