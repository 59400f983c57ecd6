"""Text <-> token ids, from a Hugging Face tokenizer directory or a GGUF file.

Encoding and decoding run in the Rust `tokenizers` library; chat templates
render in a sandboxed jinja2 environment set up the way `transformers` sets
up its own, so prompts match what the model saw in training.

Segments and masks. Training masks are built by concatenating the ids of
separately encoded segments (a model turn, then a tool observation wrapped as
a user turn, ...). Encoding segments one by one never merges tokens across a
boundary, so the concatenation decodes to the concatenated text (exactly,
for byte-level BPE). It equals `encode(whole_text)` whenever each boundary
touches a special token, which chat templates guarantee
(`...<|im_end|>\\n` | `<|im_start|>user...`), because special tokens are
matched before BPE and split the text anyway. Use `encode` for the first
segment and `encode_continuation` for the rest: for SentencePiece
vocabularies it omits the prefix space that marks the start of a text. Text
the model did not write (tool output, user input) can be encoded with
`allow_special=False`, so a `<|im_end|>` inside it stays
plain text and cannot forge a turn boundary.
"""

import datetime
import functools
import json
import logging
import mmap
import os
import pathlib
import re
import struct
from typing import Any, Iterable, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors


class TokenizerError(ValueError):
  """A tokenizer file is unreadable, incomplete or of an unsupported kind."""


# Special tokens that end a turn in common chat formats. Like llama.cpp, a
# control token with one of these names stops generation even when the
# metadata names another EOS (SmolLM2 and Qwen2 instruct end turns with
# `<|im_end|>` but pretraining documents with `<|endoftext|>`).
END_OF_GENERATION_TOKENS = frozenset({
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>",
    "<|end_of_text|>", "<end_of_turn>", "<|end|>", "<EOT>",
    "<|return|>", "<｜end▁of▁sentence｜>",
})

# --- GGUF ---------------------------------------------------------------------

# `tokenizer.ggml.pre` -> split regex, following llama.cpp's llama-vocab.cpp
# and the matching Hugging Face tokenizer.json files.
_GPT2_SPLIT = None  # ByteLevel's built-in GPT-2 regex.
_DIGITS_THEN_GPT2 = "digits"  # StarCoder family: every digit alone, then GPT-2.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (
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
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4"), _GPT4O_SPLIT),
}
# Tiktoken-derived vocabularies look whole pre-tokens up before merging.
_IGNORE_MERGES = {_LLAMA3_SPLIT, _GPT4O_SPLIT}
# Their Hugging Face tokenizers NFC-normalise the text first.
_NFC_SPLITS = {_QWEN2_SPLIT}

# llama.cpp token types (`tokenizer.ggml.token_type`).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

_GGUF_MAGIC = b"GGUF"
# GGUFValueType -> struct format for scalars (strings and arrays aside).
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f",
                 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _read_gguf_metadata(path: str) -> dict[str, Any]:
  """Key/value metadata of a GGUF file, tensors left unread.

  `gguf.GGUFReader` builds a numpy view per array element, which takes
  seconds for a 150k-entry vocabulary; this parser reads the same layout
  (GGUF v2/v3, either byte order) in a fraction of that.
  """
  with open(path, "rb") as f:
    if f.read(4) != _GGUF_MAGIC:
      raise TokenizerError(f"{path}: not a GGUF file (no 'GGUF' magic)")
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
      return _parse_gguf_kv(buf, path)


