"""A GGUF file's `tokenizer.*` metadata -> a `tokenizers.Tokenizer`.

Reads the `gguf.GGUFReader` the model loader opened (`gguf_io.open_gguf`),
so one load parses the file once. Unlike transformers' GGUF path this needs
no torch, and it knows the split regexes of llama.cpp's `tokenizer.ggml.pre`
names. Two vocabulary kinds: byte-level BPE (`gpt2`) and SentencePiece BPE
with byte fallback (`llama`).
"""

import logging
from typing import Any, Mapping

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers
from tokenizers import pre_tokenizers
from transformers.convert_slow_tokenizer import bytes_to_unicode


class TokenizerError(ValueError):
  """A tokenizer file is unreadable, incomplete or of an unsupported kind."""


# `tokenizer.ggml.pre` -> split regex, following llama.cpp's llama-vocab.cpp
# and the matching Hugging Face tokenizer.json files.
_GPT2_SPLIT = None  # ByteLevel's built-in GPT-2 regex.
_DIGITS_THEN_GPT2 = "digits"  # StarCoder family: every digit alone, then GPT-2.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_SPLITS = {
    **dict.fromkeys(("default", "gpt2", "gpt-2", "mpt", "olmo", "jais"),
                    _GPT2_SPLIT),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r",
                     "codeshell", "exaone", "minerva"), _DIGITS_THEN_GPT2),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx",
                     "smaug-bpe", "pixtral"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), QWEN2_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4"), _GPT4O_SPLIT),
}
# Tiktoken-derived vocabularies look whole pre-tokens up before merging.
_IGNORE_MERGES = {_LLAMA3_SPLIT, _GPT4O_SPLIT}
# Their Hugging Face tokenizers NFC-normalise the text first.
_NFC_SPLITS = {QWEN2_SPLIT}

# llama.cpp token types (`tokenizer.ggml.token_type`).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def read_metadata(reader, path: str) -> dict[str, Any]:
  """The `tokenizer.*` fields and the architecture name of an open reader."""
  try:
    return {k: f.contents() for k, f in reader.fields.items()
            if k.startswith("tokenizer.") or k == "general.architecture"}
  except UnicodeDecodeError as e:
    raise TokenizerError(f"{path}: GGUF tokenizer metadata is not UTF-8 "
                         f"({e})") from None


def _token_types(meta: Mapping[str, Any]) -> list[int]:
  n = len(meta["tokenizer.ggml.tokens"])
  return list(meta.get("tokenizer.ggml.token_type") or [_NORMAL] * n)


def _merges(meta: Mapping[str, Any]) -> list[tuple[str, str]]:
  return [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]


def _bytelevel_backend(meta: Mapping[str, Any], path: str):
  tokens, types = meta["tokenizer.ggml.tokens"], _token_types(meta)
  if "tokenizer.ggml.merges" not in meta:
    raise TokenizerError(f"{path}: GGUF field 'tokenizer.ggml.merges' is "
                         "missing (needed by a 'gpt2' BPE tokenizer)")
  spell = bytes_to_unicode()
  alphabet = set(spell.values())
  vocab = {}
  for i, (tok, kind) in enumerate(zip(tokens, types)):
    # Ordinary tokens are stored byte-spelled; a few converters wrote raw
    # text instead, which BPE could never reach, so respell those.
    if kind == _NORMAL and not set(tok) <= alphabet:
      tok = "".join(spell[b] for b in tok.encode("utf-8"))
    vocab.setdefault(tok, i)

  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre not in _PRE_SPLITS:
    logging.warning("%s: GGUF field 'tokenizer.ggml.pre' is %r, not known "
                    "here; splitting text with the GPT-2 regex", path, pre)
  split = _PRE_SPLITS.get(pre, _GPT2_SPLIT)
  backend = tokenizers.Tokenizer(models.BPE(
      vocab=vocab, merges=_merges(meta), dropout=None, unk_token=None,
      continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
      byte_fallback=False, ignore_merges=split in _IGNORE_MERGES))
  bytelevel = pre_tokenizers.ByteLevel(
      add_prefix_space=False,
      use_regex=split in (_GPT2_SPLIT, _DIGITS_THEN_GPT2))
  if split == _DIGITS_THEN_GPT2:
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), bytelevel])
  elif split is _GPT2_SPLIT:
    backend.pre_tokenizer = bytelevel
  else:
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated"), bytelevel])
  if split in _NFC_SPLITS:
    backend.normalizer = normalizers.NFC()
  backend.decoder = decoders.ByteLevel()
  return backend


def _spm_merges(tokens, scores, skip) -> list[tuple[str, str]]:
  """BPE merges implied by a SentencePiece vocabulary and its scores.

  A token splits into two vocabulary pieces in possibly several ways; every
  such pair is a merge ranked by the merged token's score, as Hugging Face's
  SentencePiece converter ranks them.
  """
  ids = {t: i for i, t in enumerate(tokens) if i not in skip}
  found = []
  for tok, i in ids.items():
    pairs = [(tok[:k], tok[k:]) for k in range(1, len(tok))
             if tok[:k] in ids and tok[k:] in ids]
    pairs.sort(key=lambda lr: (ids[lr[0]], ids[lr[1]]))
    found.extend((scores[i], l, r) for l, r in pairs)
  found.sort(key=lambda s: (s[0], len(s[1]), len(s[2])), reverse=True)
  return [(l, r) for _, l, r in found]


