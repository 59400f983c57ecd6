"""The `fit` job on shipped paper configs (2- and 3-layer stand-ins of the
real width, extrapolated to full depth), and the 'auto' defaults."""

import json
import logging
import os

import ml_collections
import pytest

from swirl_jax import config_lib, fit, fit_programs, jobs
from swirl_jax.training import defaults, trainer

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
  """The paper config fits, and its pages hold >= 3x the rows in flight
  of contiguous slots when rows hold a quarter of the cache on average
  (the fit job's default length distribution)."""
  r, out = run_fit(capfd, monkeypatch, tmp_path, "simpletir_math.py",
                   "model=qwen2_5_7b", "h100", 8, remat="full")
  assert r["job"] == "fit" and r["chip"] == "h100" and r["devices"] == 8
  # Params + AdamW moments in fp32 (16 bytes a param) over 8 devices: the
  # state alone is 7.62e9 * 16 / 8 bytes = 14.2 GiB.
  assert 14 * 0.99 < r["train_peak_gib"]
  assert r["fits"], out
  assert r["train_peak_gib"] <= 0.9 * r["hbm_gib"]
  assert "fsdp': 8" in out
  # Rows of 18,432 / 4 = 4,608 tokens: 72 pages of 64 against 18,433
  # slots a row, so nearly 4x as many rows; at least 3x.
  assert r["rows_ratio"] >= 3 and r["rows_pages"] >= 3 * r["rows_slots"]
  assert r["rows_slots"] > 0, out
  assert "rows of 4608 tokens (0.25 of the cache)" in out
  # A group's 16 rows share their 1,024-token prompt's 16 pages: 57 pages
  # a row, not 72.
  assert r["rows_shared"] > 1.2 * r["rows_pages"], out
  assert "16.0 full pages held once by its group of 16" in out


def test_simpletir_7b_does_not_fit_4_v5e(capfd, monkeypatch, tmp_path):
  """The fp32 state alone, 7.62e9 * 16 / 4 bytes = 28 GiB per chip, is
  more than a v5e's 16 GiB."""
  r, out = run_fit(capfd, monkeypatch, tmp_path, "simpletir_math.py",
                   "model=qwen2_5_7b", "v5e", 4, remat="full")
  assert not r["fits"] and r["train_peak_gib"] > 28
  assert "knob: model.param_dtype='bfloat16'" in out


def test_swirl_gsm8k_27b_fits_8_h200(capfd, monkeypatch, tmp_path):
  """The paper's model: Gemma 2 27B decodes over all 8 devices (16 KV
  heads split 8 ways), each holding an eighth of the bf16 weights (54.5 GB
  / 8 = 6.3 GiB) beside its fp32 state shard (27.2e9 * 12 / 8 bytes = 38
  GiB)."""
  r, out = run_fit(capfd, monkeypatch, tmp_path, "swirl_gsm8k.py",
                   "model=gemma2_27b", "h200", 8)
  assert r["fits"], out
  assert "1 data group(s) x 8 device(s)" in out
  assert 38 * 0.99 < r["sampler_peak_gib"] <= 0.9 * r["hbm_gib"]


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


# ------------------------------------------------------ the pre-run check

JOB_CALLS = []


def _record_job(config, workdir):
  JOB_CALLS.append(workdir)


def tiny_job_config() -> ml_collections.ConfigDict:
  """A SimpleTIR-shaped job config of the tiny model."""
  c = ml_collections.ConfigDict()
  c.model = config_lib.model_config("tiny")
  c.train = trainer.default_config()
  c.train.mini_batch_size = 4
  c.max_seq_len = 32
  c.sampler = dict(max_cache_len=64)
  c.fit = fit.default_config()
  c.fit.update(sampler_rows=4, prompt_len=16, decode_steps=4)
  return c


