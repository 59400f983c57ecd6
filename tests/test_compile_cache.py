"""The session's persistent compilation cache (tests/conftest.py) as the
compile-count tests meet it."""

import jax
import jax.numpy as jnp
import pytest

import compile_events
import testutil

_HIT = "/jax/compilation_cache/cache_hits"


def _fresh_program():
  """A new function object each call, so JAX's in-memory caches miss; the
  same program (name and body) each time."""
  def program_read_from_the_cache(x):
    return jnp.sin(x) * 3.0 + 1.25
  return jax.jit(program_read_from_the_cache)


def test_a_program_read_from_the_cache_counts_as_a_compile():
  """The same program built twice: the second comes from the persistent
  cache (a cache hit), and compile_events counts it all the same."""
  if not testutil.cache_dir():
    pytest.skip(f"the session's compilation cache is off "
                f"({testutil.CACHE_ENV})")
  hits = []

  def listener(event, **kwargs):
    del kwargs
    if event == _HIT:
      hits.append(event)

  x = jnp.arange(7.0)
  jax.monitoring.register_event_listener(listener)
  try:
    with compile_events.counting() as first:
      want = _fresh_program()(x)
    before = len(hits)
    with compile_events.counting() as second:
      got = _fresh_program()(x)
  finally:
    jax.monitoring.unregister_event_listener(listener)
  name = "jit(program_read_from_the_cache)"
  assert first[name] == second[name] == 1, (first, second)
  assert len(hits) > before  # The second came from the cache.
  assert jnp.array_equal(got, want)