def _spm_decoder(strip_prefix: bool):
  steps = [decoders.Replace("▁", " "), decoders.ByteFallback(),
           decoders.Fuse()]
  if strip_prefix:
    steps.append(decoders.Strip(content=" ", left=1, right=0))
  return decoders.Sequence(steps)


def _sentencepiece_backend(meta: Mapping[str, Any], path: str):
  """SentencePiece BPE (`tokenizer.ggml.model` = 'llama') with byte fallback."""
  tokens, types = list(meta["tokenizer.ggml.tokens"]), _token_types(meta)
  arch = meta.get("general.architecture", "")
  scores = meta.get("tokenizer.ggml.scores")
  if arch.startswith("gemma"):
    # Gemma files store runs of spaces as real spaces, and their scores do
    # not follow merge order; position in the file does.
    tokens = ["▁" * len(t) if t and not t.strip(" ") else t for t in tokens]
    scores = [-float(i) for i in range(len(tokens))]
  if "tokenizer.ggml.merges" in meta:
    merges = _merges(meta)
  elif scores is not None:
    # Control/unknown pieces like `<s>` must not be assembled by merges.
    skip = {i for i, k in enumerate(types) if k in (_CONTROL, _UNKNOWN)}
    merges = _spm_merges(tokens, scores, skip)
  else:
    raise TokenizerError(f"{path}: a 'llama' tokenizer needs GGUF field "
                         "'tokenizer.ggml.merges' or 'tokenizer.ggml.scores'")
  vocab = {}
  for i, tok in enumerate(tokens):
    vocab.setdefault(tok, i)
  unk = meta.get("tokenizer.ggml.unknown_token_id")
  # Gemma never prepends a space; older llama files predate the flag.
  prefix = bool(meta.get("tokenizer.ggml.add_space_prefix",
                         not arch.startswith("gemma")))

  backend = tokenizers.Tokenizer(models.BPE(
      vocab=vocab, merges=merges, dropout=None,
      unk_token=tokens[unk] if unk is not None else None,
      fuse_unk=True, byte_fallback=True))
  if arch == "phi3":
    # Phi-3 prepends its space with a normalizer, so runs of leading
    # spaces tokenize differently from Metaspace's prepend.
    steps = [normalizers.Replace(" ", "▁")]
    if prefix:
      steps.insert(0, normalizers.Prepend("▁"))
    backend.normalizer = normalizers.Sequence(steps)
  else:
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if prefix else "never",
        split=False)
  backend.decoder = _spm_decoder(strip_prefix=prefix)
  return backend


_BUILDERS = {"gpt2": _bytelevel_backend, "llama": _sentencepiece_backend}


def _add_specials(backend, tokens, types) -> None:
  """Registers control (special) and user-defined tokens, keeping their ids.

  Added tokens are matched whole before BPE runs; without this
  `<|im_start|>` would be cut into pieces.
  """
  special = [AddedToken(t, special=True, normalized=False)
             for t, k in zip(tokens, types) if k == _CONTROL and t]
  plain = [AddedToken(t, special=False, normalized=False)
           for t, k in zip(tokens, types) if k == _USER_DEFINED and t]
  if special:
    backend.add_special_tokens(special)
  if plain:
    backend.add_tokens(plain)


def _check(meta: Mapping[str, Any], path: str) -> None:
  if "tokenizer.ggml.model" not in meta:
    raise TokenizerError(f"{path}: GGUF has no tokenizer metadata (field "
                         "'tokenizer.ggml.model' is missing)")
  kind = meta["tokenizer.ggml.model"]
  if kind not in _BUILDERS:
    raise TokenizerError(
        f"{path}: GGUF field 'tokenizer.ggml.model' is {kind!r}; "
        f"supported: {sorted(_BUILDERS)}")
  if "tokenizer.ggml.tokens" not in meta:
    raise TokenizerError(f"{path}: GGUF field 'tokenizer.ggml.tokens' is "
                         "missing")
  n, n_types = len(meta["tokenizer.ggml.tokens"]), len(_token_types(meta))
  if n_types != n:
    raise TokenizerError(f"{path}: GGUF field 'tokenizer.ggml.token_type' "
                         f"has {n_types} entries for {n} tokens")


def convert(reader, path: str) -> tuple[tokenizers.Tokenizer, dict[str, Any]]:
  """(backend, special ids and settings) from an open `gguf.GGUFReader`.

  The dict holds `bos_id`, `eos_ids` (those the metadata names: EOS, EOT,
  EOM), `pad_id`, `unk_id`, `chat_template` and `add_bos`.
  """
  meta = read_metadata(reader, path)
  _check(meta, path)
  kind, tokens = meta["tokenizer.ggml.model"], meta["tokenizer.ggml.tokens"]
  backend = _BUILDERS[kind](meta, path)
  _add_specials(backend, tokens, _token_types(meta))

  def token_id(field):
    i = meta.get(f"tokenizer.ggml.{field}")
    if i is not None and not 0 <= i < len(tokens):
      raise TokenizerError(f"{path}: GGUF field 'tokenizer.ggml.{field}' "
                           f"is {i}, outside the {len(tokens)}-token vocab")
    return None if i is None else int(i)

  eos = [token_id(f) for f in ("eos_token_id", "eot_token_id",
                               "eom_token_id")]
  return backend, dict(
      bos_id=token_id("bos_token_id"), eos_ids=[i for i in eos if i is not None],
      pad_id=token_id("padding_token_id"), unk_id=token_id("unknown_token_id"),
      chat_template=meta.get("tokenizer.chat_template"),
      add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama")))
