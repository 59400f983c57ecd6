r"""Compile time of the decode program by its rows: the page pool's, whose
rows are arrays (one program for any), against the slot cache's, which
unrolled a slice and an update a row.

For each of --rows: a device whose decode batch is that many rows, on the
--preset shape, and its decode chunk (`Device.lowerable(rows, ())`:
abstract params and cache, the engine's 8 steps, rows reading the whole
context of `SamplerConfig().max_cache_len`), lowered and compiled; the
seconds to compile and the HLO text's size. Every measurement runs in a
fresh interpreter importing one checkout: this one, and with --before
that one (the slot cache), in alternation. Nothing runs on the program,
so the figures are compile times alone. Prints a line per measurement,
then one JSON line: seconds by rows for each side, and each side's ratio
of its most rows to its fewest.

  python benchmarks/decode_compile.py [--before=OLDER_CHECKOUT]
      [--preset=smollm2_135m] [--rows=8,16,32,64,128]
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Only the API both checkouts share: Sampler, its device, `lowerable`.
_MEASURE = textwrap.dedent("""
    import json, sys, time
    import jax
    from swirl_jax.models import presets
    from swirl_jax.sampling.sampler import Sampler, SamplerConfig
    preset, rows = sys.argv[1], int(sys.argv[2])
    cfg = presets.get_preset(preset)
    s = Sampler(None, cfg, config=SamplerConfig(),
                token_bytes=[b""] * cfg.vocab_size)
    program = s.device(rows, 8, 64).lowerable(rows, ())["decode"]
    t = time.perf_counter()
    lowered = program.lower()
    lower_s = time.perf_counter() - t
    t = time.perf_counter()
    lowered.compile()
    print(json.dumps(dict(compile_s=time.perf_counter() - t,
                          lower_s=lower_s,
                          hlo_chars=len(lowered.as_text()))))
""")


def measure(checkout: str, preset: str, rows: int) -> dict:
  env = dict(os.environ, PYTHONPATH=checkout, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, "-c", _MEASURE, preset, str(rows)],
                        cwd=checkout, env=env, capture_output=True,
                        text=True, timeout=3600)
  if proc.returncode:
    raise RuntimeError(f"{checkout}, {rows} rows:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--before", default="", help="a checkout with the slot "
                 "cache (e.g. a worktree of an older commit); '' measures "
                 "this one alone")
  p.add_argument("--preset", default="smollm2_135m")
  p.add_argument("--rows", default="8,16,32,64,128")
  a = p.parse_args()
  counts = [int(x) for x in a.rows.split(",") if x]
  sides = {"pages": str(ROOT)}
  if a.before:
    sides["slots"] = a.before
  got = {name: {} for name in sides}
  for rows in counts:
    for name, checkout in sides.items():
      m = measure(checkout, a.preset, rows)
      got[name][rows] = m
      print(f"{name}: {rows} rows compile in {m['compile_s']:.2f} s "
            f"(HLO {m['hlo_chars']} chars)", flush=True)
  res = dict(benchmark="decode_compile", preset=a.preset, rows=counts)
  for name, by in got.items():
    res[f"{name}_compile_s"] = {r: round(m["compile_s"], 3)
                                for r, m in by.items()}
    res[f"{name}_hlo_chars"] = {r: m["hlo_chars"] for r, m in by.items()}
    res[f"{name}_most_vs_fewest"] = round(
        by[counts[-1]]["compile_s"] / by[counts[0]]["compile_s"], 2)
  print(json.dumps(res))


if __name__ == "__main__":
  main()
