r"""The README's memory-fit table: the `fit` job over the paper configs.

Runs `python -m swirl_jax.main --config=<config> --config.job=fit` for each
(config, model, chip, devices) row below, in a child process each (the fit
job re-runs itself on that many fake CPU devices), with 2- and 3-layer
stand-ins of the real width extrapolated to full depth. Prints a Markdown
table, then one JSON line with every row's figures. Rows in flight: what a
data group holds, contiguous slots against pages, for rows of a quarter
of the cache length (the fit job's capacity lines).

  python benchmarks/fit_table.py [--rows=N,...] [--remat=full]

Figures are XLA:CPU's buffer assignment for the target's programs: treat
them as estimates of what the accelerator's compiler allocates.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent

# (config file, model preset, chip, devices): each paper config on the
# targets its docstring and the README name.
ROWS = (
    ("simpletir_math.py", "qwen2_5_7b", "h100", 8),
    ("simpletir_math.py", "qwen2_5_7b", "v5p", 8),
    ("simpletir_math.py", "qwen3_8b", "h200", 8),
    ("simpletir_math.py", "llama3_2_1b", "h100", 8),
    ("swirl_gsm8k.py", "gemma2_9b", "h100", 8),
    ("swirl_gsm8k.py", "gemma2_27b", "h200", 8),
    ("swirl_gsm8k.py", "gemma2_27b", "v5p", 16),
    ("swirl_gsm8k.py", "qwen3_8b", "v5p", 8),
)


def fit_row(config: str, model: str, chip: str, devices: int, remat: str,
            workdir: str) -> dict:
  cmd = [sys.executable, "-m", "swirl_jax.main",
         f"--config={REPO / 'configs' / config}:model={model}",
         "--config.job=fit", f"--config.fit.chip={chip}",
         f"--config.fit.devices={devices}",
         "--config.fit.num_layers_override=2", f"--workdir={workdir}"]
  if remat:
    cmd.append(f"--config.model.remat={remat}")
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                        check=False)
  lines = proc.stdout.strip().splitlines()
  if proc.returncode or not lines:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    raise SystemExit(f"fit failed for {config} {model} {chip}x{devices}: "
                     + " | ".join(tail))
  return dict(json.loads(lines[-1]), config=config, model=model)


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--rows", default="", help="indices into ROWS (default all)")
  p.add_argument("--remat", default="", help="override model.remat")
  a = p.parse_args()
  rows = ([ROWS[int(i)] for i in a.rows.split(",")] if a.rows else ROWS)
  out = []
  print("| config | model | target | train peak GiB | sampler peak GiB "
        "| HBM GiB | fits (<= 90%) | rows in flight a group: slots, pages |")
  print("|---|---|---|---|---|---|---|---|")
  for config, model, chip, devices in rows:
    with tempfile.TemporaryDirectory() as tmp:
      r = fit_row(config, model, chip, devices, a.remat, tmp)
    out.append(r)
    print(f"| `{config}` | `{model}` | {devices} x {chip} | "
          f"{r['train_peak_gib']} | {r['sampler_peak_gib']} | {r['hbm_gib']} "
          f"| {'yes' if r['fits'] else 'no'} | {r['rows_slots']}, "
          f"{r['rows_pages']} ({r['rows_ratio']}x) |", flush=True)
  print(json.dumps({"benchmark": "fit_table", "rows": out}))


if __name__ == "__main__":
  main()
