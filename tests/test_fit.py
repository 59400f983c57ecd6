"""The `fit` job on shipped paper configs (2- and 3-layer stand-ins of the
real width, extrapolated to full depth), and the 'auto' defaults."""

import json
import os

import ml_collections
import pytest

from swirl_jax import config_lib, fit
from swirl_jax.training import defaults

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30


def run_fit(capfd, monkeypatch, tmp_path, config_file, arg, chip, devices,
            **model):
  monkeypatch.setenv("PYTHONPATH", REPO)
  monkeypatch.delenv("SWIRL_JAX_FIT_CHILD", raising=False)
  c = config_lib.load_config_module(
      os.path.join(REPO, "configs", config_file)).get_config(arg)
  c.model.update(model)
  c.fit = fit.default_config()
  c.fit.update(chip=chip, devices=devices, num_layers_override=2)
  fit.run(c, str(tmp_path))
  out = capfd.readouterr().out
  return json.loads(out.strip().splitlines()[-1]), out


def test_simpletir_7b_fits_8_h100(capfd, monkeypatch, tmp_path):
  r, out = run_fit(capfd, monkeypatch, tmp_path, "simpletir_math.py",
                   "model=qwen2_5_7b", "h100", 8, remat="full")
  assert r["job"] == "fit" and r["chip"] == "h100" and r["devices"] == 8
  # Params + AdamW moments in fp32 (16 bytes a param) over 8 devices: the
  # state alone is 7.62e9 * 16 / 8 bytes = 14.2 GiB.
  assert 14 * 0.99 < r["train_peak_gib"]
  assert r["fits"], out
  assert r["train_peak_gib"] <= 0.9 * r["hbm_gib"]
  assert "fsdp': 8" in out


def test_simpletir_7b_does_not_fit_4_v5e(capfd, monkeypatch, tmp_path):
  """The fp32 state alone, 7.62e9 * 16 / 4 bytes = 28 GiB per chip, is
  more than a v5e's 16 GiB."""
  r, out = run_fit(capfd, monkeypatch, tmp_path, "simpletir_math.py",
                   "model=qwen2_5_7b", "v5e", 4, remat="full")
  assert not r["fits"] and r["train_peak_gib"] > 28
  assert "knob: model.param_dtype='bfloat16'" in out


def test_swirl_gsm8k_7b_fits_8_h100(capfd, monkeypatch, tmp_path):
  r, out = run_fit(capfd, monkeypatch, tmp_path, "swirl_gsm8k.py",
                   "model=qwen2_5_7b", "h100", 8, remat="full")
  assert r["fits"], out


def test_auto_mesh_and_model_block():
  assert defaults.resolve_mesh("auto", 7e9) == [
      ("data", 1), ("fsdp", -1), ("tensor", 1)]
  assert defaults.resolve_mesh("auto", 1.35e8)[0] == ("data", -1)
  assert defaults.resolve_mesh("[('fsdp', 2), ('tensor', 4)]", 0) == [
      ("fsdp", 2), ("tensor", 4)]
  with pytest.raises(ValueError, match="train.mesh"):
    defaults.resolve_mesh("fsdp", 0)
  m = ml_collections.ConfigDict(dict(preset="qwen2_5_7b", dtype="auto",
                                     param_dtype="auto", remat="auto"))
  defaults.resolve_model_block(m, defaults.preset_params(m), "tpu")
  assert (m.dtype, m.param_dtype, m.remat) == ("bfloat16", "float32", "full")
  m = ml_collections.ConfigDict(dict(preset="smollm2_135m", dtype="auto",
                                     param_dtype="bfloat16", remat="auto"))
  defaults.resolve_model_block(m, defaults.preset_params(m), "cpu")
  assert (m.dtype, m.param_dtype, m.remat) == ("float32", "bfloat16", "none")


def test_micro_batches_from_token_budget():
  c = ml_collections.ConfigDict(dict(micro_batches=0,
                                     tokens_per_device=8192))
  # 128 rows over 8 shards: 16 per device; 16384 tokens a row: 1 per micro.
  assert defaults.micro_batches_for(c, 128, 16384, 8) == 16
  assert defaults.micro_batches_for(c, 128, 1024, 8) == 2
  assert defaults.micro_batches_for(c, 6, 4096, 2) == 3  # Any row count.
  assert defaults.micro_batches_for(c, 4, 16, 1) == 1
  c.micro_batches = 4
  assert defaults.micro_batches_for(c, 128, 16384, 8) == 4
