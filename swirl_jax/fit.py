r"""The `fit` job: will a config's train step and sampler fit a chip's HBM?

  python -m swirl_jax.main --config=configs/simpletir_math.py \
      --workdir=/tmp/fit --config.job=fit --config.fit.chip=v5p \
      --config.fit.devices=4

Compiles, for `fit.devices` fake CPU devices laid out as the config's mesh,
the train step (the config's training block, at its mini-batch and sequence
length) and the sampler's prefill and decode (`fit.sampler_rows` rows over
the batch axes, `sampler.max_cache_len` slots), all from abstract inputs
(`jax.ShapeDtypeStruct`s with shardings): no weights are allocated. Prints
per-device memory from `compiled.memory_analysis()` (arguments,
temporaries, peak) against the chip's HBM (swirl_jax/chips.py), the verdict
(peak <= `fit.hbm_fraction` of HBM), the knob to turn when it does not
fit, and last one JSON line. The sampler's figure adds the train state,
which stays on the devices while rollouts run.

XLA:CPU's buffer assignment stands in for the accelerator's, so treat the
figures as estimates. `fit.num_layers_override` = n compiles stand-ins of n
and n + 1 layers of the same width and extrapolates each figure linearly
to the real depth (scanned layers make memory linear in depth); 0 compiles
the real depth. The fake device count must be set before jax starts, so
the job runs itself in a child process.
"""

import json
import os
import subprocess
import sys

import ml_collections

from swirl_jax import chips, fit_programs

GIB = 1 << 30
_CHILD_ENV = "SWIRL_JAX_FIT_CHILD"
_BACKEND = {"v4": "tpu", "v5e": "tpu", "v5p": "tpu", "v6e": "tpu",
            "a100": "gpu", "h100": "gpu", "h200": "gpu"}


def default_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      chip="h100", devices=8,
      num_layers_override=0,  # > 0: extrapolate from n and n + 1 layers.
      train_block="",  # '' = the first of train, rl_train, sft_train.
      train_rows=0,  # 0 = the block's mini_batch_size.
      seq_len=0,  # 0 = max_seq_len, stage2.max_len or the cache length.
      sampler_rows=64,  # rows of one generate call.
      prompt_len=1024, decode_steps=1024,
      # 'target': what the chip runs, compiled here as a stand-in of the
      # same memory: TPU splash, or for cuDNN's flash attention (GPUs) the
      # splash kernel too, both in Pallas' interpreter; Gemma 2 on a GPU
      # (soft-cap: no cuDNN) the block attention. Or any attention_impl.
      attention_impl="target",
      hbm_fraction=0.9))


def run(config, workdir: str) -> None:
  """The job: runs `measure` in a child process with the fake devices."""
  f = config.fit
  if os.environ.get(_CHILD_ENV):
    report = measure(config)
    print_report(report)
    return
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "fit_config.json")
  with open(path, "w") as fh:
    fh.write(config.to_json_best_effort())
  env = dict(os.environ, JAX_PLATFORMS="cpu", **{_CHILD_ENV: "1"})
  env["XLA_FLAGS"] = " ".join(filter(None, [
      env.get("XLA_FLAGS", ""),
      f"--xla_force_host_platform_device_count={int(f.devices)}"]))
  proc = subprocess.run([sys.executable, "-m", "swirl_jax.fit", path],
                        env=env, check=False)
  if proc.returncode:
    sys.exit(f"error: the fit job's child process failed "
             f"({proc.returncode})")


def _memory(compiled) -> dict:
  m = compiled.memory_analysis()
  # XLA:CPU's peak_memory_in_bytes leaves the temporaries out: add them up.
  peak = (m.argument_size_in_bytes + m.temp_size_in_bytes
          + m.output_size_in_bytes - m.alias_size_in_bytes)
  return dict(args=m.argument_size_in_bytes / GIB,
              temp=m.temp_size_in_bytes / GIB, peak=peak / GIB)


def _extrapolate(at_n: dict, at_n1: dict, n: int, depth: int) -> dict:
  return {k: at_n[k] + (depth - n) * (at_n1[k] - at_n[k]) for k in at_n}


def measure(config) -> dict:
  """Compiles and measures (in a process whose devices are the fake ones)."""
  f = config.fit
  chip = chips.get(f.chip)
  setup = fit_programs.Setup(config, _BACKEND[f.chip])
  depth, n = setup.model_cfg.num_layers, int(f.num_layers_override)
  if n > 0:
    at = [fit_programs.measure_all(setup, layers, _memory)
          for layers in (n, n + 1)]
    figs = {k: _extrapolate(at[0][k], at[1][k], n, depth) for k in at[0]}
  else:
    figs = fit_programs.measure_all(setup, depth, _memory)
  sampler = max(figs["prefill"]["peak"], figs["decode"]["peak"])
  sampler_peak = figs["state"]["args"] + sampler
  limit = float(f.hbm_fraction) * chip.hbm_gib
  train_peak = figs["train"]["peak"]
  return dict(job="fit", chip=chip.name, devices=int(f.devices),
              train_peak_gib=round(train_peak, 2),
              sampler_peak_gib=round(sampler_peak, 2),
              hbm_gib=chip.hbm_gib,
              fits=bool(train_peak <= limit and sampler_peak <= limit),
              limit_gib=round(limit, 2), figures=figs,
              stand_in_layers=[n, n + 1] if n > 0 else None,
              **setup.describe(), knobs=setup.knobs(train_peak > limit,
                                                    sampler_peak > limit))


def print_report(r: dict) -> None:
  figs = r["figures"]
  print(f"fit: {r['model']} ({r['params_b']}B params) on {r['devices']} x "
        f"{r['chip']} ({r['hbm_gib']} GiB HBM; limit {r['limit_gib']} GiB)")
  print(f"  mesh {r['mesh']}, remat {r['remat']}, dtype {r['dtype']}, "
        f"params {r['param_dtype']}, attention {r['attention_impl']}")
  print(f"  train: {r['train_rows']} x {r['seq_len']} tokens, "
        f"{r['micro_batches']} micro-batches; sampler: {r['sampler_rows']} "
        f"rows x {r['cache_len']} slots")
  if r["stand_in_layers"]:
    print(f"  extrapolated from {r['stand_in_layers']}-layer stand-ins to "
          f"{r['num_layers']} layers")
  print(f"  {'program':<10}{'args GiB':>10}{'temp GiB':>10}{'peak GiB':>10}")
  for name in ("train", "prefill", "decode"):
    m = figs[name]
    print(f"  {name:<10}{m['args']:>10.2f}{m['temp']:>10.2f}"
          f"{m['peak']:>10.2f}")
  print(f"  train state resident while sampling: "
        f"{figs['state']['args']:.2f} GiB")
  verdict = "fits" if r["fits"] else "does NOT fit"
  print(f"  train peak {r['train_peak_gib']} GiB, sampler peak (with the "
        f"state) {r['sampler_peak_gib']} GiB: {verdict}")
  for knob in r["knobs"]:
    print(f"  knob: {knob}")
  keys = ("job", "chip", "devices", "train_peak_gib", "sampler_peak_gib",
          "hbm_gib", "fits")
  print(json.dumps({k: r[k] for k in keys}), flush=True)


def _child_main(path: str) -> None:
  with open(path) as fh:
    config = ml_collections.ConfigDict(json.load(fh))
  print_report(measure(config))


if __name__ == "__main__":
  _child_main(sys.argv[1])
