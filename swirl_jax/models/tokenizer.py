"""Text <-> token ids, from a Hugging Face tokenizer directory or a GGUF file.

Encoding and decoding run in the Rust `tokenizers` library. Hugging Face
directories load, render their chat template and save through
`transformers.PreTrainedTokenizerFast`, so prompts match what the model saw
in training; GGUF vocabularies are converted by `gguf_tokenizer` and wrapped
the same way for templates and export.

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

Reasoning blocks. Qwen3-style templates drop the `<think>...</think>` block
of assistant turns before the last user turn when they re-render a chat. A
rollout never re-renders: its ids are the prompt, then the sampled ids, then
the observation frame (`rollout.prompts.observation_frame`), so a sampled
think block stays in the sequence exactly as sampled. Template variables such
as `enable_thinking=False` are set once per tokenizer
(`chat_template_kwargs`), so the prompt and every observation frame agree.

One module: one class whose methods share its backend, specials and
template state, and the segment and mask contract below spans loading,
chat rendering, learnt vocabularies and saving (split, the invariant
would sit apart from the code that keeps it); the vocabulary pipelines
and the GGUF conversion are already their own modules
(tokenizer_pipeline.py, gguf_tokenizer.py).
"""

import copy
import hashlib
import json
import os
import pathlib
import re
from typing import Any, Iterable, Mapping, Sequence

import tokenizers
import transformers
from transformers.convert_slow_tokenizer import bytes_to_unicode

from swirl_jax import paths
from swirl_jax.models import gguf_io, gguf_tokenizer
from swirl_jax.models import tokenizer_pipeline as pipeline
from swirl_jax.models.gguf_tokenizer import TokenizerError

__all__ = ["END_OF_GENERATION_TOKENS", "Tokenizer", "TokenizerError"]

# Special tokens that end a turn in common chat formats. Like llama.cpp, a
# control token with one of these names stops generation even when the
# metadata names another EOS (SmolLM2 and Qwen2/3 instruct end turns with
# `<|im_end|>` but pretraining documents with `<|endoftext|>`).
END_OF_GENERATION_TOKENS = frozenset({
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>",
    "<|end_of_text|>", "<end_of_turn>", "<|end|>", "<EOT>",
    "<|return|>", "<｜end▁of▁sentence｜>",
})

# ByteLevel's printable character -> the byte it spells.
_BYTE_OF_CHAR = {c: b for b, c in bytes_to_unicode().items()}


def _convert(reader, path: str):
  """(backend, constructor keywords) of an open GGUF file."""
  backend, kw = gguf_tokenizer.convert(reader, path)
  kw["eos_ids"] += _end_of_turn_ids(backend)
  if not kw["eos_ids"]:
    raise TokenizerError(f"{path}: GGUF field 'tokenizer.ggml.eos_token_id'"
                         " is missing and no end-of-turn token is marked")
  return backend, kw


