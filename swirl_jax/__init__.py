"""swirl_jax: tool-using language-model agents trained with RL in JAX."""

__version__ = "0.1.0"
