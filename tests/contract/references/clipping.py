"""References of the clipping methods beyond `clip` and `clip_by_global_norm` (which are in
the package module): per-example clipping of the global and of each layer's norm, and AGC's
unit-wise norm and clip on arrays. Block-RMS and adaptive gradient clipping, whose rules are
functions of one leaf, are in `per_leaf`.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from references import Flat, Reference, State, _f64, f32


def _norm(x: np.ndarray) -> float:
    return math.sqrt(float(np.sum(_f64(x) ** 2)))


def per_example_layer_norm_clip(global_l2_norm_clip: float, uniform: bool = True) -> Reference:
    """Per-example grads (leading batch axis): each leaf l of example i scaled by
    min(1, C_l / |g_il|), C_l = C / sqrt(K) (uniform) or C sqrt(D_l / D), then summed."""
    clip = f32(global_l2_norm_clip)

    def init(params: Flat) -> State:
        return {"num_clipped": {p: 0 for p in params}}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        sizes = {p: int(np.prod(np.shape(g)[1:])) for p, g in grads.items()}
        total = sum(sizes.values())
        counts, out = dict(state["num_clipped"]), {}
        for p, g in grads.items():
            share = 1.0 / len(grads) if uniform else sizes[p] / total
            limit = clip * math.sqrt(share)
            norms = [_norm(example) for example in g]
            factors = [limit / n if n > limit else 1.0 for n in norms]
            out[p] = sum(f * _f64(example) for f, example in zip(factors, g))
            counts[p] = sum(n > limit for n in norms)
        return out, {"num_clipped": counts}

    return Reference(init, update)


def unitwise_norm(x: np.ndarray, axis: tuple[int, ...] | None = None) -> np.ndarray:
    """Each unit's L2 norm, repeated over the unit: a unit spans `axis`, or by default the
    whole array (a squeezed vector or scalar), axis 0 (rank 2, 3), all but the last axis
    (rank 4, 5)."""
    x = _f64(x)
    if axis is None:
        if len([d for d in x.shape if d != 1]) <= 1:
            axis = tuple(range(x.ndim))
        elif x.ndim in (2, 3):
            axis = (0,)
        else:
            axis = tuple(range(x.ndim - 1))
    out = np.empty_like(x)
    kept = [a for a in range(x.ndim) if a not in axis]
    for index in itertools.product(*(range(x.shape[a]) for a in kept)):
        where = [slice(None)] * x.ndim
        for a, i in zip(kept, index):
            where[a] = i
        out[tuple(where)] = _norm(x[tuple(where)])
    return out


def unitwise_clip(
    g_norm: np.ndarray, max_norm: np.ndarray, grad: np.ndarray, div_eps: float = 1e-6
) -> np.ndarray:
    """g where |g| < M, else g M / max(|g|, div_eps), element by element."""
    g_norm, max_norm, grad = _f64(g_norm), _f64(max_norm), _f64(grad)
    scaled = grad * max_norm / np.maximum(g_norm, f32(div_eps))
    return np.where(g_norm < max_norm, grad, scaled)


def per_example_global_norm_clip(l2_norm_clip: float) -> Reference:
    """Per-example grads (leading batch axis): sum_i g_i min(1, C / |g_i|), |g_i| the global
    norm of example i over every leaf; a zero example keeps factor 1."""
    clip = f32(l2_norm_clip)

    def init(params: Flat) -> State:
        return {"num_clipped": 0}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        batch = len(next(iter(grads.values())))
        norms = [
            math.sqrt(sum(float(np.sum(_f64(g[i]) ** 2)) for g in grads.values()))
            for i in range(batch)
        ]
        factors = [clip / n if n > clip else 1.0 for n in norms]
        out = {p: sum(f * _f64(g[i]) for i, f in enumerate(factors)) for p, g in grads.items()}
        return out, {"num_clipped": sum(n > clip for n in norms)}

    return Reference(init, update)
