"""Independent NumPy float64 references for the transformations whose math needs each leaf's
own shape: trust ratios, block RMS, factored second moments, unit-wise and per-example clipping.

Same conventions as `references.py`: flat dicts `{path: array}`, hyperparameters rounded to
float32 first, arithmetic in float64, written from the papers and gradtx's docstrings. Each
per-leaf rule is a plain function of one array, so the stacked-layer tests can apply it to the
slices of a stacked leaf one at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from references import (
    Flat,
    Reference,
    State,
    _counts,
    _f64,
    _stateless,
    add_decayed_weights,
    chain,
    f32,
    scale,
    scale_by_adam,
    scale_by_learning_rate,
    trace,
)
from references_misc import ema

LR = float | Callable[[int], float]
Mask = Callable[[str], bool] | None


# --- per-array rules ----------------------------------------------------------------------------


def _norm(x: np.ndarray) -> float:
    return math.sqrt(float(np.sum(_f64(x) ** 2)))


def _rms(x: np.ndarray) -> float:
    x = _f64(x)
    return math.sqrt(float(np.mean(x**2))) if x.size else math.nan


def trust_ratio_leaf(
    g: np.ndarray, param: np.ndarray, min_norm: float, coefficient: float, eps: float
) -> np.ndarray:
    """u = g * c max(|p|, n) / (max(|g|, n) + eps); u = g if a clamped norm is 0."""
    p_norm, g_norm = max(_norm(param), min_norm), max(_norm(g), min_norm)
    if p_norm == 0.0 or g_norm == 0.0:
        return _f64(g)
    return _f64(g) * (coefficient * p_norm / (g_norm + eps))


def param_block_rms_leaf(g: np.ndarray, param: np.ndarray, min_scale: float) -> np.ndarray:
    """u = g * max(rms(param), min_scale)."""
    return _f64(g) * max(_rms(param), min_scale)


def clip_block_rms_leaf(g: np.ndarray, threshold: float) -> np.ndarray:
    """u = g * min(1, threshold / rms(g))."""
    rms = _rms(g)
    return _f64(g) * (threshold / rms) if rms > threshold else _f64(g)


def agc_units(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The axes of one AGC unit: all for a (squeezed) vector or scalar, 0 for rank 2 and 3,
    all but the last for rank 4 and 5."""
    if len([d for d in shape if d != 1]) <= 1:
        return tuple(range(len(shape)))
    if len(shape) in (2, 3):
        return (0,)
    return tuple(range(len(shape) - 1))


def agc_leaf(g: np.ndarray, param: np.ndarray, clipping: float, eps: float) -> np.ndarray:
    """Each unit i: g_i, or g_i * clipping max(|p_i|, eps) / |g_i| when |g_i| >= the limit."""
    g, param = _f64(g), _f64(param)
    axes = agc_units(g.shape)
    g_norm = np.sqrt(np.sum(g**2, axis=axes, keepdims=True))
    limit = clipping * np.maximum(np.sqrt(np.sum(param**2, axis=axes, keepdims=True)), eps)
    factor = np.where(g_norm < limit, 1.0, limit / np.maximum(g_norm, 1e-6))
    return g * factor


def factored_axes(shape: tuple[int, ...], min_dim: int) -> tuple[int, int] | None:
    """(d1, d0): second largest and largest axis (the earlier axis first on ties), or None."""
    if len(shape) < 2:
        return None
    order = sorted(range(len(shape)), key=lambda i: (shape[i], i))
    d1, d0 = order[-2], order[-1]
    return None if shape[d1] < min_dim else (d1, d0)


def factored_rms_init(shape: tuple[int, ...], min_dim: int) -> dict[str, np.ndarray]:
    """Zero row/column statistics (factored) or a zero full `v`."""
    axes = factored_axes(shape, min_dim)
    if axes is None:
        return {"v": np.zeros(shape)}
    d1, d0 = axes
    return {"row": np.zeros(np.delete(shape, d0)), "col": np.zeros(np.delete(shape, d1))}


