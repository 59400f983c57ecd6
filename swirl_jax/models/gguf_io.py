"""GGUF checkpoints (llama.cpp) -> swirl_jax params, through PyPI `gguf`.

Tensors are dequantised to float32 and renamed to the Hugging Face layout,
then `hf_io.assemble` places them. llama.cpp stores the Q/K projection rows
interleaved for its rotary convention; `unpermute_qk` undoes that.
"""

import functools
import os
import pathlib

import numpy as np

from swirl_jax import sharding as shd
from swirl_jax.models.config import ModelConfig
from swirl_jax.models.hf_io import CheckpointError, assemble

# GGUF tensor name -> Hugging Face name (llama architecture).
_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
SUPPORTED_ARCHS = ("llama",)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Inverse of llama.cpp's Q/K row permutation ([out, in] layout)."""
  half = w.shape[0] // n_heads // 2
  return (w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2)
          .reshape(w.shape))


def _hf_name(name: str) -> str | None:
  if name in _NAMES:
    return _NAMES[name]
  parts = name.split(".")
  if len(parts) == 4 and parts[0] == "blk" and parts[2] in _BLOCK:
    return f"model.layers.{parts[1]}.{_BLOCK[parts[2]]}.{parts[3]}"
  return None


def _field(reader, key: str, path, default=None, required=True):
  f = reader.fields.get(key)
  if f is None:
    if required and default is None:
      raise CheckpointError(f"{path}: GGUF field {key!r} is missing")
    return default
  return f.contents()


def read_config(reader, path, **overrides) -> ModelConfig:
  arch = _field(reader, "general.architecture", path)
  if arch not in SUPPORTED_ARCHS:
    raise CheckpointError(f"{path}: GGUF field 'general.architecture' is "
                          f"{arch!r}; supported: {list(SUPPORTED_ARCHS)}")
  a = lambda k, **kw: _field(reader, f"{arch}.{k}", path, **kw)
  heads = int(a("attention.head_count"))
  hidden = int(a("embedding_length"))
  n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data) \
      if "tokenizer.ggml.tokens" in reader.fields else None
  names = {t.name for t in reader.tensors}
  kw = dict(
      family="llama", vocab_size=int(a("vocab_size", default=n_vocab)),
      hidden_size=hidden, intermediate_size=int(a("feed_forward_length")),
      num_layers=int(a("block_count")), num_heads=heads,
      num_kv_heads=int(a("attention.head_count_kv", default=heads)),
      head_dim=int(a("rope.dimension_count", default=hidden // heads)),
      norm_eps=float(a("attention.layer_norm_rms_epsilon")),
      rope_theta=float(a("rope.freq_base", default=10000.0)),
      tie_embeddings="output.weight" not in names,
      max_position_embeddings=int(a("context_length", default=8192)),
      bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id", path,
                          required=False),
      eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id", path,
                          required=False),
      pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id", path,
                          required=False))
  kw.update(overrides)
  return ModelConfig(**kw)


def open_gguf(path: str | os.PathLike):
  """The file's one `gguf.GGUFReader`, shared by the weights and tokenizer.

  A process reuses the reader of a file it opened before while the file is
  unchanged (same inode, size and modification time): `gguf` parses every
  metadata field in Python, about 4 s for SmolLM2's 49k-token vocabulary,
  and a run loads the same policy's tokenizer several times (each stage,
  the judge, evaluation). The reader only reads its memory map."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise CheckpointError(f"{path}: file is missing")
  st = path.stat()
  return _open_gguf(str(path), st.st_ino, st.st_size,
                    st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _open_gguf(path: str, inode: int, size: int, mtime_ns: int):
  import gguf  # pylint: disable=g-import-not-at-top
  del inode, size, mtime_ns  # The cache's key: the file as it is now.
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # gguf raises ValueError / struct errors.
    with open(path, "rb") as f:
      why = "truncated or corrupt" if f.read(4) == b"GGUF" else "no GGUF magic"
    raise CheckpointError(
        f"{path}: not a readable GGUF file ({why}: {e})") from None


def reader_path(reader) -> str:
  """The file name an open reader reads (for messages)."""
  return str(getattr(reader.data, "filename", "<GGUFReader>"))


def load_gguf(path_or_reader, *, mesh=None, rules=shd.DEFAULT_RULES,
              **overrides):
  """(ModelConfig, params) from a llama-architecture GGUF file.

  Args:
    path_or_reader: the .gguf path, or the reader `open_gguf` returned (so
      the tokenizer and the weights of one load share one parse).
  """
  from gguf import quants  # pylint: disable=g-import-not-at-top
  if isinstance(path_or_reader, (str, os.PathLike)):
    reader = open_gguf(path_or_reader)
  else:
    reader = path_or_reader
  path = reader_path(reader)
  cfg = read_config(reader, path, **overrides)
  tensors = {}
  for t in reader.tensors:
    name = _hf_name(t.name)
    if name is not None:
      tensors[name] = t

  def get(name: str) -> np.ndarray:
    if name not in tensors:
      raise CheckpointError(f"{path}: tensor for {name!r} is missing")
    t = tensors[name]
    try:
      w = np.asarray(quants.dequantize(t.data, t.tensor_type), np.float32)
    except Exception as e:
      raise CheckpointError(f"{path}: cannot dequantise {t.name} "
                            f"({t.tensor_type.name}): {e}") from None
    if name.endswith("q_proj.weight"):
      w = unpermute_qk(w, cfg.num_heads)
    elif name.endswith("k_proj.weight"):
      w = unpermute_qk(w, cfg.num_kv_heads)
    return w

  return cfg, assemble(cfg, get, mesh=mesh, rules=rules, source=str(path))
