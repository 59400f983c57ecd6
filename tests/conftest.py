"""Test-wide settings: exact float32 matmuls on the CPU, one persistent
compilation cache per test session, the markers, the order xdist's
workers take the files in, and the runs several test files share.

The cache (JAX's persistent compilation cache, every program written)
lives in `$SWIRL_JAX_TEST_CACHE`: a directory made for the session and
removed after it, shared by both xdist workers (they inherit the
variable) and by the subprocesses that take `testutil.jax_cache_env()`.
Set the variable to a directory to keep the cache between sessions, or
to `off` for none. A program read from the cache is the one a compile
would make, so no figure changes; compile-count tests still count it
(tests/compile_events.py).
"""

import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import jax  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

import testutil  # pylint: disable=g-import-not-at-top,g-bad-import-order

jax.config.update("jax_default_matmul_precision", "highest")


# The files of minutes, longest first (on 2 cores). `--dist loadfile`
# hands each worker a whole file at a time, in the collected order (xdist
# would otherwise reorder files by their number of tests, which puts
# these few-test files last): the longest start first and the many short
# files fill in at the end, so both workers finish at about the same
# time. Files not named keep pytest's order, after these.
LONGEST_FIRST = (
    "test_fit.py", "test_engine.py", "test_learning.py",
    "test_resume_simpletir.py", "test_multihost_swirl.py", "test_pages.py",
    "test_simpletir.py", "test_colabs.py", "test_sampler.py",
    "test_multihost_simpletir.py", "test_commands.py", "test_swirl.py",
    "test_resume.py", "test_train_step.py", "test_simpletir_demo.py",
    "test_multihost_exchange.py", "test_pipeline_faults.py",
    "test_models.py", "test_attention_impl.py", "test_async_simpletir.py",
    "test_seeds.py", "test_diagnostics.py", "test_engine_faults.py",
    "test_multihost.py", "test_demo.py",
)


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_configure(config):
  if getattr(config.option, "loadscopereorder", False):
    config.option.loadscopereorder = False  # Keep LONGEST_FIRST's order.
  config.addinivalue_line(
      "markers", "long: a run of minutes left out of the default run "
      "(pytest.ini); `python -m pytest -m long tests` runs them")
  if not os.environ.get(testutil.CACHE_ENV):
    # The controller (or a run without xdist): a cache for this session;
    # xdist's workers, started later, inherit the variable.
    path = tempfile.mkdtemp(prefix="swirl_jax_test_cache_")
    os.environ[testutil.CACHE_ENV] = path
    config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
  cache = testutil.cache_dir()
  if cache:  # Before any compile: JAX decides once whether it caches.
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


_SPEED = pytest.StashKey[float]()  # The speed at the session's start.


def _matmul_gflops() -> float:
  """This machine's speed now: the best of 10 float32 1024 x 1024 matmuls
  (numpy's BLAS, after one to warm it up), in GFLOP/s. A shared host's
  speed drifts (on the development machine an XLA matmul has timed 25%
  apart within one day), so the suite's time is printed beside it."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  a = np.random.default_rng(0).random((1024, 1024), np.float32)
  a @ a  # pylint: disable=pointless-statement
  best = float("inf")
  for _ in range(10):
    t = time.perf_counter()
    a @ a  # pylint: disable=pointless-statement
    best = min(best, time.perf_counter() - t)
  return 2 * 1024 ** 3 / best / 1e9


@pytest.hookimpl(tryfirst=True)  # Before xdist starts its workers.
def pytest_sessionstart(session):
  if not os.environ.get("PYTEST_XDIST_WORKER"):
    session.config.stash[_SPEED] = _matmul_gflops()


def pytest_terminal_summary(terminalreporter, config):
  if _SPEED in config.stash:
    terminalreporter.write_line(
        f"machine speed: float32 matmul {config.stash[_SPEED]:.0f} GFLOP/s "
        f"at the start, {_matmul_gflops():.0f} at the end "
        "(numpy, 1024 x 1024, best of 10)")



@contextlib.contextmanager
def _locked(path):
  with open(path, "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory):
  """A directory all xdist workers of this session see: the session's
  base temporary directory (a worker's is a subdirectory of it)."""
  base = tmp_path_factory.getbasetemp()
  return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


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
def demo_smoke_run(shared_dir):
  """The README's demo command at smoke size, run once a session (by
  whichever xdist worker asks first; the other waits for it): its
  workdir."""
  work, done = shared_dir / "demo_smoke" / "work", shared_dir / "demo_smoke.ok"
  with _locked(shared_dir / "demo_smoke.lock"):
    if not done.exists():
      shutil.rmtree(work, ignore_errors=True)
      testutil.run_main("--config=configs/demo.py:smoke", f"--workdir={work}")
      done.touch()
  return work