def _parse_gguf_kv(buf, path: str) -> dict[str, Any]:
  (version,) = struct.unpack_from("<I", buf, 4)
  order = "<"
  if version & 0xFFFF == 0:  # Written on a machine of the other byte order.
    order, (version,) = ">", struct.unpack_from(">I", buf, 4)
  if version not in (2, 3):
    raise TokenizerError(f"{path}: GGUF version {version} is not supported")
  _, n_kv = struct.unpack_from(order + "QQ", buf, 8)
  pos = 24
  u32, u64 = struct.Struct(order + "I"), struct.Struct(order + "Q")

  def string(p):
    (n,) = u64.unpack_from(buf, p)
    return bytes(buf[p + 8:p + 8 + n]).decode("utf-8", "replace"), p + 8 + n

  def value(vtype, p):
    if vtype == _GGUF_STRING:
      return string(p)
    if vtype == _GGUF_ARRAY:
      (etype,) = u32.unpack_from(buf, p)
      (n,) = u64.unpack_from(buf, p + 4)
      p += 12
      if etype in _GGUF_SCALARS:
        fmt = struct.Struct(f"{order}{n}{_GGUF_SCALARS[etype]}")
        return list(fmt.unpack_from(buf, p)), p + fmt.size
      out = []
      for _ in range(n):
        v, p = value(etype, p)
        out.append(v)
      return out, p
    if vtype not in _GGUF_SCALARS:
      raise TokenizerError(f"{path}: unknown GGUF value type {vtype}")
    fmt = struct.Struct(order + _GGUF_SCALARS[vtype])
    return fmt.unpack_from(buf, p)[0], p + fmt.size

  meta = {}
  try:
    for _ in range(n_kv):
      key, pos = string(pos)
      (vtype,) = u32.unpack_from(buf, pos)
      meta[key], pos = value(vtype, pos + 4)
  except struct.error as e:
    raise TokenizerError(f"{path}: truncated GGUF metadata ({e})") from e
  return meta


def _reader_metadata(reader) -> dict[str, Any]:
  """Metadata of an already open `gguf.GGUFReader`, tensors skipped."""
  return {k: f.contents() for k, f in reader.fields.items()
          if not k.startswith("GGUF.")}


@functools.lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's byte -> printable character map used by ByteLevel BPE."""
  keep = (list(range(ord("!"), ord("~") + 1))
          + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
  table, extra = {}, 0
  for b in range(256):
    if b in keep:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + extra)
      extra += 1
  return table


@functools.lru_cache(maxsize=1)
def _unicode_to_bytes() -> dict[str, int]:
  return {c: b for b, c in _bytes_to_unicode().items()}


def _bytelevel_backend(meta: Mapping[str, Any], path: str):
  tokens, types = meta["tokenizer.ggml.tokens"], _token_types(meta)
  if "tokenizer.ggml.merges" not in meta:
    raise TokenizerError(f"{path}: GGUF field 'tokenizer.ggml.merges' is "
                         "missing (needed by a 'gpt2' BPE tokenizer)")
  alphabet = set(_bytes_to_unicode().values())
  spell = _bytes_to_unicode()
  vocab = {}
  for i, (tok, kind) in enumerate(zip(tokens, types)):
    # Ordinary tokens are stored byte-spelled; a few converters wrote raw
    # text instead, which BPE could never reach, so respell those.
    if kind == _NORMAL and not set(tok) <= alphabet:
      tok = "".join(spell[b] for b in tok.encode("utf-8"))
    vocab.setdefault(tok, i)
  merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]

  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre not in _PRE_SPLITS:
    logging.warning("%s: GGUF field 'tokenizer.ggml.pre' is %r, not known "
                    "here; splitting text with the GPT-2 regex", path, pre)
  split = _PRE_SPLITS.get(pre, _GPT2_SPLIT)
  backend = tokenizers.Tokenizer(models.BPE(
      vocab=vocab, merges=merges, dropout=None, unk_token=None,
      continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
      byte_fallback=False, ignore_merges=split in _IGNORE_MERGES))
  bytelevel = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                       use_regex=split in (_GPT2_SPLIT,
                                                           _DIGITS_THEN_GPT2))
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
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
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


_GGUF_BUILDERS = {"gpt2": _bytelevel_backend, "llama": _sentencepiece_backend}


def _token_types(meta: Mapping[str, Any]) -> list[int]:
  n = len(meta["tokenizer.ggml.tokens"])
  return list(meta.get("tokenizer.ggml.token_type") or [_NORMAL] * n)


def _add_gguf_specials(backend, tokens, types) -> None:
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


# --- Hugging Face directories -------------------------------------------------


