"""Benchmarks: gradtx against optax, side by side in one process."""
