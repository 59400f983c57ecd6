"""A tiny Qwen3-style tokenizer directory: chat template, think blocks, EOS.

The directory is built here with the `tokenizers` library (a small byte-level
BPE with Qwen2's split regex and Qwen3's added tokens) plus a
tokenizer_config.json laid out like Qwen3's. `data/qwen3_chat_template.jinja`
is the chat template of Qwen/Qwen3-8B's tokenizer_config.json, as quoted in
guidance-ai/guidance (guidance/chat.py, `qwen3_it_template`).
"""

import json
import os
import pathlib

import pytest
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers
from tokenizers import pre_tokenizers, trainers

from swirl_jax.models.gguf_tokenizer import QWEN2_SPLIT
from swirl_jax.models.tokenizer import Tokenizer
from swirl_jax.rollout import prompts
from swirl_jax.tasks.records import Task
from test_tokenizer import hf_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEMPLATE = (pathlib.Path(__file__).parent / "data" /
            "qwen3_chat_template.jinja").read_text(encoding="utf-8")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # Ids 0, 1, 2.
PLAIN = ["<tool_call>", "</tool_call>", "<think>", "</think>"]  # As Qwen3.
CORPUS = [
    "You are a helpful assistant. What is 2+2? Let me add the numbers.",
    "The answer is 4. <math_exp>17 + 25</math_exp> -> 42",
    "I need to think about this step by step.\n\nFirst, search the docs.",
    "<search_query>capital of France</search_query> Paris is the capital.",
]
THINK_CHAT = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant",
     "content": "<think>\nLet me add.\n</think>\n\nThe answer is 4."},
    {"role": "user", "content": "And 17+25?"},
    {"role": "assistant",
     "content": "<think>\nAdd again.\n</think>\n\n<math_exp>17+25</math_exp>"},
]


