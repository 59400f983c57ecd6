"""Test-wide settings: exact float32 matmuls on the CPU."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import jax  # pylint: disable=g-import-not-at-top

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: loads real model weights")
