"""swirl_jax: tool-using language-model agents trained with RL in JAX.

The packages (and top-level modules) in layers, bottom to top: a package
imports only from layers below its own, never from its own layer's peers or
from above (tests/test_layers.py reads every import and checks this; the
README's code map lists them in the same order).
"""

__version__ = "0.1.0"

LAYERS = (
    ("paths", "errors"),
    ("config_lib", "sharding", "jsonl", "shapes", "chips", "dispatch"),
    ("config_blocks",),  # Config blocks' defaults, light for config files.
    ("distributed",),  # Multi-host start and exchange; lays arrays out.
    ("tools",),  # Plain Python, no JAX.
    ("tasks",),  # Plain Python; answer checkers may use tool parsing.
    ("models", "ops"),  # The decoder and its loaders; pure jnp kernels.
    ("sampling", "training"),  # Generation; the one train step.
    ("rollout",),  # The agent loop, records, step decomposition, batching.
    ("fit_programs",),  # The compiled programs the fit job measures.
    ("judges",),  # Step and outcome labels over rollout records.
    ("viewer",),  # The rollout viewer: static pages of trajectories.
    ("evaluation", "warmstart"),  # Metrics; the CPU runs' warm start.
    ("swirl", "simpletir"),  # The two methods, side by side.
    ("chat", "jobs", "fit"),  # Jobs and their registry.
    ("main",),  # The entry point.
)
