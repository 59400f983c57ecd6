"""Decoder parity against `transformers`, checkpoint IO, sharding, bad input."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import hf_models
import testutil
from swirl_jax.models import decoder, gguf_io, hf_io, paged, presets
from swirl_jax.models.config import (Llama3RopeScaling, ModelConfig,
                                     from_hf_config, to_hf_config)

TOL = {"llama": 2e-4, "qwen2": 2e-4, "qwen3": 2e-4, "gemma2": 5e-3}


def _padded_batch(rng, vocab, lengths, total, left):
  tokens = np.zeros((len(lengths), total), np.int64)
  mask = np.zeros((len(lengths), total), bool)
  for i, n in enumerate(lengths):
    sl = slice(total - n, total) if left else slice(0, n)
    tokens[i, sl] = rng.randint(0, vocab, n)
    mask[i, sl] = True
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  return tokens, mask, positions


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma2"])
@pytest.mark.parametrize("left", [True, False], ids=["left_pad", "right_pad"])
@pytest.mark.parametrize("query_block", [0, 6], ids=["one_block", "blocks"])
def test_parity_with_transformers(family, left, query_block, tmp_path):
  model = hf_models.save_random_model(family, tmp_path, seed=1)
  cfg, params = hf_io.load_hf_dir(tmp_path)
  assert cfg.family == family
  # Blocks of 5 queries (20 / ceil(20 / 6)): the last is not 6 long either.
  cfg = cfg.replace(attn_query_block=query_block)
  rng = np.random.RandomState(0)
  # Gemma 2's window is 8: sequences of 20 cross it.
  tokens, mask, pos = _padded_batch(rng, cfg.vocab_size, [20, 13, 1], 20, left)
  ref = testutil.hf_logits(model, tokens, mask, pos)
  ours, _ = decoder.forward(params, cfg, jnp.asarray(tokens),
                            jnp.asarray(pos), jnp.asarray(mask))
  ours = np.asarray(ours)
  assert np.isfinite(ours).all()  # Padded query rows too.
  err = np.abs(ours - ref)[mask].max()
  assert err < TOL[family], f"{family}: max abs logit error {err}"


def test_llama3_rope_scaling_is_read(tmp_path):
  hf_models.save_random_model("llama", tmp_path)
  cfg = hf_io.read_hf_config(tmp_path)
  assert cfg.rope_scaling == Llama3RopeScaling(
      factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
      original_max_position_embeddings=32)
  assert not np.allclose(decoder.rope_inv_freq(cfg),
                         decoder.rope_inv_freq(cfg.replace(rope_scaling=None)))


def test_gemma2_sliding_window_matters(tmp_path):
  """Past the window the sliding layers must see fewer keys than full ones."""
  hf_models.save_random_model("gemma2", tmp_path)
  cfg, params = hf_io.load_hf_dir(tmp_path)
  tokens = jnp.asarray(np.random.RandomState(3).randint(0, 128, (1, 24)))
  a, _ = decoder.forward(params, cfg, tokens)
  b, _ = decoder.forward(params, cfg.replace(sliding_window=None), tokens)
  assert np.abs(np.asarray(a - b))[0, :8].max() < 1e-5
  assert np.abs(np.asarray(a - b))[0, 8:].max() > 1e-3


def test_kv_cache_matches_full_forward():
  """Two calls on the page pool (rows in pages out of order, of different
  lengths, the second call's tokens crossing into a new page) give the
  logits of one forward pass, with sliding windows and soft-caps."""
  cfg = presets.get_preset("tiny").replace(
      family="gemma2", sliding_window=4,
      layer_types=("sliding_attention", "full_attention"),
      attn_logit_softcap=5.0, final_logit_softcap=3.0)
  params = decoder.init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 11), 0, cfg.vocab_size)
  full, _ = testutil.forward(params, cfg, tokens)
  cache = paged.init(cfg, pages=6, page_size=4)
  table = jnp.asarray([[3, 1, 5], [2, 4, 0]], jnp.int32)
  a, cache = testutil.forward(params, cfg, tokens[:, :7], cache=cache,
                              rows=paged.Rows(table[:, :2], jnp.zeros(2, int)))
  b, cache = testutil.forward(params, cfg, tokens[:, 7:], cache=cache,
                              rows=paged.Rows(table, jnp.full(2, 7)))
  np.testing.assert_allclose(np.concatenate([a, b], 1), full, atol=1e-5)
  # Row 1's slots 8..10 went to page 0, its third.
  assert np.abs(np.asarray(cache["k"][0][:, 0, :3])).min() > 0


def test_query_blocks_match_one_block_with_gradients():
  """Causal query blocks (T = 13 in blocks of 4, 4, 4, 1) give the values
  and gradients of one block, with padding and sliding windows."""
  cfg = presets.get_preset("tiny").replace(
      family="gemma2", sliding_window=4,
      layer_types=("sliding_attention", "full_attention"),
      attn_logit_softcap=5.0, final_logit_softcap=3.0, remat="dots")
  params = decoder.init_params(cfg, jax.random.key(0))
  tokens, mask, pos = _padded_batch(np.random.RandomState(0), cfg.vocab_size,
                                    [13, 9], 13, left=True)
  w = jax.random.normal(jax.random.key(2), (2, 13, cfg.vocab_size))

  def loss(p, c):
    logits, _ = decoder.forward(p, c, jnp.asarray(tokens), jnp.asarray(pos),
                                jnp.asarray(mask))
    return jnp.sum(jnp.where(mask[..., None], logits * w, 0.0)), logits

  grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (_, one), g_one = grad(params, cfg.replace(attn_query_block=0))
  (_, blk), g_blk = grad(params, cfg.replace(attn_query_block=4))
  np.testing.assert_allclose(np.asarray(blk)[mask], np.asarray(one)[mask],
                             atol=1e-5)
  for a, b in zip(jax.tree.leaves(g_blk), jax.tree.leaves(g_one)):
    # Sums in another order: compare as vectors (float32 round-off).
    assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b) + 1e-7


def test_export_is_loadable_by_transformers(tmp_path):
  cfg = presets.get_preset("tiny").replace(family="gemma2", layer_types=(
      "sliding_attention", "full_attention"), sliding_window=4,
      final_logit_softcap=3.0, attn_logit_softcap=5.0,
      query_pre_attn_scalar=16)
  params = decoder.init_params(cfg, jax.random.key(2))
  hf_io.export_hf_dir(params, cfg, tmp_path)
  import transformers  # pylint: disable=g-import-not-at-top
  model = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path, dtype=torch.float32, attn_implementation="eager")
  tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 10))
  with torch.no_grad():
    ref = model(torch.tensor(tokens)).logits.numpy()
  ours, _ = decoder.forward(params, cfg, jnp.asarray(tokens))
  assert np.abs(np.asarray(ours) - ref).max() < 5e-3


def test_smollm2_gguf_matches_transformers(smollm2, tmp_path):
  import transformers  # pylint: disable=g-import-not-at-top
  _, cfg, params = smollm2
  assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == (30, 9, 3)
  hf_io.export_hf_dir(params, cfg, tmp_path)
  model = transformers.LlamaForCausalLM.from_pretrained(
      tmp_path, dtype=torch.float32, attn_implementation="eager")
  tokens, mask, pos = _padded_batch(np.random.RandomState(0), cfg.vocab_size,
                                    [16, 9], 16, left=True)
  ref = testutil.hf_logits(model, tokens, mask, pos)
  ours, _ = decoder.forward(params, cfg, jnp.asarray(tokens),
                            jnp.asarray(pos), jnp.asarray(mask))
  assert np.abs(np.asarray(ours) - ref)[mask].max() < 1e-3


def test_unpermute_qk_inverts_llama_cpp_permutation():
  w = np.arange(4 * 2 * 4 * 3, dtype=np.float32).reshape(4 * 2 * 4, 3)
  n_head = 4
  # llama.cpp's convert script: reshape(n_head, 2, dim/n_head/2, ...) swap.
  permuted = (w.reshape(n_head, 2, w.shape[0] // n_head // 2, 3)
              .swapaxes(1, 2).reshape(w.shape))
  np.testing.assert_array_equal(gguf_io.unpermute_qk(permuted, n_head), w)


# ------------------------------------------------------------------ bad input


def test_missing_config(tmp_path):
  with pytest.raises(hf_io.CheckpointError, match="config.json: file is"):
    hf_io.load_hf_dir(tmp_path)


def test_unsupported_model_type(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
  with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
    hf_io.load_hf_dir(tmp_path)


def test_missing_field(tmp_path):
  hf_models.save_random_model("llama", tmp_path)
  hf = json.loads((tmp_path / "config.json").read_text())
  del hf["hidden_size"]
  (tmp_path / "config.json").write_text(json.dumps(hf))
  with pytest.raises(ValueError, match="missing field 'hidden_size'"):
    hf_io.load_hf_dir(tmp_path)


def test_truncated_safetensors(tmp_path):
  hf_models.save_random_model("llama", tmp_path)
  f = tmp_path / "model.safetensors"
  f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
  with pytest.raises(hf_io.CheckpointError, match="model.safetensors"):
    hf_io.load_hf_dir(tmp_path)


def test_missing_shard(tmp_path):
  hf_models.save_random_model("qwen2", tmp_path / "src")
  cfg, params = hf_io.load_hf_dir(tmp_path / "src")
  out = tmp_path / "out"
  hf_io.export_hf_dir(params, cfg, out, max_shard_bytes=50_000)
  next(out.glob("model-00002-*.safetensors")).unlink()
  with pytest.raises(hf_io.CheckpointError, match="model-00002.*missing"):
    hf_io.load_hf_dir(out)


def test_mismatched_shapes(tmp_path):
  hf_models.save_random_model("llama", tmp_path)
  hf = json.loads((tmp_path / "config.json").read_text())
  hf["intermediate_size"] = 80
  (tmp_path / "config.json").write_text(json.dumps(hf))
  with pytest.raises(hf_io.CheckpointError, match="mlp/gate has shape"):
    hf_io.load_hf_dir(tmp_path)


def test_gguf_errors(tmp_path):
  with pytest.raises(hf_io.CheckpointError, match="nope.gguf: file is missing"):
    gguf_io.load_gguf(tmp_path / "nope.gguf")
  (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
  with pytest.raises(hf_io.CheckpointError, match="junk.gguf: not a readable"):
    gguf_io.load_gguf(tmp_path / "junk.gguf")


def test_gguf_of_another_architecture(tmp_path):
  import gguf  # pylint: disable=g-import-not-at-top
  path = tmp_path / "other.gguf"
  w = gguf.GGUFWriter(str(path), "gpt2")
  w.add_block_count(1)
  w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(hf_io.CheckpointError,
                     match="'general.architecture' is 'gpt2'"):
    gguf_io.load_gguf(path)


# Parameters of each preset, computed once with transformers:
# AutoModelForCausalLM.from_config(to_hf_config(cfg)) on torch's meta device,
# sum of p.numel() (tied embeddings once); equal to ours for every preset.
_PRESET_PARAMS = dict(
    tiny=90_432, mini=1_016_960, smollm2_135m=134_515_008,
    qwen2_5_0_5b=494_032_768, qwen2_5_7b=7_615_616_512,
    llama3_2_1b=1_235_814_400, qwen3_0_6b=596_049_920,
    qwen3_1_7b=1_720_574_976, qwen3_4b=4_022_468_096,
    qwen3_8b=8_190_735_360, gemma2_2b=2_614_341_888,
    gemma2_9b=9_241_705_984, gemma2_27b=27_227_128_320)


def test_presets_build():
  counts = {}
  for name in presets.PRESETS:
    shapes = decoder.abstract_params(presets.get_preset(name))
    counts[name] = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  assert counts == _PRESET_PARAMS
  with pytest.raises(ValueError, match="valid:"):
    presets.get_preset("gpt5")
  assert presets.get_preset("gemma2_2b").sliding_layers[:2] == (True, False)


def test_hf_config_round_trip():
  for name in ("llama3_2_1b", "gemma2_27b", "qwen2_5_7b", "qwen3_0_6b",
               "qwen3_8b"):
    cfg = presets.get_preset(name)
    assert from_hf_config(to_hf_config(cfg)) == cfg


def test_qwen3_presets_match_published_parameter_counts():
  # Qwen3-0.6B: 596,049,920; Qwen3-1.7B: 1,720,574,976 (its safetensors
  # header). Tied embeddings: one vocab x hidden matrix.
  for name, want in (("qwen3_0_6b", 596_049_920),
                     ("qwen3_1_7b", 1_720_574_976)):
    shapes = decoder.abstract_params(presets.get_preset(name))
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)) == want


def test_model_config_is_hashable_and_a_jit_static_argument():
  """Dicts and lists (from JSON or `--config.` overrides) become hashable
  values; equal configs hash equal, so jit reuses its program."""
  a = ModelConfig(rope_scaling=dict(
      factor=8, low_freq_factor=1, high_freq_factor=4,
      original_max_position_embeddings=32.0), eos_token_id=[3, 5],
      layer_types=["full_attention"] * 2)
  b = a.replace(rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 32),
                eos_token_id=(3, 5), layer_types=("full_attention",) * 2)
  assert a == b and hash(a) == hash(b)
  assert type(a.rope_scaling.original_max_position_embeddings) is int
  for name in presets.PRESETS:
    hash(presets.get_preset(name))
  traces = []

  def scaled(x, cfg):
    traces.append(cfg)
    return x * cfg.rope_scaling.factor

  f = jax.jit(scaled, static_argnums=1)
  assert float(f(jnp.ones(()), a)) == 8.0
  assert float(f(jnp.ones(()), b)) == 8.0
  assert len(traces) == 1


_MESH_SCRIPT = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import sys, jax, numpy as np
    jax.config.update("jax_default_matmul_precision", "highest")
    sys.path.insert(0, sys.argv[2])
    import hf_models
    from swirl_jax import sharding as shd
    from swirl_jax.models import decoder, hf_io
    path = sys.argv[1]
    cfg, single = hf_io.load_hf_dir(path)
    mesh = shd.make_mesh([("data", 1), ("fsdp", 4), ("tensor", 2)])
    cfg, params = hf_io.load_hf_dir(path, mesh=mesh)
    q = params["layers"]["attn"]["q"]
    assert q.sharding.spec == jax.sharding.PartitionSpec(
        None, "fsdp", "tensor", None), q.sharding.spec
    assert params["layers"]["mlp"]["down"].sharding.spec[1:] == (
        "tensor", "fsdp")
    # Each device holds a quarter x half of q, not a full copy.
    shard = q.addressable_shards[0].data
    assert shard.shape == (q.shape[0], q.shape[1] // 4, q.shape[2] // 2,
                           q.shape[3]), shard.shape
    tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (8, 12))
    ref, _ = decoder.forward(single, cfg, tokens)
    with shd.use_mesh(mesh):
      toks = jax.device_put(tokens, shd.data_sharding(mesh, 2))
      out = jax.jit(lambda p, t: decoder.forward(p, cfg, t)[0])(params,
                                                              toks)
    err = float(np.abs(np.asarray(out) - np.asarray(ref)).max())
    assert err < 1e-4, err
    print("OK", err)
""")


def test_sharded_forward_on_fake_mesh(tmp_path):
  hf_models.save_random_model("qwen2", tmp_path, num_attention_heads=4,
                              num_key_value_heads=2)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  out = subprocess.run(
      [sys.executable, "-c", _MESH_SCRIPT, str(tmp_path),
       os.path.dirname(__file__)], capture_output=True, text=True, env=env,
      timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "OK" in out.stdout
