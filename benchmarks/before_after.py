r"""One benchmark, before a change and after it, in one run.

Runs benchmarks/SCRIPT of each checkout (--before's, and this one's) in
alternation, --rounds times, each run in its own interpreter importing
its own checkout, and reads each run's last line (one JSON object). For
every number both sides print it gives the best run of each side (the
least for times: names ending in _s or _ms; the most for rates: names
ending in tok_s, per_s or speedup; else the last run's) and after /
before. Alternating runs share the machine's drift. Prints a line per
run, then one JSON line.

  python benchmarks/before_after.py --before=OLDER_CHECKOUT -- sampler.py
  python benchmarks/before_after.py --before=OLDER_CHECKOUT --rounds=2 \
      -- rollout.py --prompts=8
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(checkout: str, script: str, args) -> dict:
  env = dict(os.environ, PYTHONPATH=checkout)
  proc = subprocess.run(
      [sys.executable, os.path.join(checkout, "benchmarks", script), *args],
      cwd=checkout, env=env, capture_output=True, text=True, timeout=7200)
  if proc.returncode:
    raise RuntimeError(f"{checkout} {script}:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def kind(name: str) -> str:
  """'rate' (more is better), 'time' (less is) or 'other'."""
  if name.endswith(("tok_s", "per_s", "speedup")):
    return "rate"
  if name.endswith(("_s", "_ms")):
    return "time"
  return "other"


def compare(before: list[dict], after: list[dict]) -> dict:
  out = {}
  for name, value in after[-1].items():
    if not isinstance(value, (int, float)) or isinstance(value, bool) or \
        not isinstance(before[-1].get(name), (int, float)):
      continue
    pick = {"rate": max, "time": min}.get(kind(name), lambda xs: xs[-1])
    b, a = pick([r[name] for r in before]), pick([r[name] for r in after])
    out[name] = dict(before=b, after=a,
                     after_vs_before=round(a / b, 3) if b else None)
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--before", required=True, help="the checkout before")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("script", help="a file in benchmarks/")
  p.add_argument("args", nargs=argparse.REMAINDER)
  a = p.parse_args()
  args = [x for x in a.args if x != "--"]
  runs = {"before": [], "after": []}
  for i in range(a.rounds):
    for side, checkout in (("before", a.before), ("after", str(ROOT))):
      runs[side].append(run(checkout, a.script, args))
      print(f"round {i} {side}: {json.dumps(runs[side][-1])}", flush=True)
  print(json.dumps(dict(benchmark="before_after", script=a.script,
                        args=args, rounds=a.rounds, before=a.before,
                        figures=compare(runs["before"], runs["after"]))))


if __name__ == "__main__":
  main()
