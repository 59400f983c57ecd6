"""Tiny Hugging Face models with every parameter randomly drawn.

HF's default init leaves biases at 0 and norms at 1, which would hide loader
bugs (a transposed bias, a norm read from the wrong layer); here every tensor
gets its own random values.
"""

import contextlib

import numpy as np
import torch
import transformers

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=256)


def hf_config(family: str, **kw) -> transformers.PretrainedConfig:
  base = dict(TINY)
  if family == "llama":
    base.update(rope_theta=50000.0, tie_word_embeddings=False,
                rope_scaling=dict(rope_type="llama3", factor=8.0,
                                  low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=32))
    base.update(kw)
    return transformers.LlamaConfig(**base)
  if family == "qwen2":
    base.update(rope_theta=10000.0, tie_word_embeddings=True)
    base.update(kw)
    return transformers.Qwen2Config(**base)
  if family == "qwen3":
    # head_dim 24 != hidden / heads = 16: the two must not be confused.
    base.update(head_dim=24, rope_theta=10000.0, tie_word_embeddings=True)
    base.update(kw)
    return transformers.Qwen3Config(**base)
  if family == "gemma2":
    base.update(sliding_window=8, query_pre_attn_scalar=24,
                attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                tie_word_embeddings=True)
    base.update(kw)
    return transformers.Gemma2Config(**base)
  raise ValueError(family)


def randomize_(model: torch.nn.Module, seed: int = 0, *, std: float = 0.08,
               bias_std: float = 0.5, norm_std: float = 0.3) -> None:
  """Weights N(0, std), biases N(0, bias_std), norms 1 +- norm_std (Gemma
  stores the scale minus one, so its norms are centred on 0)."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=g)
      if "norm" in name:
        p.copy_(noise * norm_std + (0.0 if "gemma"
                in type(model).__name__.lower() else 1.0))
      elif name.endswith("bias"):
        p.copy_(noise * bias_std)
      else:
        p.copy_(noise * std)


def save_random_model(family: str, path, seed: int = 0, *, init=None, **kw):
  """Saves a random tiny model of `family` to `path`; returns the model.

  `init`: keyword arguments of `randomize_`; the rest go to the config.
  """
  torch.manual_seed(seed)
  cfg = hf_config(family, **kw)
  model = transformers.AutoModelForCausalLM.from_config(
      cfg, attn_implementation="eager", dtype=torch.float32)
  randomize_(model, seed, **(init or {}))
  model.eval()
  model.save_pretrained(str(path), safe_serialization=True)
  return model


def save_greedy_model(family: str, path, seed: int = 0, std: float = 0.02,
                      **kw):
  """A random model for greedy parity: weights and biases N(0, std), norms
  1 +- 0.1. Untied embeddings keep greedy decoding from repeating the last
  token."""
  return save_random_model(
      family, path, seed, tie_word_embeddings=False,
      init=dict(std=std, bias_std=std, norm_std=0.1), **kw)


@contextlib.contextmanager
def torch_threads(n: int):
  # Several processes share two cores: more torch threads only contend.
  old = torch.get_num_threads()
  torch.set_num_threads(n)
  try:
    yield
  finally:
    torch.set_num_threads(old)


def greedy(model, prompts, new_tokens: int) -> np.ndarray:
  """transformers' greedy continuation of left-padded prompts, EOS off."""
  P = max(map(len, prompts))
  ids = np.zeros((len(prompts), P), np.int64)
  mask = np.zeros((len(prompts), P), np.int64)
  for i, p in enumerate(prompts):
    ids[i, P - len(p):], mask[i, P - len(p):] = p, 1
  model.generation_config.eos_token_id = None
  with torch_threads(1), torch.no_grad():
    out = model.generate(input_ids=torch.tensor(ids),
                         attention_mask=torch.tensor(mask),
                         max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=0)
  return out[:, P:].numpy()
