"""Strict settings for every test: dtype promotion and rank promotion must be explicit."""

import jax

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")
