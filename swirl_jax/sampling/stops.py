"""Stop strings, matched exactly across token boundaries inside the decode loop.

Design. The text a row generates is the concatenation of its tokens' bytes.
An Aho-Corasick automaton over the stop strings' UTF-8 bytes reads that
stream; the row stops at the first token during which the automaton reaches
an accepting state, i.e. the token that completes the earliest-ending stop
occurrence. Running every token's bytes through the automaton ahead of time,
from every state, gives one table

    next[state, token] = automaton state after the token's bytes,
                         or -1 if a stop string completes inside them,

so the decode loop advances each row's matcher with a single gather per step
and stops on exactly the completing token: no host round trip, no tokens
sampled past the stop to trim, and the KV cache holds exactly the returned
tokens. A token can carry bytes past the stop string (`</answer>\\n`); the
tokens stay whole and only the returned text is cut.

The token -> bytes table comes from the tokenizer (`token_bytes(i)`, exact
for byte-level and SentencePiece vocabularies alike). Given only a `decode`
callable, a token that is part of a UTF-8 character decodes to U+FFFD; it is
read as the byte 0xFF, which occurs in no UTF-8 text, so matching stays exact
for ASCII stop strings (tags, code fences) and may miss non-ASCII ones that
such tokens spell.
"""

import collections
from typing import Callable, Sequence

import numpy as np

_UNKNOWN_BYTE = b"\xff"


def token_byte_table(source, vocab_size: int) -> list[bytes]:
  """Bytes of every token id in [0, vocab_size).

  Args:
    source: a sequence of bytes (the table itself), an object with a
      `token_bytes(id) -> bytes` method (swirl_jax's Tokenizer), or a
      `decode(ids) -> str` callable.
    vocab_size: the model's vocabulary size; ids the source does not know
      (embedding rows past the tokenizer's vocabulary) get no bytes.
  """
  if isinstance(source, (list, tuple)):
    table = [bytes(b) for b in source[:vocab_size]]
  elif callable(getattr(source, "token_bytes", None)):
    n = min(vocab_size, getattr(source, "vocab_size", vocab_size))
    table = [source.token_bytes(i) for i in range(n)]
  elif callable(source):
    table = [_decoded_bytes(source, i) for i in range(vocab_size)]
  else:
    raise TypeError(f"cannot read token bytes from {type(source).__name__}: "
                    "pass a list of bytes, a tokenizer or a decode callable")
  return table + [b""] * (vocab_size - len(table))


def _decoded_bytes(decode: Callable, i: int) -> bytes:
  try:
    text = decode([i])
  except Exception:  # pylint: disable=broad-except
    return b""  # Ids the tokenizer does not know.
  return b"".join(_UNKNOWN_BYTE if ch == "\ufffd" else ch.encode("utf-8")
                  for ch in text)


def automaton(patterns: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
  """Aho-Corasick DFA: (delta [Q, 256] int32, accepting [Q] bool)."""
  goto, accept = [{}], [False]
  for p in patterns:
    node = 0
    for b in p:
      if b not in goto[node]:
        goto.append({})
        accept.append(False)
        goto[node][b] = len(goto) - 1
      node = goto[node][b]
    accept[node] = True
  delta = np.zeros((len(goto), 256), np.int32)
  fail = [0] * len(goto)
  for b, child in goto[0].items():
    delta[0, b] = child
  queue = collections.deque(goto[0].values())
  while queue:  # Breadth first, so a node's failure target is done.
    node = queue.popleft()
    accept[node] = accept[node] or accept[fail[node]]
    delta[node] = delta[fail[node]]
    for b, child in goto[node].items():
      fail[child] = delta[fail[node], b]
      delta[node, b] = child
      queue.append(child)
  return delta, np.asarray(accept)


def stop_table(token_bytes: Sequence[bytes], stop_strings: Sequence[str]
               ) -> np.ndarray:
  """`next[state, token]` (see the module docstring): [Q, V] int32."""
  patterns = sorted({s.encode("utf-8") for s in stop_strings if s})
  V = len(token_bytes)
  if not patterns:
    return np.zeros((1, V), np.int32)
  delta, accept = automaton(patterns)
  Q = delta.shape[0]
  lengths = np.fromiter((len(b) for b in token_bytes), np.int64, V)
  # Longest tokens first: byte column j is read by a shrinking prefix.
  order = np.argsort(-lengths, kind="stable")
  width = int(lengths.max(initial=0))
  data = np.zeros((V, max(width, 1)), np.uint8)
  for row, i in enumerate(order):
    b = token_bytes[i]
    data[row, :len(b)] = np.frombuffer(b, np.uint8)
  state = np.broadcast_to(np.arange(Q, dtype=np.int32)[:, None], (Q, V)).copy()
  hit = np.zeros((Q, V), bool)
  sorted_len = lengths[order]
  for j in range(width):
    n = int(np.searchsorted(-sorted_len, -j, side="left"))  # len > j.
    nxt = delta[state[:, :n], data[:n, j][None, :]]
    hit[:, :n] |= accept[nxt]
    state[:, :n] = nxt
  out = np.empty((Q, V), np.int32)
  out[:, order] = np.where(hit, -1, state)
  return out


def first_stop(token_ids: Sequence[int], token_bytes: Sequence[bytes],
               stop_strings: Sequence[str]) -> int | None:
  """Index of the token completing the first stop string (host reference)."""
  text = b""
  pats = [s.encode("utf-8") for s in stop_strings if s]
  for n, t in enumerate(token_ids):
    start = max(0, len(text) - max((len(p) for p in pats), default=0))
    text += token_bytes[t]
    if any(p in text[start:] for p in pats):
      return n
  return None


def cut_at_stop(text: str, stop_strings: Sequence[str], keep: bool = True
                ) -> tuple[str, str | None]:
  """`text` up to its earliest-ending stop string: (cut text, that string)."""
  best = None  # (end, -length, string): earliest end, then longest.
  for s in stop_strings:
    i = text.find(s) if s else -1
    if i >= 0:
      cand = (i + len(s), -len(s), s)
      best = cand if best is None or cand < best else best
  if best is None:
    return text, None
  end, neg_len, s = best
  return text[:end] if keep else text[:end + neg_len], s