@pytest.fixture
def recorded_job(monkeypatch):
  JOB_CALLS.clear()
  monkeypatch.delenv("SWIRL_JAX_SKIP_FIT_CHECK", raising=False)
  monkeypatch.setitem(jobs.JOBS, "simpletir_train", "test_fit:_record_job")
  return jobs.get("simpletir_train")


def test_training_job_fails_early_when_it_does_not_fit(recorded_job,
                                                        monkeypatch):
  monkeypatch.setattr(fit_programs, "device_memory_limit", lambda: 1 << 20)
  with pytest.raises(SystemExit) as e:
    recorded_job(tiny_job_config(), "workdir")
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith("error: train does not fit "), msg
  assert "(0.0009766 GiB a device): train peak" in msg
  assert "knob: fit.devices up" in msg and "SWIRL_JAX_SKIP_FIT_CHECK" in msg
  assert not JOB_CALLS  # Nothing ran: no weights were loaded.
  # Skipped on request: the job runs.
  monkeypatch.setenv("SWIRL_JAX_SKIP_FIT_CHECK", "1")
  recorded_job(tiny_job_config(), "workdir")
  assert JOB_CALLS == ["workdir"]


def test_training_job_runs_when_it_fits(recorded_job, monkeypatch, caplog):
  monkeypatch.setattr(fit_programs, "device_memory_limit", lambda: 1 << 36)
  with caplog.at_level(logging.INFO):
    recorded_job(tiny_job_config(), "workdir")
  assert JOB_CALLS == ["workdir"]
  line = next(r.getMessage() for r in caplog.records
              if r.getMessage().startswith("fit check train"))
  train = float(line.split("train peak ")[1].split()[0])
  assert 0 < train < 0.1, line  # Tiny: its state is well under 1 MiB.


def test_fit_check_is_skipped_without_a_device_limit(recorded_job,
                                                     monkeypatch, caplog):
  """A CPU reports no limit: no program is compiled, one log line."""
  def fail(*args):
    raise AssertionError("measured without a limit")
  monkeypatch.setattr(fit_programs, "measure", fail)
  with caplog.at_level(logging.INFO):
    recorded_job(tiny_job_config(), "workdir")
  assert JOB_CALLS == ["workdir"]
  assert any("fit check skipped: the cpu devices report no memory limit"
             in r.getMessage() for r in caplog.records)
  assert jobs.get("simpletir_eval") is not None  # Not a training job.


def test_fit_lowers_the_programs_the_config_runs():
  """The page pool's programs, from the configs' own dataclasses: a
  longer cache (sampler.max_cache_len), more engine slots or a larger
  pool (engine.pages) moves the engine's figures; `generate`'s appear
  where SWiRL's stage 2 runs."""
  def figures(stage2=False, **blocks):
    c = tiny_job_config()
    c.engine = dict(slots=4, decode_batch=2, chunk_steps=4, append_tokens=16)
    for name, fields in blocks.items():
      c[name].update(fields)
    if stage2:
      c.stage2 = dict(max_len=32)
    return fit_programs.measure(c, "cpu", 1)[1]

  base = figures()
  assert "prefill" not in base and "decode" not in base
  longer = figures(sampler=dict(max_cache_len=256))
  more = figures(engine=dict(slots=8))
  pool = figures(engine=dict(pages=64))  # Base: 4 rows x 1 page of 64.
  for name in ("append", "decode_chunk"):
    assert longer[name]["args"] > base[name]["args"], name
    assert more[name]["args"] > base[name]["args"], name
    assert pool[name]["args"] > base[name]["args"], name
  # The pool is what moved: 64 pages against 4, the row tables alike.
  assert pool["kv"]["pool"] == pytest.approx(16 * base["kv"]["pool"])
  assert pool["kv"]["tables"] == base["kv"]["tables"]
  gen = figures(stage2=True)
  assert gen["prefill"]["peak"] > 0 and gen["decode"]["peak"] > 0
  # `generate` sizes its pool by its rows' prompt and budget (16 + 4
  # tokens: the first cache bucket), not by the cache length.
  gen = figures(stage2=True, sampler=dict(max_cache_len=256))
  roomy = figures(stage2=True, sampler=dict(max_cache_len=1024))
  assert roomy["decode"]["args"] == pytest.approx(gen["decode"]["args"])
  assert roomy["decode_chunk"]["args"] > gen["decode_chunk"]["args"]


