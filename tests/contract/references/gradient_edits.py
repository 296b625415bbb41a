"""References of the transformations that edit the gradient without keeping moments:
centring, normalising by the update's norm (and contrib's `normalize`), zeroing NaNs, added
noise (`add_noise`, `noisy_sgd`) and keeping params non-negative.

Where a method draws random numbers, the reference draws them from the key stream the
docstring documents, with `jax.random`, and does the rest of the arithmetic in NumPy.
"""

from __future__ import annotations

import math
import zlib

import jax
import numpy as np

from references import (
    LR,
    Flat,
    Reference,
    State,
    _counts,
    _f64,
    _no_state,
    _stateless,
    chain,
    f32,
    scale_by_learning_rate,
)


def normalize() -> Reference:
    """u = g / ||g||, the norm over every leaf; 0 for a zero gradient."""

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        norm = math.sqrt(sum(float(np.sum(_f64(g) ** 2)) for g in grads.values()))
        return {p: _f64(g) / norm if norm > 0 else _f64(g) for p, g in grads.items()}, state

    return Reference(_no_state, update)


def _sq_norm(grads: Flat) -> float:
    return float(sum(np.sum(_f64(g) ** 2) for g in grads.values()))


def centralize() -> Reference:
    """Rank >= 2: subtract the mean of each slice along the first axis; else unchanged."""

    def fn(p: str, g: np.ndarray, params: Flat) -> np.ndarray:
        if g.ndim < 2:
            return g
        rows = g.reshape(g.shape[0], -1)
        return (rows - rows.mean(axis=1, keepdims=True)).reshape(g.shape)

    return _stateless(fn)


def add_noise(eta: float, gamma: float, seed: int = 0) -> Reference:
    """u = g + sqrt(eta / t^gamma) xi, xi drawn from each path's documented key stream."""
    eta, gamma = f32(eta), f32(gamma)
    base = jax.random.key(seed)

    def init(params: Flat) -> State:
        keys = {p: jax.random.fold_in(base, zlib.crc32(p.encode())) for p in params}
        return {"key": keys, "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        keys, count, out = dict(state["key"]), dict(state["count"]), {}
        for p, g in grads.items():
            count[p] += 1
            keys[p], sample = jax.random.split(keys[p])
            noise = np.asarray(jax.random.normal(sample, np.shape(g)), np.float64)
            out[p] = _f64(g) + math.sqrt(eta / count[p] ** gamma) * noise
        return out, {"key": keys, "count": count}

    return Reference(init, update)


def normalize_by_update_norm(scale_factor: float = 1.0, eps: float = 1e-6) -> Reference:
    """u = s g / (||g|| + eps), the norm over every leaf."""
    s, eps = f32(scale_factor), f32(eps)

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        norm = math.sqrt(_sq_norm(grads))
        return {p: s * _f64(g) / (norm + eps) for p, g in grads.items()}, state

    return Reference(_no_state, update)


def zero_nans() -> Reference:
    """NaN elements become 0."""
    return _stateless(lambda p, g, params: np.where(np.isnan(g), 0.0, g))


def keep_params_nonnegative() -> Reference:
    """u = -param where param + g < 0."""
    return _stateless(lambda p, g, params: np.where(_f64(params[p]) + g < 0, -_f64(params[p]), g))


def noisy_sgd(learning_rate: LR, eta: float = 0.01, gamma: float = 0.55, seed: int = 0):
    """p -= lr * (g + noise)."""
    return chain(add_noise(eta, gamma, seed), scale_by_learning_rate(learning_rate))
