r"""Whether the CPU demos' results depend on the CPU they ran on.

Runs one seed of each demo (configs/demo.py: SWiRL; configs/
simpletir_demo.py: SimpleTIR) under each XLA:CPU instruction-set level
(`XLA_FLAGS=--xla_cpu_max_isa=...`; 'default' is the machine's best) and
each intra-op thread setting ('all': every CPU the process may use; '1':
the process pinned to one CPU, `os.sched_setaffinity`, so XLA:CPU sizes
its thread pools for one), each run in its own process and
workdir. Prints a line per run, then one JSON line: per setting, each
demo's base and trained held-out accuracy (SWiRL: greedy accuracy;
SimpleTIR: avg@4), the gain, the warm start's stopping step and copy
rate, and the wall time; and over the settings, the spread (max - min) of
each figure.

  python benchmarks/robustness.py --workdir=/tmp/robustness
  python benchmarks/robustness.py --workdir=/tmp/robustness \
      --isas=AVX2,default --threads=all --demos=simpletir

A rerun in the same workdir reads the runs that finished. About 5
minutes a run on 2 cores: the full grid (3 levels x 2 thread settings x
2 demos) about an hour.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

DEMOS = {  # name: (config, held-out metric, base / trained rows)
    "swirl": ("configs/demo.py", "accuracy", ("base", "rl")),
    "simpletir": ("configs/simpletir_demo.py", "avg@4", ("base", "trained")),
}
# XLA_FLAGS' `--xla_cpu_multi_thread_eigen=false
# intra_op_parallelism_threads=1` left a 2048 x 2048 matmul as fast as
# the default on 2 cores (jax 0.10.2: 0.097 s against 0.102 s), so not one
# thread; pinned to one CPU it took 0.170 s, and the process ran 13
# threads against 17.
THREADS = ("all", "1")


def _one_cpu():
  os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _results(demo: str, work: pathlib.Path) -> dict:
  """{policy: {metric: value}} of a finished demo run."""
  if demo == "swirl":
    return json.loads((work / "eval" / "results.json").read_text())
  return json.loads((work / "heldout.json").read_text())


def _warm_start(work: pathlib.Path) -> dict:
  path = work / "warmstart" / "criterion.json"
  if not path.exists():
    return {}
  last = json.loads(path.read_text())[-1]
  return dict(warm_steps=last["step"], copy_rate=last["copy_rate"],
              criterion_reached=last["reached"])


def run_one(demo: str, isa: str, threads: str, seed: int,
            work: pathlib.Path) -> dict:
  config, metric, (base, trained) = DEMOS[demo]
  if threads not in THREADS:
    raise ValueError(f"threads {threads!r}: one of {THREADS}")
  done = work / "robustness_run.json"
  if done.exists():
    return json.loads(done.read_text())
  env = dict(os.environ, XLA_FLAGS="" if isa == "default"
             else f"--xla_cpu_max_isa={isa}")
  t0 = time.time()
  proc = subprocess.run(
      [sys.executable, "-m", "swirl_jax.main", f"--config={config}:seed={seed}",
       f"--workdir={work}"], cwd=ROOT, env=env, capture_output=True,
      text=True, check=False,
      preexec_fn=_one_cpu if threads == "1" else None)
  if proc.returncode:
    raise RuntimeError(f"{demo} {isa} {threads}: exit {proc.returncode}\n"
                       f"{proc.stderr[-3000:]}")
  res = _results(demo, work)
  out = dict(demo=demo, isa=isa, threads=threads, seed=seed,
             base=res[base][metric], trained=res[trained][metric],
             gain=res[trained][metric] - res[base][metric],
             wall_s=round(time.time() - t0, 1), **_warm_start(work))
  done.write_text(json.dumps(out))
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--isas", default="SSE4_2,AVX2,default")
  p.add_argument("--threads", default="all,1")
  p.add_argument("--demos", default="swirl,simpletir")
  p.add_argument("--seed", type=int, default=0)
  a = p.parse_args()
  runs = []
  for demo in a.demos.split(","):
    for isa in a.isas.split(","):
      for threads in a.threads.split(","):
        work = pathlib.Path(a.workdir) / f"{demo}_{isa}_t{threads}"
        r = run_one(demo, isa, threads, a.seed, work)
        print(json.dumps(r), flush=True)
        runs.append(r)
  spread = {}
  for demo in a.demos.split(","):
    rs = [r for r in runs if r["demo"] == demo]
    spread[demo] = {k: round(max(r[k] for r in rs) - min(r[k] for r in rs),
                             4) for k in ("base", "trained", "gain")}
  print(json.dumps(dict(benchmark="robustness", seed=a.seed,
                        cpu=_cpu_model(), runs=runs, spread=spread)))


def _cpu_model() -> str:
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return ""


if __name__ == "__main__":
  main()
