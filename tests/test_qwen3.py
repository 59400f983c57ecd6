"""Qwen3: greedy parity with `transformers`, its params and config errors.

Forward parity is in test_models (the family list), export round trips in
test_hf_export.
"""

import json

import numpy as np
import pytest

import hf_models
from swirl_jax.models import decoder, hf_io
from swirl_jax.models.config import from_hf_config
from swirl_jax.sampling.sampler import Sampler, SamplerConfig

CONFIG = SamplerConfig(max_cache_len=128, batch_buckets=(4,),
                       length_buckets=(32,), cache_buckets=(128,),
                       step_buckets=(64,), eos_ids=())


def test_greedy_matches_transformers_qwen3(tmp_path):
  """Left-padded prompts of three lengths, 64 tokens through the KV cache."""
  model = hf_models.save_greedy_model("qwen3", tmp_path, seed=3, std=0.05)
  cfg, params = hf_io.load_hf_dir(tmp_path)
  assert cfg.family == "qwen3" and cfg.head_dim == 24
  rng = np.random.RandomState(3)
  prompts = [rng.randint(0, cfg.vocab_size, n).tolist() for n in (5, 12, 9)]
  res = Sampler(params, cfg, config=CONFIG).generate(prompts,
                                                    max_new_tokens=64)
  ref = hf_models.greedy(model, prompts, 64)
  np.testing.assert_array_equal(np.asarray(res.tokens), ref)
  assert max(len(set(t)) for t in res.tokens) > 10  # Not degenerate.


def _tiny_hf_config() -> dict:
  return hf_models.hf_config("qwen3").to_dict()


def test_qk_norm_params_are_per_head_dim_and_replicated():
  cfg = from_hf_config(_tiny_hf_config())
  params = decoder.abstract_params(cfg)["layers"]["attn"]
  axes = decoder.param_logical_axes(cfg)["layers"]["attn"]
  for n in ("q_norm", "k_norm"):
    assert params[n]["scale"].shape == (cfg.num_layers, cfg.head_dim)
    assert tuple(axes[n]["scale"]) == ("layers", "head_dim")
  assert "q_bias" not in params


@pytest.mark.parametrize("field,message", [
    ("attention_bias", "attention_bias=true"),
    ("use_sliding_window", "use_sliding_window=true")])
def test_unsupported_qwen3_options_fail(field, message, tmp_path):
  hf_models.save_random_model("qwen3", tmp_path)
  hf = json.loads((tmp_path / "config.json").read_text())
  hf[field] = True
  (tmp_path / "config.json").write_text(json.dumps(hf))
  with pytest.raises(ValueError, match=f"config.json: qwen3 with {message}"):
    hf_io.load_hf_dir(tmp_path)


def test_missing_fields_take_transformers_qwen3_defaults():
  """Without them, transformers' Qwen3 has head_dim 128 (not hidden / heads)
  and untied embeddings."""
  hf = _tiny_hf_config()
  del hf["head_dim"], hf["tie_word_embeddings"]
  cfg = from_hf_config(hf)
  assert (cfg.head_dim, cfg.tie_embeddings) == (128, False)
