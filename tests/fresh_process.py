"""Runs a script in a fresh Python process (its own fake device count: the
parent's XLA_FLAGS are dropped; the session's compilation cache) and
returns its last stdout line as JSON."""

import json
import os
import subprocess
import sys

import testutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def last_json(script: str, timeout: int = 600) -> dict:
  env = dict(os.environ, PYTHONPATH=REPO, **testutil.jax_cache_env())
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])