def _cached_conversion(path):
  """`_convert` of the GGUF file at `path`, kept as JSON under
  `paths.user_cache_dir()/tokenizers`: `gguf` parses every metadata field
  in Python (about 4 s for a 49k-token vocabulary, in every process that
  loads the tokenizer alone), where the kept backend loads in a tenth of
  that. The name holds the file's path, size and modification time and a
  digest of the converter's source, so a changed file or converter is
  converted again. A cache that cannot be read or written is skipped."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise gguf_io.CheckpointError(f"{path}: file is missing")
  st = path.stat()
  source = b"".join(pathlib.Path(m.__file__).read_bytes()
                    for m in (gguf_tokenizer, pipeline))
  key = hashlib.sha256(repr((str(path.resolve()), st.st_size,
                             st.st_mtime_ns)).encode() + source).hexdigest()
  kept = pathlib.Path(paths.user_cache_dir()) / "tokenizers" / f"{key}.json"
  try:
    saved = json.loads(kept.read_text())
    return tokenizers.Tokenizer.from_str(saved["backend"]), saved["kw"]
  except Exception:  # pylint: disable=broad-except
    pass  # Not kept yet, or unreadable (the backend raises plain Exception).
  backend, kw = _convert(gguf_io.open_gguf(path), str(path))
  try:
    kept.parent.mkdir(parents=True, exist_ok=True)
    tmp = kept.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"backend": backend.to_str(), "kw": kw}))
    os.replace(tmp, kept)  # Whole or absent, whoever writes it.
  except OSError:
    pass  # A read-only home: convert again next time.
  return backend, kw


class Tokenizer:
  """Encodes, decodes and renders chats for one model's vocabulary.

  Build with `from_gguf` or `from_hf_dir`. Ids never include BOS unless
  asked (`add_bos=True`); chat templates write their own special tokens.
  `chat_template_kwargs` are template variables used by every render
  (e.g. `{"enable_thinking": False}` for Qwen3).
  """

  def __init__(self, backend: tokenizers.Tokenizer, *,
               bos_id: int | None, eos_ids: Sequence[int],
               pad_id: int | None = None, unk_id: int | None = None,
               chat_template: str | None = None, add_bos: bool = False,
               source: str = "",
               chat_template_kwargs: Mapping[str, Any] | None = None,
               hf_tokenizer=None):
    if not eos_ids:
      raise TokenizerError(f"{source or 'tokenizer'}: no EOS token")
    self._backend = backend
    self._continuation = None  # Built by the first encode_continuation.
    self._bos_id = bos_id
    self._eos_ids = tuple(dict.fromkeys(int(i) for i in eos_ids))
    self._pad_id = self._eos_ids[0] if pad_id is None else int(pad_id)
    self._unk_id = unk_id
    self._chat_template = chat_template
    self._template_kwargs = dict(chat_template_kwargs or {})
    self._add_bos = bool(add_bos) and bos_id is not None
    self._source = source
    self._hf = hf_tokenizer  # Built on first use when not given.
    self._plain = {}  # Backend -> copy that reads special tokens as text.
    added = backend.get_added_tokens_decoder()
    self._added_ids = frozenset(added)
    self._special_ids = frozenset(i for i, t in added.items() if t.special)
    self._bytelevel = pipeline.has_bytelevel(backend)

  # -- construction --

  @classmethod
  def from_gguf(cls, path_or_reader, chat_template_kwargs=None
                ) -> "Tokenizer":
    """From a GGUF file's `tokenizer.*` metadata.

    Args:
      path_or_reader: the .gguf path, or the `gguf.GGUFReader` that
        `gguf_io.open_gguf` returned (so a model load parses the file once).
        From a path, the conversion is read from the per-user cache when
        one of this file is there (`_cached_conversion`).
      chat_template_kwargs: template variables for every render.
    """
    if isinstance(path_or_reader, (str, os.PathLike)):
      backend, kw = _cached_conversion(path_or_reader)
      path = str(path_or_reader)
    else:
      path = gguf_io.reader_path(path_or_reader)
      backend, kw = _convert(path_or_reader, path)
    return cls(backend, source=path,
               chat_template_kwargs=chat_template_kwargs, **kw)

  @classmethod
  def from_hf_dir(cls, path, chat_template_kwargs=None) -> "Tokenizer":
    """From a local Hugging Face tokenizer directory.

    Loads with `transformers.PreTrainedTokenizerFast` (`tokenizer.json`
    required, `tokenizer_config.json`, `chat_template.jinja`, ...); the
    `eos_token_id`s of `generation_config.json` also end generation.
    """
    d = pathlib.Path(path)
    if not d.is_dir():
      raise FileNotFoundError(f"{d}: tokenizer directory not found")
    if not (d / "tokenizer.json").is_file():
      raise FileNotFoundError(
          f"{d / 'tokenizer.json'}: tokenizer file not found (only fast "
          "tokenizers, saved as tokenizer.json, are supported)")
    try:
      hf = transformers.PreTrainedTokenizerFast.from_pretrained(
          str(d), local_files_only=True)
    except Exception as e:  # transformers and the Rust side raise anything.
      raise TokenizerError(f"{d}: unreadable tokenizer ({e})") from e
    backend = hf.backend_tokenizer
    gen = _generation_config(d)
    gen_eos = gen.get("eos_token_id")
    eos = [hf.eos_token_id]
    eos += gen_eos if isinstance(gen_eos, list) else [gen_eos]
    eos = [i for i in eos + _end_of_turn_ids(backend) if i is not None]
    if not eos:
      raise TokenizerError(f"{d}: no EOS token: set 'eos_token' in "
                           "tokenizer_config.json")
    pad = hf.pad_token_id
    if pad is None and isinstance(gen.get("pad_token_id"), int):
      pad = gen["pad_token_id"]
    bos = hf.bos_token_id
    # The post-processor holds transformers' reading of `add_bos_token`.
    add_bos = bos is not None and bos in backend.encode(
        "", add_special_tokens=True).ids
    template = hf.chat_template
    if isinstance(template, dict):  # Named templates: the default one.
      template = template.get("default")
    return cls(backend, bos_id=bos, eos_ids=eos, pad_id=pad,
               unk_id=hf.unk_token_id, chat_template=template,
               add_bos=add_bos, source=str(d),
               chat_template_kwargs=chat_template_kwargs, hf_tokenizer=hf)

  def with_chat_template_kwargs(self, **kwargs) -> "Tokenizer":
    """This tokenizer with more default template variables (shared vocab)."""
    new = copy.copy(self)
    new._template_kwargs = {**self._template_kwargs, **kwargs}
    return new

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
                 split_digits: bool = True,
                 phrases: Sequence[str] = ()) -> "Tokenizer":
    """A new byte-level BPE vocabulary learnt from `texts`, shaped like this.

    The new tokenizer keeps this one's special tokens (in id order, so
    they keep their ids when they are the first ids, as in SmolLM2), its
    normaliser, pre-tokeniser, decoder and chat template; only the merges
    are new. For small models on a narrow domain (a CPU demo), where a
    49k-entry output layer would cost more than the rest of the model.
    `split_digits=False` drops a one-digit-per-token rule, so frequent
    numbers become single tokens (easier to copy for a small model).
    `phrases` (texts every prompt repeats, such as a fixed instruction)
    become one token each: the text is unchanged, the sequences shorter.
    """
    if not self._bytelevel:
      raise TokenizerError(f"{self._source or 'tokenizer'}: train_like needs "
                           "a byte-level BPE tokenizer")
    added = sorted(self._backend.get_added_tokens_decoder().items())
    backend = pipeline.retrained(self._backend, texts, vocab_size,
                                 split_digits, phrases)
    ids = {t.content: backend.token_to_id(t.content) for _, t in added}
    new = lambda i: None if i is None else ids[self._backend.id_to_token(i)]
    return Tokenizer(backend, bos_id=new(self._bos_id),
                     eos_ids=[new(i) for i in self._eos_ids],
                     pad_id=new(self._pad_id), unk_id=new(self._unk_id),
                     chat_template=self._chat_template,
                     add_bos=self._add_bos, source=f"{self._source} (retrained)",
                     chat_template_kwargs=self._template_kwargs)

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
      self._continuation = pipeline.without_prefix_space(self._backend)
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
      return bytes(_BYTE_OF_CHAR[c] for c in piece)
    m = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
    if m:
      return bytes([int(m.group(1), 16)])
    return piece.replace("▁", " ").encode("utf-8")

  # -- chat --

  @property
  def chat_template_kwargs(self) -> dict[str, Any]:
    """Template variables every render gets (e.g. `enable_thinking`)."""
    return dict(self._template_kwargs)

  def hf_tokenizer(self) -> transformers.PreTrainedTokenizerFast:
    """The same vocabulary as a transformers tokenizer (do not mutate it)."""
    if self._hf is None:
      self._hf = transformers.PreTrainedTokenizerFast(
          tokenizer_object=self._backend, chat_template=self._chat_template,
          add_bos_token=self._add_bos, add_eos_token=False,
          clean_up_tokenization_spaces=False, **self.special_tokens)
    return self._hf

  def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                          add_generation_prompt: bool = True,
                          tools: Sequence[Any] | None = None,
                          **template_kwargs) -> str:
    """Renders `messages` with the model's chat template, by transformers.

    Args:
      messages: dicts with `role` and `content` (and whatever else the
        template reads, e.g. `tool_calls`); keys set to None are dropped.
      add_generation_prompt: end with the header of an assistant turn.
      tools: JSON-schema dicts (or typed, documented functions).
      **template_kwargs: extra template variables (e.g. `enable_thinking`);
        they override `chat_template_kwargs`.
    """
    if not self._chat_template:
      raise TokenizerError(
          f"{self._source}: no chat template (GGUF field "
          "'tokenizer.chat_template' / 'chat_template' in "
          "tokenizer_config.json)")
    msgs = [{k: v for k, v in m.items() if v is not None} for m in messages]
    return self.hf_tokenizer().apply_chat_template(
        msgs, tools=tools, add_generation_prompt=add_generation_prompt,
        tokenize=False, chat_template=self._chat_template,
        **{**self._template_kwargs, **template_kwargs})

  def render_and_encode(self, messages: Sequence[Mapping[str, Any]],
                        add_generation_prompt: bool = True,
                        tools: Sequence[Any] | None = None,
                        **template_kwargs) -> list[int]:
    """Ids of the rendered chat; the template supplies any BOS."""
    return self.encode(self.apply_chat_template(
        messages, add_generation_prompt, tools, **template_kwargs))

  # -- export --

  def save_hf_dir(self, path) -> None:
    """Writes the tokenizer files with `save_pretrained`.

    `transformers.AutoTokenizer.from_pretrained(path)` loads the result
    offline and encodes like this tokenizer (BOS included by default iff
    `add_bos`). Files already in `path` (the model's) are kept.
    """
    pathlib.Path(path).mkdir(parents=True, exist_ok=True)
    self.hf_tokenizer().save_pretrained(str(path))

  def __repr__(self) -> str:
    return (f"Tokenizer({self._source!r}, vocab_size={self.vocab_size}, "
            f"bos={self._bos_id}, eos={self._eos_ids}, pad={self._pad_id})")


def _end_of_turn_ids(backend: tokenizers.Tokenizer) -> list[int]:
  """Ids of special tokens that end a turn in some chat format."""
  return [i for i, t in sorted(backend.get_added_tokens_decoder().items())
          if t.special and t.content in END_OF_GENERATION_TOKENS]


def _generation_config(d: pathlib.Path) -> dict:
  """The model's generation_config.json next to the tokenizer, if any."""
  path = d / "generation_config.json"
  if not path.is_file():
    return {}
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    raise TokenizerError(f"{path}: unreadable JSON ({e})") from e