def _read_json(path: pathlib.Path, required: bool) -> dict:
  if not path.is_file():
    if required:
      raise FileNotFoundError(f"{path}: tokenizer file not found")
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise TokenizerError(f"{path}: unreadable JSON ({e})") from e


def _token_content(value) -> str | None:
  """A special token as configs spell it: a string or an AddedToken dict."""
  if isinstance(value, dict):
    return value.get("content")
  return value


# --- Chat templates -----------------------------------------------------------


class _GenerationTag(jinja2.ext.Extension):
  """`{% generation %}...{% endgeneration %}` renders its body unchanged.

  Transformers uses the tag to find assistant spans; templates that carry it
  must still parse here.
  """
  tags = {"generation"}

  def parse(self, parser):
    next(parser.stream)
    return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message):
  raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None,
            sort_keys=False):
  # Jinja's own filter HTML-escapes, which templates do not expect.
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                    separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
  return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile_template(source: str) -> jinja2.Template:
  # Chat templates ship with model files, so they render sandboxed.
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True,
      extensions=[_GenerationTag, jinja2.ext.loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise_exception
  env.globals["strftime_now"] = _strftime_now
  return env.from_string(source)


def _tool_schemas(tools):
  if tools is None:
    return None
  out = []
  for tool in tools:
    if isinstance(tool, Mapping):
      out.append(dict(tool))
    elif callable(tool):
      # Schema from type hints and docstring, as transformers builds it.
      # pylint: disable-next=g-import-not-at-top
      from transformers.utils import get_json_schema
      out.append(get_json_schema(tool))
    else:
      raise TypeError(f"a tool must be a JSON-schema dict or a function, "
                      f"got {tool!r}")
  return out


# --- Tokenizer ----------------------------------------------------------------


class Tokenizer:
  """Encodes, decodes and renders chats for one model's vocabulary.

  Build with `from_gguf` or `from_hf_dir`. Ids never include BOS unless
  asked (`add_bos=True`); chat templates write their own special tokens.
  """

  def __init__(self, backend: tokenizers.Tokenizer, *,
               bos_id: int | None, eos_ids: Sequence[int],
               pad_id: int | None = None, unk_id: int | None = None,
               chat_template: str | None = None, add_bos: bool = False,
               source: str = ""):
    if not eos_ids:
      raise TokenizerError(f"{source or 'tokenizer'}: no EOS token")
    self._backend = backend
    self._continuation = None  # Built by the first encode_continuation.
    self._bos_id = bos_id
    self._eos_ids = tuple(dict.fromkeys(int(i) for i in eos_ids))
    self._pad_id = self._eos_ids[0] if pad_id is None else int(pad_id)
    self._unk_id = unk_id
    self._chat_template = chat_template
    self._add_bos = bool(add_bos) and bos_id is not None
    self._source = source
    self._plain = {}  # Backend -> copy that reads special tokens as text.
    added = backend.get_added_tokens_decoder()
    self._added_ids = frozenset(added)
    self._special_ids = frozenset(i for i, t in added.items() if t.special)
    self._bytelevel = _has_bytelevel(backend)

  # -- construction --

  @classmethod
  def from_gguf(cls, path_or_reader) -> "Tokenizer":
    """From a GGUF file's `tokenizer.*` metadata.

    Args:
      path_or_reader: the .gguf path, or an open `gguf.GGUFReader` (so a
        model loader that already parsed the file can share it).
    """
    if isinstance(path_or_reader, (str, os.PathLike)):
      path = os.fspath(path_or_reader)
      if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: GGUF file not found")
      meta = _read_gguf_metadata(path)
    else:
      path = str(getattr(path_or_reader.data, "filename", "<GGUFReader>"))
      meta = _reader_metadata(path_or_reader)
    return cls._from_gguf_metadata(meta, path)

  @classmethod
  def _from_gguf_metadata(cls, meta: Mapping[str, Any],
                          path: str) -> "Tokenizer":
    if "tokenizer.ggml.model" not in meta:
      raise TokenizerError(f"{path}: GGUF has no tokenizer metadata (field "
                           "'tokenizer.ggml.model' is missing)")
    kind = meta["tokenizer.ggml.model"]
    if kind not in _GGUF_BUILDERS:
      raise TokenizerError(
          f"{path}: GGUF field 'tokenizer.ggml.model' is {kind!r}; "
          f"supported: {sorted(_GGUF_BUILDERS)}")
    if "tokenizer.ggml.tokens" not in meta:
      raise TokenizerError(f"{path}: GGUF field 'tokenizer.ggml.tokens' is "
                           "missing")
    tokens, types = meta["tokenizer.ggml.tokens"], _token_types(meta)
    if len(types) != len(tokens):
      raise TokenizerError(f"{path}: GGUF field 'tokenizer.ggml.token_type' "
                           f"has {len(types)} entries for {len(tokens)} tokens")
    backend = _GGUF_BUILDERS[kind](meta, path)
    _add_gguf_specials(backend, tokens, types)

    def token_id(field):
      i = meta.get(f"tokenizer.ggml.{field}")
      if i is not None and not 0 <= i < len(tokens):
        raise TokenizerError(f"{path}: GGUF field 'tokenizer.ggml.{field}' "
                             f"is {i}, outside the {len(tokens)}-token vocab")
      return i

    eos = [token_id(f) for f in ("eos_token_id", "eot_token_id",
                                 "eom_token_id")]
    eos += [i for i, (t, k) in enumerate(zip(tokens, types))
            if k == _CONTROL and t in END_OF_GENERATION_TOKENS]
    eos = [i for i in eos if i is not None]
    if not eos:
      raise TokenizerError(f"{path}: GGUF field 'tokenizer.ggml.eos_token_id'"
                           " is missing and no end-of-turn token is marked")
    bos = token_id("bos_token_id")
    add_bos = meta.get("tokenizer.ggml.add_bos_token", kind == "llama")
    return cls(backend, bos_id=bos, eos_ids=eos,
               pad_id=token_id("padding_token_id"),
               unk_id=token_id("unknown_token_id"),
               chat_template=meta.get("tokenizer.chat_template"),
               add_bos=add_bos, source=path)

  @classmethod
  def from_hf_dir(cls, path) -> "Tokenizer":
    """From a local Hugging Face tokenizer directory.

    Reads `tokenizer.json` (required), `tokenizer_config.json`,
    `special_tokens_map.json`, `chat_template.jinja` and
    `generation_config.json` (whose `eos_token_id`s also end generation).
    """
    d = pathlib.Path(path)
    if not d.is_dir():
      raise FileNotFoundError(f"{d}: tokenizer directory not found")
    tok_file = d / "tokenizer.json"
    if not tok_file.is_file():
      raise FileNotFoundError(
          f"{tok_file}: tokenizer file not found (only fast tokenizers, "
          "saved as tokenizer.json, are supported)")
    try:
      backend = tokenizers.Tokenizer.from_file(str(tok_file))
    except Exception as e:  # The Rust side raises plain Exception.
      raise TokenizerError(f"{tok_file}: unreadable ({e})") from e
    config = _read_json(d / "tokenizer_config.json", required=False)
    special_map = _read_json(d / "special_tokens_map.json", required=False)
    gen = _read_json(d / "generation_config.json", required=False)

    def special(name):
      value = _token_content(config.get(name, special_map.get(name)))
      if value is None:
        return None
      i = backend.token_to_id(value)
      if i is None:
        raise TokenizerError(f"{d}: {name} {value!r} (tokenizer_config.json"
                             "/special_tokens_map.json) is not in the vocab")
      return i

    eos = [special("eos_token")]
    gen_eos = gen.get("eos_token_id")
    eos += gen_eos if isinstance(gen_eos, list) else [gen_eos]
    eos += [i for i, t in sorted(backend.get_added_tokens_decoder().items())
            if t.special and t.content in END_OF_GENERATION_TOKENS]
    eos = [i for i in eos if i is not None]
    if not eos:
      raise TokenizerError(f"{d}: no EOS token: set 'eos_token' in "
                           "tokenizer_config.json")
    bos = special("bos_token")
    pad = special("pad_token")
    if pad is None and isinstance(gen.get("pad_token_id"), int):
      pad = gen["pad_token_id"]
    add_bos = config.get("add_bos_token")
    if add_bos is None and bos is not None:
      # No flag: tokenizer.json's post-processor decides, as in transformers.
      add_bos = bos in backend.encode("", add_special_tokens=True).ids
    return cls(backend, bos_id=bos, eos_ids=eos, pad_id=pad,
               unk_id=special("unk_token"),
               chat_template=_hf_chat_template(d, config),
               add_bos=bool(add_bos), source=str(d))

  # -- properties --

  @property
  def backend(self) -> tokenizers.Tokenizer:
    """The underlying `tokenizers.Tokenizer` (do not mutate it)."""
    return self._backend

  @property
  def bos_id(self) -> int | None:
    return self._bos_id

  @property
  def eos_id(self) -> int:
    """The primary EOS: the one the metadata names, appended after turns."""
    return self._eos_ids[0]

  @property
  def eos_ids(self) -> tuple[int, ...]:
    """Every id that ends generation."""
    return self._eos_ids

  @property
  def pad_id(self) -> int:
    """The padding id; the primary EOS when the model names none."""
    return self._pad_id

  @property
  def unk_id(self) -> int | None:
    return self._unk_id

  @property
  def add_bos(self) -> bool:
    """Whether this model expects BOS before raw (non-chat) text."""
    return self._add_bos

  @property
  def vocab_size(self) -> int:
    return self._backend.get_vocab_size(with_added_tokens=True)

  @property
  def special_ids(self) -> frozenset[int]:
    """Ids of special (control) tokens, e.g. for `decode(skip_special)`."""
    return self._special_ids

  @property
  def chat_template(self) -> str | None:
    return self._chat_template

  def _token(self, i: int | None) -> str | None:
    return None if i is None else self._backend.id_to_token(i)

  @property
  def special_tokens(self) -> dict[str, str]:
    """`bos_token`, `eos_token`, ... as strings, the names templates use."""
    names = {"bos_token": self._bos_id, "eos_token": self.eos_id,
             "pad_token": self._pad_id, "unk_token": self._unk_id}
    return {k: self._token(i) for k, i in names.items() if i is not None}

  def train_like(self, texts: Iterable[str], vocab_size: int, *,
                 split_digits: bool = True) -> "Tokenizer":
    """A new byte-level BPE vocabulary learnt from `texts`, shaped like this.

    The new tokenizer keeps this one's special tokens (in id order, so
    they keep their ids when they are the first ids, as in SmolLM2), its
    normaliser, pre-tokeniser, decoder and chat template; only the merges
    are new. For small models on a narrow domain (a CPU demo), where a
    49k-entry output layer would cost more than the rest of the model.
    `split_digits=False` drops a one-digit-per-token rule, so frequent
    numbers become single tokens (easier to copy for a small model).
    """
    if not self._bytelevel:
      raise TokenizerError(f"{self._source or 'tokenizer'}: train_like needs "
                           "a byte-level BPE tokenizer")
    added = sorted(self._backend.get_added_tokens_decoder().items())
    specials = [AddedToken(t.content, special=True, normalized=False)
                for _, t in added]
    backend = tokenizers.Tokenizer(models.BPE())
    base = self._backend
    if base.normalizer is not None:
      backend.normalizer = base.normalizer
    backend.pre_tokenizer = (base.pre_tokenizer if split_digits else
                             _without_digit_split(base.pre_tokenizer))
    backend.decoder = base.decoder
    from tokenizers import trainers  # pylint: disable=g-import-not-at-top
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer)
    ids = {t.content: backend.token_to_id(t.content) for _, t in added}
    new = lambda i: None if i is None else ids[self._backend.id_to_token(i)]
    return Tokenizer(backend, bos_id=new(self._bos_id),
                     eos_ids=[new(i) for i in self._eos_ids],
                     pad_id=new(self._pad_id), unk_id=new(self._unk_id),
                     chat_template=self._chat_template,
                     add_bos=self._add_bos, source=f"{self._source} (retrained)")

  # -- encoding --

  def _pick(self, backend, allow_special: bool):
    if allow_special:
      return backend
    plain = self._plain.get(id(backend))
    if plain is None:
      # A copy, because the flag is per backend and `backend` is shared.
      plain = tokenizers.Tokenizer.from_str(backend.to_str())
      plain.encode_special_tokens = True
      self._plain[id(backend)] = plain
    return plain

  def _bos(self, add_bos: bool) -> list[int]:
    if not add_bos:
      return []
    if self._bos_id is None:
      raise TokenizerError(f"{self._source}: add_bos=True but the "
                           "tokenizer has no BOS token")
    return [self._bos_id]

  def encode(self, text: str, add_bos: bool = False,
             allow_special: bool = True) -> list[int]:
    """Ids of `text`, read as the start of a sequence.

    Args:
      text: the text.
      add_bos: put the BOS id first.
      allow_special: read special-token strings (`<|im_end|>`) in `text` as
        those tokens; False encodes them as plain text.
    """
    backend = self._pick(self._backend, allow_special)
    return self._bos(add_bos) + backend.encode(
        text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str], add_bos: bool = False,
                   allow_special: bool = True) -> list[list[int]]:
    """`encode` over many texts, in parallel threads."""
    backend = self._pick(self._backend, allow_special)
    bos = self._bos(add_bos)
    return [bos + e.ids for e in backend.encode_batch(
        list(texts), add_special_tokens=False)]

  def encode_continuation(self, text: str,
                          allow_special: bool = True) -> list[int]:
    """Ids of `text` as a segment that follows other text.

    Same as `encode` for byte-level BPE; for SentencePiece it leaves out the
    prefix space a sequence starts with. See the module docstring.
    """
    if self._continuation is None:
      self._continuation = _without_prefix_space(self._backend)
    backend = self._pick(self._continuation, allow_special)
    return backend.encode(text, add_special_tokens=False).ids

  def encode_segments(self, segments: Iterable[str], add_bos: bool = False,
                      allow_special: bool | Sequence[bool] = True,
                      ) -> list[list[int]]:
    """Ids per segment; their concatenation is the sequence's ids.

    The first segment is encoded with `encode` (and gets BOS if asked), the
    rest with `encode_continuation`. `allow_special` may be one flag per
    segment, e.g. False for tool observations.
    """
    segments = list(segments)
    flags = ([allow_special] * len(segments)
             if isinstance(allow_special, bool) else list(allow_special))
    if len(flags) != len(segments):
      raise ValueError(f"{len(flags)} allow_special flags for "
                       f"{len(segments)} segments")
    return [self.encode(s, add_bos, f) if k == 0 else
            self.encode_continuation(s, f)
            for k, (s, f) in enumerate(zip(segments, flags))]

  # -- decoding --

  def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
    """Text of `ids` (any int sequence, numpy arrays included)."""
    return self._backend.decode([int(i) for i in ids],
                                skip_special_tokens=skip_special)

  def decode_batch(self, batch: Iterable[Iterable[int]],
                   skip_special: bool = False) -> list[str]:
    return self._backend.decode_batch(
        [[int(i) for i in ids] for ids in batch],
        skip_special_tokens=skip_special)

  def id_to_piece(self, i: int) -> str:
    """The vocabulary entry for id `i`, as stored (`Ġworld`, `▁the`)."""
    piece = self._backend.id_to_token(int(i))
    if piece is None:
      raise IndexError(f"token id {i} is outside the vocabulary "
                       f"({self.vocab_size} tokens)")
    return piece

  def piece_to_id(self, piece: str) -> int | None:
    return self._backend.token_to_id(piece)

  def token_bytes(self, i: int) -> bytes:
    """The bytes token `i` stands for in text.

    A token can be part of a UTF-8 character, so streamed output must join
    bytes before decoding them.
    """
    piece = self.id_to_piece(i)
    if int(i) in self._added_ids:  # Added tokens are stored as plain text.
      return piece.encode("utf-8")
    if self._bytelevel:
      table = _unicode_to_bytes()
      return bytes(table[c] for c in piece)
    m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
    if m:
      return bytes([int(m.group(1), 16)])
    return piece.replace("▁", " ").encode("utf-8")

  # -- chat --

  def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                          add_generation_prompt: bool = True,
                          tools: Sequence[Any] | None = None,
                          **template_kwargs) -> str:
    """Renders `messages` with the model's chat template, as transformers.

    Args:
      messages: dicts with `role` and `content` (and whatever else the
        template reads, e.g. `tool_calls`); keys set to None are dropped.
      add_generation_prompt: end with the header of an assistant turn.
      tools: JSON-schema dicts (or typed, documented functions).
      **template_kwargs: extra template variables (e.g. `enable_thinking`);
        they override the special-token strings passed by default.
    """
    if not self._chat_template:
      raise TokenizerError(
          f"{self._source}: no chat template (GGUF field "
          "'tokenizer.chat_template' / 'chat_template' in "
          "tokenizer_config.json)")
    msgs = [{k: v for k, v in m.items() if v is not None} for m in messages]
    variables = {**self.special_tokens, **template_kwargs}
    return _compile_template(self._chat_template).render(
        messages=msgs, tools=_tool_schemas(tools), documents=None,
        add_generation_prompt=add_generation_prompt, **variables)

  def render_and_encode(self, messages: Sequence[Mapping[str, Any]],
                        add_generation_prompt: bool = True,
                        tools: Sequence[Any] | None = None,
                        **template_kwargs) -> list[int]:
    """Ids of the rendered chat; the template supplies any BOS."""
    return self.encode(self.apply_chat_template(
        messages, add_generation_prompt, tools, **template_kwargs))

  # -- export --

  def save_hf_dir(self, path) -> None:
    """Writes tokenizer.json, tokenizer_config.json, special_tokens_map.json.

    `transformers.AutoTokenizer.from_pretrained(path)` loads the result
    offline and encodes like this tokenizer (BOS included by default iff
    `add_bos`). Files already in `path` (the model's) are kept.
    """
    d = pathlib.Path(path)
    d.mkdir(parents=True, exist_ok=True)
    backend = tokenizers.Tokenizer.from_str(self._backend.to_str())
    if self._add_bos:
      bos = self._token(self._bos_id)
      backend.post_processor = processors.TemplateProcessing(
          single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
          special_tokens=[(bos, self._bos_id)])
    else:
      backend.post_processor = None
    backend.save(str(d / "tokenizer.json"))
    specials = self.special_tokens
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": self._add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
        "added_tokens_decoder": {
            str(i): {"content": t.content, "lstrip": t.lstrip,
                     "normalized": t.normalized, "rstrip": t.rstrip,
                     "single_word": t.single_word, "special": t.special}
            for i, t in sorted(backend.get_added_tokens_decoder().items())},
    }
    if self._chat_template:
      config["chat_template"] = self._chat_template
    _write_json(d / "tokenizer_config.json", config)
    _write_json(d / "special_tokens_map.json", specials)

  def __repr__(self) -> str:
    return (f"Tokenizer({self._source!r}, vocab_size={self.vocab_size}, "
            f"bos={self._bos_id}, eos={self._eos_ids}, pad={self._pad_id})")


def _write_json(path: pathlib.Path, obj) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2, ensure_ascii=False)
    f.write("\n")


def _hf_chat_template(d: pathlib.Path, config: Mapping[str, Any]):
  """The default chat template; a chat_template.jinja file wins."""
  jinja_file = d / "chat_template.jinja"
  if jinja_file.is_file():
    return jinja_file.read_text(encoding="utf-8")
  template = config.get("chat_template")
  if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
    named = {t.get("name"): t.get("template") for t in template}
    template = named.get("default")
  return template


def _without_digit_split(pre):
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


def _has_bytelevel(backend: tokenizers.Tokenizer) -> bool:
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


def _without_prefix_space(backend: tokenizers.Tokenizer):
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