def factored_rms_leaf(
    g: np.ndarray, slots: dict[str, np.ndarray], t: int, decay_rate: float, eps: float
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One Adafactor second-moment step at the path's step t = 1, 2, ...: beta = 1 - t^-c,
    G = g^2 + eps; full: V = beta V + (1 - beta) G, u = g / sqrt(V); factored: row/col means
    of G over the largest/second largest axis, u = g / sqrt(outer(R, C) / mean(R))."""
    g = _f64(g)
    beta = 1.0 - t ** (-decay_rate)
    big = g * g + eps
    if "v" in slots:
        v = beta * slots["v"] + (1.0 - beta) * big
        return g / np.sqrt(v), {"v": v}
    d1, d0 = factored_axes(g.shape, 1)  # the slots exist: this leaf qualified
    row = beta * slots["row"] + (1.0 - beta) * big.mean(axis=d0)
    col = beta * slots["col"] + (1.0 - beta) * big.mean(axis=d1)
    # Estimate V element by element: V[i] = R[i without d0] * C[i without d1] / mean_d1(R).
    row_mean = row.mean(axis=d1 - 1 if d1 > d0 else d1)  # shape without d0 and d1
    v = np.empty_like(g)
    for index in np.ndindex(g.shape):
        r = row[index[:d0] + index[d0 + 1 :]]
        c = col[index[:d1] + index[d1 + 1 :]]
        rest = tuple(i for k, i in enumerate(index) if k not in (d0, d1))
        v[index] = r * c / row_mean[rest]
    return g / np.sqrt(v), {"row": row, "col": col}


# --- transformations ----------------------------------------------------------------------------


def scale_by_trust_ratio(
    min_norm: float = 0.0, trust_coefficient: float = 1.0, eps: float = 0.0, mask: Mask = None
) -> Reference:
    """The trust ratio per leaf, on the paths `mask` selects (all without a mask)."""
    n, c, e = f32(min_norm), f32(trust_coefficient), f32(eps)

    def fn(p: str, g: np.ndarray, params: Flat) -> np.ndarray:
        if mask is not None and not mask(p):
            return g
        return trust_ratio_leaf(g, params[p], n, c, e)

    return _stateless(fn)


def scale_by_param_block_rms(min_scale: float = 1e-3) -> Reference:
    """u = g * max(rms(param), min_scale) per leaf."""
    s = f32(min_scale)
    return _stateless(lambda p, g, params: param_block_rms_leaf(g, params[p], s))


def clip_by_block_rms(threshold: float) -> Reference:
    """Each leaf's RMS clipped to `threshold`."""
    t = f32(threshold)
    return _stateless(lambda p, g, params: clip_block_rms_leaf(g, t))


def adaptive_grad_clip(clipping: float, eps: float = 1e-3) -> Reference:
    """Unit-wise AGC per leaf."""
    c, e = f32(clipping), f32(eps)
    return _stateless(lambda p, g, params: agc_leaf(g, params[p], c, e))


def scale_by_factored_rms(
    decay_rate: float = 0.8, min_dim_size_to_factor: int = 128, epsilon: float = 1e-30
) -> Reference:
    """Adafactor's second moments, one step count per path."""
    c, eps = f32(decay_rate), f32(epsilon)

    def init(params: Flat) -> State:
        return {
            "slots": {
                p: factored_rms_init(np.shape(x), min_dim_size_to_factor) for p, x in params.items()
            },
            "count": _counts(params),
        }

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        slots, count, out = dict(state["slots"]), dict(state["count"]), {}
        for p, g in grads.items():
            count[p] += 1
            out[p], slots[p] = factored_rms_leaf(g, slots[p], count[p], c, eps)
        return out, {"slots": slots, "count": count}

    return Reference(init, update)


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


# --- optimizers ---------------------------------------------------------------------------------


def lamb(
    learning_rate: LR,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    mask: Mask = None,
) -> Reference:
    """LAMB (You et al., 2020): p -= lr * trust_ratio(adam_direction(g) + wd * p)."""
    return chain(
        scale_by_adam(b1, b2, eps),
        add_decayed_weights(weight_decay, mask),
        scale_by_trust_ratio(),
        scale_by_learning_rate(learning_rate),
    )


def lars(
    learning_rate: LR,
    weight_decay: float = 0.0,
    weight_decay_mask: Mask = None,
    trust_coefficient: float = 0.001,
    eps: float = 0.0,
    trust_ratio_mask: Mask = None,
    momentum: float = 0.9,
    nesterov: bool = False,
) -> Reference:
    """LARS (You et al., 2017), optax's order: decay, trust ratio, -lr, momentum."""
    return chain(
        add_decayed_weights(weight_decay, weight_decay_mask),
        scale_by_trust_ratio(trust_coefficient=trust_coefficient, eps=eps, mask=trust_ratio_mask),
        scale_by_learning_rate(learning_rate),
        trace(momentum, nesterov),
    )


def adafactor(
    learning_rate: LR | None = None,
    min_dim_size_to_factor: int = 128,
    decay_rate: float = 0.8,
    clipping_threshold: float | None = 1.0,
    momentum: float | None = None,
    weight_decay_rate: float | None = None,
    eps: float = 1e-30,
    weight_decay_mask: Mask = None,
) -> Reference:
    """Adafactor: factored rms, RMS clipping, +lr, parameter scale, momentum, decay, -1."""
    parts = [scale_by_factored_rms(decay_rate, min_dim_size_to_factor, eps)]
    if clipping_threshold is not None:
        parts.append(clip_by_block_rms(clipping_threshold))
    if learning_rate is not None:
        parts.append(scale_by_learning_rate(learning_rate, flip_sign=False))
    parts.append(scale_by_param_block_rms())
    if momentum is not None:
        parts.append(ema(momentum, debias=False))
    if weight_decay_rate is not None:
        parts.append(add_decayed_weights(weight_decay_rate, weight_decay_mask))
    parts.append(scale(-1.0))
    return chain(*parts)
