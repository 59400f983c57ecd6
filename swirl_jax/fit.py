r"""The `fit` job: will a config's train step and sampler fit a chip's HBM?

  python -m swirl_jax.main --config=configs/simpletir_math.py \
      --workdir=/tmp/fit --config.job=fit --config.fit.chip=v5p \
      --config.fit.devices=4

Compiles, for `fit.devices` fake CPU devices laid out as the config's mesh,
the train step (the config's training block, at its mini-batch and sequence
length) and the sampler's programs on one host's devices as the jobs lay
them out (`sampler.decode_layout`: data groups of tensor-parallel devices;
the rollout engine with `engine.slots` rows a group and a pool of
`engine.pages` pages and, where the config runs it (SWiRL stage 2),
`generate` with `sampler.max_rows` rows or else `fit.sampler_rows`; rows
of up to `sampler.max_cache_len` tokens), all from abstract inputs
(`jax.ShapeDtypeStruct`s with shardings): no weights are allocated. Prints
per-device memory from `compiled.memory_analysis()` (arguments,
temporaries, peak) against the chip's HBM (swirl_jax/chips.py), the verdict
(peak <= `fit.hbm_fraction` of HBM), the knob to turn when it does not
fit, the capacity (rows in flight a data group holds within that limit,
and the K/V they hold, for a length distribution: `fit.rollouts` or
`fit.mean_live_fraction` of the cache; pages against contiguous slots of
the full length, `fit_programs.capacity`), and last one JSON line. The
sampler's figure adds the train state, which stays on the devices while
rollouts run. Every training job runs the same measurement against its
real devices before it loads weights (`fit_programs.check_devices`, from
swirl_jax/jobs.py).

XLA:CPU's buffer assignment stands in for the accelerator's, so treat the
figures as estimates: XLA:CPU writes a bf16 page pool (a scatter) by
converting it to f32 and back, so the sampler programs' temporaries count
up to about twice the pool more than a GPU's or TPU's, which write it in
place. `fit.num_layers_override` = n compiles stand-ins of n
and n + 1 layers of the same width and extrapolates each figure linearly
to the real depth (scanned layers make memory linear in depth); 0 compiles
the real depth. The fake device count must be set before jax starts, so
the job runs itself in a child process. Nothing it compiles runs, so it
compiles at XLA's lowest backend optimisation level
(`fit_programs._compile`).
"""

import json
import os
import subprocess
import sys

import ml_collections

from swirl_jax import chips, fit_programs

_CHILD_ENV = "SWIRL_JAX_FIT_CHILD"
_BACKEND = {"v4": "tpu", "v5e": "tpu", "v5p": "tpu", "v6e": "tpu",
            "a100": "gpu", "h100": "gpu", "h200": "gpu"}


default_config = fit_programs.default_config


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


def measure(config) -> dict:
  """Compiles and measures (in a process whose devices are the fake ones)."""
  f = config.fit
  chip = chips.get(f.chip)
  setup, figs = fit_programs.measure(
      config, _BACKEND[f.chip], min(chip.host_chips, int(f.devices)))
  train_peak, sampler_peak = fit_programs.peaks(figs)
  limit = float(f.hbm_fraction) * chip.hbm_gib
  n = int(f.num_layers_override)
  n = n if n < setup.model_cfg.num_layers else 0  # Else: the real depth.
  lengths, source = fit_programs.live_lengths(config, setup.cache_len)
  cap = fit_programs.capacity(setup, figs, limit, lengths,
                              *fit_programs.prompt_groups(config))
  return dict(job="fit", chip=chip.name, devices=int(f.devices),
              capacity=dict(cap, lengths=source),
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
  gen = f"generate {r['sampler_rows']} rows, " if r["sampler_rows"] else ""
  print(f"  train: {r['train_rows']} x {r['seq_len']} tokens, "
        f"{r['micro_batches']} micro-batches; sampler on a host's "
        f"{r['data_parallel']} data group(s) x {r['tensor_parallel']} "
        f"device(s): {gen}engine {r['engine_slots']} rows a group, of up "
        f"to {r['cache_len']} tokens; decode attention "
        f"{r['paged_attention_impl']}")
  if r["stand_in_layers"]:
    print(f"  extrapolated from {r['stand_in_layers']}-layer stand-ins to "
          f"{r['num_layers']} layers")
  print(f"  {'program':<14}{'args GiB':>10}{'temp GiB':>10}"
        f"{'peak GiB':>10}")
  for name in ("train",) + fit_programs.SAMPLER_PROGRAMS:
    if name not in figs:
      continue
    m = figs[name]
    print(f"  {name:<14}{m['args']:>10.2f}{m['temp']:>10.2f}"
          f"{m['peak']:>10.2f}")
  print(f"  train state resident while sampling: "
        f"{figs['state']['args']:.2f} GiB")
  verdict = "fits" if r["fits"] else "does NOT fit"
  print(f"  train peak {r['train_peak_gib']} GiB, sampler peak (with the "
        f"state) {r['sampler_peak_gib']} GiB: {verdict}")
  for knob in r["knobs"]:
    print(f"  knob: {knob}")
  c = r["capacity"]
  print(f"  capacity a data group, {c['lengths']}: {c['free_gib']} GiB a "
        f"device for rows, {c['kv_bytes_per_token']} bytes of K/V a token "
        f"a device")
  for name, what in (("slots", f"contiguous slots ({r['cache_len'] + 1} a "
                               "row)"),
                     ("pages", f"pages ({c['mean_pages']} of "
                               f"{c['page_size']} a row)")):
    print(f"    {what}: {c[name]['rows']} rows in flight, "
          f"{c[name]['kv_gib_group']} GiB of K/V a group")
  print(f"    pages hold {c['rows_ratio']}x the rows: engine.slots="
        f"{c['pages']['rows']}, engine.pages={c['pages']['pool_pages']}")
  s = c["shared"]
  print(f"    pages, each prompt's {s['prompt_pages']} full pages held once "
        f"by its group of {s['group']}: {s['rows']} rows in flight, "
        f"{s['kv_gib_group']} GiB of K/V a group")
  keys = ("job", "chip", "devices", "train_peak_gib", "sampler_peak_gib",
          "hbm_gib", "fits")
  line = {k: r[k] for k in keys}
  line.update(rows_slots=c["slots"]["rows"], rows_pages=c["pages"]["rows"],
              rows_ratio=c["rows_ratio"], rows_shared=c["shared"]["rows"])
  print(json.dumps(line), flush=True)


def _child_main(path: str) -> None:
  with open(path) as fh:
    config = ml_collections.ConfigDict(json.load(fh))
  print_report(measure(config))


if __name__ == "__main__":
  _child_main(sys.argv[1])
