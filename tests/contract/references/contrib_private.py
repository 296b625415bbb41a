"""References of gradtx.contrib's differentially private methods: the clipped, noised
aggregate of per-example gradients and DP-SGD.

The noise is drawn from the key stream the docstring documents, with `jax.random`; the rest
of the arithmetic is NumPy.
"""

from __future__ import annotations

import zlib

import jax
import numpy as np

from references import LR, Flat, Reference, State, _f64, chain, f32, scale_by_learning_rate, trace
from references.clipping import per_example_global_norm_clip


def differentially_private_aggregate(
    l2_norm_clip: float, noise_multiplier: float, key: int = 0
) -> Reference:
    """Per-example grads (leading batch axis B): u = (sum_i clip_C(g_i) + sigma C xi) / B,
    xi drawn for each path from its key stream: fold_in(key, crc32(path)), then
    `key, sample = split(key)` and `normal(sample, shape)` (float32) at each update."""
    clip = per_example_global_norm_clip(l2_norm_clip)
    std = f32(l2_norm_clip) * f32(noise_multiplier)
    base = jax.random.key(key)

    def init(params: Flat) -> State:
        keys = {p: jax.random.fold_in(base, zlib.crc32(p.encode())) for p in params}
        return {"clip": clip.init(params), "key": keys}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        batch = len(next(iter(grads.values())))
        summed, clip_state = clip.update(grads, state["clip"], params)
        keys, out = dict(state["key"]), {}
        for p, g in summed.items():
            keys[p], sample = jax.random.split(keys[p])
            noise = np.asarray(jax.random.normal(sample, np.shape(g)), np.float64)
            out[p] = (_f64(g) + std * noise) / batch
        return out, {"clip": clip_state, "key": keys}

    return Reference(init, update)


def dpsgd(
    learning_rate: LR,
    l2_norm_clip: float,
    noise_multiplier: float,
    seed: int,
    momentum: float | None = None,
    nesterov: bool = False,
) -> Reference:
    """p -= lr * dp_mean(g), or with momentum p -= lr * trace(dp_mean(g))."""
    parts = [differentially_private_aggregate(l2_norm_clip, noise_multiplier, seed)]
    if momentum is not None:
        parts.append(trace(momentum, nesterov))
    return chain(*parts, scale_by_learning_rate(learning_rate))