def _write_qwen3_dir(d: pathlib.Path) -> pathlib.Path:
  backend = tokenizers.Tokenizer(models.BPE())
  backend.normalizer = normalizers.NFC()
  backend.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  backend.decoder = decoders.ByteLevel()
  backend.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(
      vocab_size=400, special_tokens=SPECIAL, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  backend.add_tokens([AddedToken(t, normalized=False) for t in PLAIN])
  d.mkdir(parents=True, exist_ok=True)
  backend.save(str(d / "tokenizer.json"))
  added = {
      str(backend.token_to_id(t)): {
          "content": t, "lstrip": False, "normalized": False, "rstrip": False,
          "single_word": False, "special": t in SPECIAL}
      for t in SPECIAL + PLAIN}
  config = {
      "add_bos_token": False, "add_prefix_space": False,
      "added_tokens_decoder": added,
      "additional_special_tokens": SPECIAL[1:], "bos_token": None,
      "chat_template": TEMPLATE, "clean_up_tokenization_spaces": False,
      "eos_token": "<|im_end|>", "errors": "replace",
      "model_max_length": 40960, "pad_token": "<|endoftext|>",
      "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
      "unk_token": None}
  (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
  # Qwen3's generation config ends on <|im_end|> and <|endoftext|>.
  (d / "generation_config.json").write_text(json.dumps(
      {"bos_token_id": 0, "eos_token_id": [2, 0], "pad_token_id": 0}))
  return d


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
  return _write_qwen3_dir(tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module")
def tok(qwen3_dir):
  return Tokenizer.from_hf_dir(qwen3_dir)


@pytest.fixture(scope="module")
def hf(qwen3_dir):
  return hf_tokenizer(str(qwen3_dir))


def test_eos_pad_and_bos(tok):
  assert tok.eos_id == tok.piece_to_id("<|im_end|>") == 2
  assert tok.eos_ids == (2, 0)  # <|im_end|>, then <|endoftext|>.
  assert tok.pad_id == 0 and tok.bos_id is None and not tok.add_bos
  assert tok.special_ids == {0, 1, 2}
  # <think> is one added, non-special token: it survives skip_special.
  ids = tok.encode("<think>\nx\n</think>")
  assert ids[0] == tok.piece_to_id("<think>")
  assert ids[-1] == tok.piece_to_id("</think>")
  assert tok.decode(ids, skip_special=True) == "<think>\nx\n</think>"


@pytest.mark.parametrize("thinking", [None, True, False])
@pytest.mark.parametrize("gen", [True, False])
def test_template_renders_as_transformers(tok, hf, thinking, gen):
  kw = {} if thinking is None else {"enable_thinking": thinking}
  chats = [THINK_CHAT[:1], THINK_CHAT[:3], THINK_CHAT,
           [{"role": "system", "content": "Be brief."}] + THINK_CHAT[:2]]
  for chat in chats:
    ours = tok.apply_chat_template(chat, add_generation_prompt=gen, **kw)
    ref = hf.apply_chat_template(chat, tokenize=False,
                                 add_generation_prompt=gen, **kw)
    assert ours == ref
    assert tok.encode(ours) == hf.encode(ours, add_special_tokens=False)


def test_think_blocks(tok):
  # Reasoning of turns before the last user turn is dropped; the last
  # assistant turn keeps its block.
  assert tok.apply_chat_template(THINK_CHAT, add_generation_prompt=False) == (
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
      "<|im_start|>assistant\nThe answer is 4.<|im_end|>\n"
      "<|im_start|>user\nAnd 17+25?<|im_end|>\n"
      "<|im_start|>assistant\n<think>\nAdd again.\n</think>\n\n"
      "<math_exp>17+25</math_exp><|im_end|>\n")
  head = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
  assert tok.apply_chat_template(THINK_CHAT[:1]) == head
  no_think = head + "<think>\n\n</think>\n\n"
  assert tok.apply_chat_template(THINK_CHAT[:1],
                                 enable_thinking=False) == no_think
  off = tok.with_chat_template_kwargs(enable_thinking=False)
  assert off.chat_template_kwargs == {"enable_thinking": False}
  assert off.apply_chat_template(THINK_CHAT[:1]) == no_think
  assert off.apply_chat_template(THINK_CHAT[:1], enable_thinking=True) == head
  assert tok.apply_chat_template(THINK_CHAT[:1]) == head  # Unchanged.
  assert off.encode("a b") == tok.encode("a b")


@pytest.mark.parametrize("thinking", [True, False])
def test_rollout_ids_keep_sampled_think_blocks(tok, thinking):
  """Prompt + sampled turn + observation frame, as the rollout loop builds
  them: ids concatenate to the ids of the whole text, think tokens stay
  whole, and each new assistant header is the template's generation prompt.
  """
  t = tok.with_chat_template_kwargs(enable_thinking=thinking)
  prompt, ids = prompts.prompt_ids(
      t, Task(id="q", question="What is 17+25?", answers=["42"],
              source="synthetic"), "swirl", tools=("calculator",))
  header = "<|im_start|>assistant\n" + (
      "" if thinking else "<think>\n\n</think>\n\n")
  assert prompt.endswith("What is 17+25?<|im_end|>\n" + header)
  action = "<think>\nAdd them.\n</think>\n\n<math_exp>17+25</math_exp>"
  action_ids = t.encode_continuation(action) + [t.eos_id]
  obs_ids = prompts.observation_ids(
      t, prompts.observation_frame(t, "swirl"), "17+25 -> 42", action_ids)
  text = prompt + action + "<|im_end|>" + t.decode(obs_ids)
  assert ids + action_ids + obs_ids == t.encode(text)
  assert t.decode(ids + action_ids + obs_ids) == text
  assert action_ids.count(t.piece_to_id("<think>")) == 1
  assert action_ids.count(t.piece_to_id("</think>")) == 1
  # The observation frame ends with the same assistant header (with the
  # empty think block when thinking is off) as the prompt.
  assert t.decode(obs_ids) == ("\n<|im_start|>user\n17+25 -> 42<|im_end|>\n"
                               + header)
  # Re-rendering the chat would drop the sampled reasoning; the rollout's
  # ids keep it.
  assert "Add them." in text


def test_save_and_reload(tok, tmp_path):
  tok.save_hf_dir(tmp_path)
  again = Tokenizer.from_hf_dir(tmp_path)
  assert again.chat_template == TEMPLATE
  assert (again.eos_id, again.pad_id) == (tok.eos_id, tok.pad_id)
  ref = hf_tokenizer(str(tmp_path))
  assert ref.apply_chat_template(
      THINK_CHAT, tokenize=False, add_generation_prompt=True,
      enable_thinking=False) == (
          tok.apply_chat_template(THINK_CHAT, enable_thinking=False))
