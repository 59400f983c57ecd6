"""Rewrites of a `tokenizers.Tokenizer` pipeline that the Tokenizer needs.

Each reads or edits the pipeline's own JSON (normaliser, pre-tokeniser,
decoder), so it works on any vocabulary, whatever file it came from.
"""

import json
from typing import Iterable, Sequence

import tokenizers
from tokenizers import AddedToken, models, pre_tokenizers, trainers


def retrained(base: tokenizers.Tokenizer, texts: Iterable[str],
              vocab_size: int, split_digits: bool,
              phrases: Sequence[str] = ()) -> tokenizers.Tokenizer:
  """A byte-level BPE learnt from `texts` with `base`'s pipeline.

  `base`'s added tokens come first, in id order, all special; then each
  of `phrases` as one plain (non-special) token, matched verbatim before
  pre-tokenisation and decoded as its text.
  """
  added = sorted(base.get_added_tokens_decoder().items())
  specials = [AddedToken(t.content, special=True, normalized=False)
              for _, t in added]
  backend = tokenizers.Tokenizer(models.BPE())
  if base.normalizer is not None:
    backend.normalizer = base.normalizer
  backend.pre_tokenizer = (base.pre_tokenizer if split_digits else
                           without_digit_split(base.pre_tokenizer))
  backend.decoder = base.decoder
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=specials, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  backend.train_from_iterator(texts, trainer)
  if phrases:
    backend.add_tokens([AddedToken(p, special=False, normalized=False)
                        for p in phrases])
  return backend


def without_digit_split(pre):
  """`pre` with any `Digits` step removed (a Sequence or a single step)."""
  steps = json.loads(pre.__getstate__())
  if steps.get("type") == "Digits":
    return None
  if steps.get("type") == "Sequence":
    steps["pretokenizers"] = [p for p in steps["pretokenizers"]
                              if p.get("type") != "Digits"]
    if len(steps["pretokenizers"]) == 1:
      steps = steps["pretokenizers"][0]
  backend = tokenizers.Tokenizer(models.BPE())
  state = json.loads(backend.to_str())
  state["pre_tokenizer"] = steps
  return tokenizers.Tokenizer.from_str(json.dumps(state)).pre_tokenizer


def has_bytelevel(backend: tokenizers.Tokenizer) -> bool:
  """Whether the tokenizer spells bytes as GPT-2's printable characters."""
  if backend.decoder is None:
    return False
  # The decoder's own JSON; serialising the whole tokenizer is slow.
  stack = [json.loads(backend.decoder.__getstate__())]
  while stack:
    node = stack.pop()
    if node.get("type") == "ByteLevel":
      return True
    stack.extend(node.get("decoders") or [])
  return False


def without_prefix_space(backend: tokenizers.Tokenizer):
  """`backend` minus the space it prepends to a text, or itself if none.

  SentencePiece-style tokenizers mark the start of a text with a space
  (Metaspace's prepend, a `Prepend("▁")` normaliser, ByteLevel's
  add_prefix_space); a segment in mid-text must not get one.
  """
  def strip(node):
    if isinstance(node, list):
      return [strip(n) for n in node
              if not (isinstance(n, dict) and n.get("type") == "Prepend")]
    if not isinstance(node, dict):
      return node
    node = {k: strip(v) for k, v in node.items()}
    if node.get("type") == "Metaspace":
      node["prepend_scheme"] = "never"
      node.pop("add_prefix_space", None)  # Pre-0.15 spelling.
    elif node.get("type") == "ByteLevel":
      node["add_prefix_space"] = False
    return node

  parts = {}
  for name in ("normalizer", "pre_tokenizer"):
    part = getattr(backend, name)
    if part is not None:
      old = json.loads(part.__getstate__())
      parts[name] = (old, None if old.get("type") == "Prepend" else strip(old))
  if all(old == new for old, new in parts.values()):
    return backend
  full = json.loads(backend.to_str())
  for name, (_, new) in parts.items():
    full[name] = new
  return tokenizers.Tokenizer.from_str(json.dumps(full))
