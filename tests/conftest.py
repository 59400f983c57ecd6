"""Test-wide settings: exact float32 matmuls on the CPU."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jax  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: loads real model weights")


@pytest.fixture(scope="session")
def smollm2():
  """(path, ModelConfig, params) of the bundled SmolLM2 GGUF, loaded once."""
  from swirl_jax import paths  # pylint: disable=g-import-not-at-top
  from swirl_jax.models import gguf_io  # pylint: disable=g-import-not-at-top
  try:
    path = paths.smollm2_gguf_path()
  except FileNotFoundError as e:
    pytest.skip(str(e))
  cfg, params = gguf_io.load_gguf(path)
  return path, cfg, params


@pytest.fixture(scope="session")
def demo_smoke_run(tmp_path_factory):
  """The README's demo command at smoke size, run once: its workdir."""
  import testutil  # pylint: disable=g-import-not-at-top
  work = tmp_path_factory.mktemp("demo_smoke") / "work"
  testutil.run_main("--config=configs/demo.py:smoke", f"--workdir={work}")
  return work
