"""XLA compiles counted from JAX's own compile events (jax.monitoring).

The event wraps the persistent compilation cache's lookup too, so a
program read from the session's cache (tests/conftest.py) counts as a
compile: a test that counts compiles sees a program built again whether
XLA compiled it or the cache held it (tests/test_compile_cache.py checks
this)."""

import collections
import contextlib

import jax

_COMPILE = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def counting():
  """Yields a Counter of the compiles inside the block, by program name
  (`jit(<function name>)`, e.g. the page pool's 'jit(decode)')."""
  counts = collections.Counter()

  def listener(event, duration, fun_name="", **kwargs):
    del duration, kwargs
    if event == _COMPILE:
      counts[fun_name] += 1

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield counts
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def cache_programs(counts) -> collections.Counter:
  """The page pool's programs (sampling/pages.py) among `counts`."""
  return collections.Counter({k: v for k, v in counts.items()
                              if k in ("jit(init)", "jit(append)",
                                       "jit(decode)", "jit(fork)")})
