"""benchmarks/robustness.py's settings, without its minutes-long runs: its
one-thread setting pins the run to one CPU (XLA's own thread flags did
not slow a matmul, so they were not one thread), an unknown setting is
refused, and a finished run is read back rather than run again."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _module():
  spec = importlib.util.spec_from_file_location(
      "robustness", ROOT / "benchmarks" / "robustness.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_one_thread_is_one_cpu():
  """What the script runs before a one-CPU run's process starts, run in a
  fresh interpreter (this one has JAX's threads, which a fork must not
  copy)."""
  code = ("import importlib.util, os, sys; "
          "spec = importlib.util.spec_from_file_location('r', sys.argv[1]); "
          "m = importlib.util.module_from_spec(spec); "
          "spec.loader.exec_module(m); m._one_cpu(); "
          "print(len(os.sched_getaffinity(0)))")
  pinned = subprocess.run(
      [sys.executable, "-c", code, str(ROOT / "benchmarks" / "robustness.py")],
      text=True, capture_output=True, check=True)
  assert pinned.stdout.strip() == "1"


def test_settings_are_checked_and_finished_runs_read_back(tmp_path):
  robustness = _module()
  with pytest.raises(ValueError, match="threads"):
    robustness.run_one("swirl", "default", "2", 0, tmp_path / "x")
  done = dict(demo="swirl", isa="AVX2", threads="1", seed=0, base=0.1,
              trained=0.5, gain=0.4, wall_s=1.0)
  (tmp_path / "robustness_run.json").write_text(json.dumps(done))
  assert robustness.run_one("swirl", "AVX2", "1", 0, tmp_path) == done
