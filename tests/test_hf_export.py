"""HF export round trips: load -> export -> load is bit-identical, and
`transformers` loading the export gives our logits.

Untied models matter most: their `lm_head` is stored transposed, and a
transposed view written as it lies in memory comes back scrambled.
"""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers

import hf_models
import testutil
from swirl_jax.models import decoder, hf_io

# (family, tied embeddings, max_shard_bytes): one case writes many shards.
CASES = {
    "llama_untied": ("llama", False, 4 << 30),
    "qwen2_tied_sharded": ("qwen2", True, 50_000),
    "qwen3_untied": ("qwen3", False, 4 << 30),
    "qwen3_tied": ("qwen3", True, 4 << 30),
}


def _left_padded(vocab, lengths, total, seed=0):
  rng = np.random.RandomState(seed)
  tokens = np.zeros((len(lengths), total), np.int64)
  mask = np.zeros((len(lengths), total), bool)
  for i, n in enumerate(lengths):
    tokens[i, total - n:] = rng.randint(0, vocab, n)
    mask[i, total - n:] = True
  return tokens, mask, np.maximum(np.cumsum(mask, 1) - 1, 0)


def _hf_logits(path, tokens, mask, positions):
  model = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32, attn_implementation="eager")
  return testutil.hf_logits(model, tokens, mask, positions)


def _ints_stay_ints(src: dict, out: dict, prefix=""):
  """Every integer field of `src` that `out` also has is an integer there."""
  for k, v in src.items():
    if k not in out:
      continue
    if isinstance(v, dict) and isinstance(out[k], dict):
      _ints_stay_ints(v, out[k], prefix + k + ".")
    elif isinstance(v, int) and not isinstance(v, bool):
      assert type(out[k]) is int, f"{prefix}{k}: {out[k]!r} is not an int"


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_round_trip(case, tmp_path):
  family, tied, shard_bytes = CASES[case]
  hf_models.save_random_model(family, tmp_path / "src", seed=2,
                              tie_word_embeddings=tied)
  cfg, params = hf_io.load_hf_dir(tmp_path / "src")
  assert cfg.tie_embeddings == tied and ("lm_head" in params) != tied
  hf_io.export_hf_dir(params, cfg, tmp_path / "out",
                      max_shard_bytes=shard_bytes)
  cfg2, params2 = hf_io.load_hf_dir(tmp_path / "out")
  assert cfg2 == cfg
  assert jax.tree.structure(params2) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, params2, params)

  src = json.loads((tmp_path / "src" / "config.json").read_text())
  out = json.loads((tmp_path / "out" / "config.json").read_text())
  assert out["model_type"] == family
  _ints_stay_ints(src, out)

  tokens, mask, pos = _left_padded(cfg.vocab_size, [12, 7, 1], 12)
  ref = _hf_logits(tmp_path / "out", tokens, mask, pos)
  ours, _ = decoder.forward(params, cfg, jnp.asarray(tokens),
                            jnp.asarray(pos), jnp.asarray(mask))
  err = np.abs(np.asarray(ours) - ref)[mask].max()
  assert err <= 1e-5, f"{case}: max abs logit error {err}"


def test_llama3_rope_scaling_exported_as_ints(tmp_path):
  hf_models.save_random_model("llama", tmp_path / "src")
  cfg, params = hf_io.load_hf_dir(tmp_path / "src")
  hf_io.export_hf_dir(params, cfg, tmp_path / "out")
  out = json.loads((tmp_path / "out" / "config.json").read_text())
  for key in ("rope_scaling", "rope_parameters"):
    assert out[key]["original_max_position_embeddings"] == 32
    assert type(out[key]["original_max_position_embeddings"]) is int


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_export_cast_is_the_cast_of_each_tensor(dtype, tmp_path):
  """Casting keeps a transposed view's memory order: the export must still
  write every tensor (the untied lm_head most of all) in its own layout."""
  hf_models.save_random_model("qwen3", tmp_path / "src",
                              tie_word_embeddings=False)
  cfg, params = hf_io.load_hf_dir(tmp_path / "src")
  hf_io.export_hf_dir(params, cfg, tmp_path / "out", dtype=dtype)
  out = json.loads((tmp_path / "out" / "config.json").read_text())
  assert out["torch_dtype"] == dtype
  _, params2 = hf_io.load_hf_dir(tmp_path / "out")
  np_dtype = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
  want = jax.tree.map(
      lambda x: np.asarray(x).astype(np_dtype).astype(np.float32), params)
  jax.tree.map(np.testing.assert_array_equal, params2, want)