def test_bf16_sampler_temporaries_are_the_float32_programs():
  """XLA:CPU's float32 copies of a bf16 decode's weights are left out: its
  temporaries are the float32 compile's, less than the bf16 compile's
  own; its arguments stay the bf16 program's."""
  c = tiny_job_config()
  c.model.dtype = "bfloat16"
  c.engine = dict(slots=4, decode_batch=2, chunk_steps=4, append_tokens=16)
  setup, figs = fit_programs.measure(c, "cpu", 1)
  cfg = setup.cfg_at(setup.model_cfg.num_layers)
  raw = fit_programs.measure_sampler(setup, cfg, fit_programs.memory)
  wide = fit_programs.measure_sampler(setup, cfg.replace(dtype="float32"),
                                      fit_programs.memory)
  for name in ("append", "decode_chunk"):
    assert figs[name]["temp"] == pytest.approx(wide[name]["temp"]), name
    assert figs[name]["temp"] < raw[name]["temp"], name
    assert figs[name]["args"] == pytest.approx(raw[name]["args"]), name
    assert figs[name]["peak"] == pytest.approx(
        raw[name]["peak"] - raw[name]["temp"] + wide[name]["temp"]), name


def test_capacity_counts_rows_of_slots_and_of_pages():
  """Rows in flight from the measured figures: what a limit leaves after
  the fixed part, over a row's K/V and table entry, slots against pages,
  from a rollouts file's contexts or a stated mean."""
  c = tiny_job_config()
  c.engine = dict(slots=4, decode_batch=2, chunk_steps=4, append_tokens=16)
  c.sampler = dict(max_cache_len=512)
  setup, figs = fit_programs.measure(c, "cpu", 1)
  kv = figs["kv"]
  cfg = setup.model_cfg
  # float32 K and V of every layer, all heads on the one device.
  assert kv["token_bytes"] == 2 * cfg.num_layers * cfg.num_kv_heads * \
      cfg.head_dim * 4
  assert kv["row_bytes"] == (cfg.vocab_size + 1) * 4  # Logits, stop state.
  fixed = figs["state"]["args"] + max(
      figs[k]["peak"] for k in ("append", "decode_chunk")) - kv["pool"] - \
      kv["tables"]
  limit = fixed + 0.01  # 10 MiB for rows.
  lengths = [100, 30, 200]  # 2, 1 and 4 pages of 64: 7 / 3 a row.
  cap = fit_programs.capacity(setup, figs, limit, lengths)
  free = 0.01 * GIB
  row = (setup.cache_len + 1) * kv["token_bytes"] + kv["row_bytes"]
  assert cap["slots"]["rows"] == int(free // row)
  row = 7 / 3 * 64 * kv["token_bytes"] + kv["row_bytes"]
  assert cap["pages"]["rows"] == int(free // row) > cap["slots"]["rows"]
  assert cap["mean_pages"] == pytest.approx(7 / 3, abs=0.01)
  # Groups of 4 rows sharing prompts of 2 full pages: 3 of 4 rows hold
  # none of theirs.
  shared = fit_programs.capacity(setup, figs, limit, lengths, 4, [130, 140])
  row = (7 / 3 - 2 * 3 / 4) * 64 * kv["token_bytes"] + kv["row_bytes"]
  assert shared["shared"]["rows"] == int(free // row) > cap["pages"]["rows"]
  assert fit_programs.prompt_groups(c) == (1, [c.fit.prompt_len])
  # A mean share of the cache, or a rollouts file's contexts.
  assert fit_programs.live_lengths(c, 1000) == (
      [250], "rows of 250 tokens (0.25 of the cache)")
