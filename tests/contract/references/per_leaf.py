"""References of the transformations whose math needs each leaf's own shape: trust ratios
(LARS, LAMB, Fromage), block RMS and block norms, factored second moments (Adafactor), SM3's
cover sets, NovoGrad's layer-wise moments, layer-wise DoG and unit-wise clipping.

Each per-leaf rule is a plain function of one array, so the stacked-layer tests can apply it
to the slices of a stacked leaf one at a time. Same conventions as the package module.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

from references import (
    LR,
    Flat,
    Reference,
    State,
    _counts,
    _f64,
    _stateless,
    _zeros,
    add_decayed_weights,
    chain,
    f32,
    scale,
    scale_by_adam,
    scale_by_learning_rate,
    trace,
)
from references.momentum import ema


def sm3_cover_sets(shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """The cover sets of an array: `(axis, index)`, the slice at `index` along `axis`.

    A scalar has one cover set, `(-1, 0)`, holding its only element.
    """
    if not shape:
        return [(-1, 0)]
    return [(axis, j) for axis, n in enumerate(shape) for j in range(n)]


def _covers(element: tuple[int, ...], cover: tuple[int, int]) -> bool:
    axis, j = cover
    return axis < 0 or element[axis] == j


def scale_by_sm3(b1: float = 0.9, b2: float = 1.0, eps: float = 1e-8) -> Reference:
    """SM3-II, element by element over explicit cover sets, then momentum:
    nu(i) = min_{r: i in S_r} mu(r);  a(i) = c g(i)^2 + b2 nu(i) (c = 1 if b2 == 1 else 1 - b2);
    mu(r) = max_{j in S_r} a(j);  s = g / sqrt(a + eps) (0 where a = 0);  m = b1 m + (1 - b1) s.
    """
    b1, b2, eps = f32(b1), f32(b2), f32(eps)
    c = 1.0 if b2 == 1.0 else 1.0 - b2

    def init(params: Flat) -> State:
        acc = {p: {r: 0.0 for r in sm3_cover_sets(np.shape(x))} for p, x in params.items()}
        return {"acc": acc, "mu": _zeros(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        accs, mus, out = dict(state["acc"]), dict(state["mu"]), {}
        for p, g in grads.items():
            g = _f64(g)
            covers = accs[p]
            a = np.zeros_like(g)
            for element in itertools.product(*(range(n) for n in g.shape)):
                nu = min(v for r, v in covers.items() if _covers(element, r))
                a[element] = c * g[element] ** 2 + b2 * nu
            new = {}
            for r in covers:
                inside = [
                    a[e] for e in itertools.product(*(range(n) for n in g.shape)) if _covers(e, r)
                ]
                new[r] = max(inside, default=0.0)
            accs[p] = new
            scaled = np.where(a > 0, g / np.sqrt(a + eps), 0.0)
            mus[p] = b1 * mus[p] + (1.0 - b1) * scaled
            out[p] = mus[p]
        return out, {"acc": accs, "mu": mus}

    return Reference(init, update)


def sm3(learning_rate: LR, momentum: float = 0.9) -> Reference:
    """p -= lr * sm3_momentum."""
    return chain(scale_by_sm3(b1=momentum), scale_by_learning_rate(learning_rate))


def scale_by_param_block_norm(min_scale: float = 1e-3) -> Reference:
    """u = g * max(||param||, min_scale) per leaf."""
    s = f32(min_scale)
    return _stateless(lambda p, g, params: _f64(g) * max(_norm(params[p]), s))


def scale_by_distance_over_gradients(
    reps_rel: float = 1e-6, eps: float = 1e-8, global_scale: float = 1.0
) -> Reference:
    """Per path l: r_l = max(r_l, |x_l - x_l0|) from r_l0 = reps_rel (1 + |x_l0|);
    G_l += |g_l|^2;  u_l = global_scale * r_l / sqrt(G_l + eps) * g_l."""
    reps, eps, s = f32(reps_rel), f32(eps), f32(global_scale)

    def init(params: Flat) -> State:
        return {
            "x0": {p: _f64(x).copy() for p, x in params.items()},
            "r": {p: reps * (1.0 + _norm(x)) for p, x in params.items()},
            "G": {p: 0.0 for p in params},
        }

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        r, total, out = dict(state["r"]), dict(state["G"]), {}
        for p, g in grads.items():
            r[p] = max(r[p], _norm(_f64(params[p]) - state["x0"][p]))
            total[p] += _norm(g) ** 2
            out[p] = s * r[p] / math.sqrt(total[p] + eps) * _f64(g)
        return out, {"x0": state["x0"], "r": r, "G": total}

    return Reference(init, update)


def scale_by_novograd(
    b1: float = 0.9,
    b2: float = 0.25,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    weight_decay: float = 0.0,
) -> Reference:
    """NovoGrad (Ginsburg et al., 2019): a scalar second moment per array."""
    b1, b2, eps, eps_root, wd = (f32(x) for x in (b1, b2, eps, eps_root, weight_decay))

    def init(params: Flat) -> State:
        return {"mu": _zeros(params), "nu": {p: None for p in params}}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, nu, out = dict(state["mu"]), dict(state["nu"]), {}
        for p, g in grads.items():
            g = _f64(g)
            n = float(np.sum(g * g))
            nu[p] = n if nu[p] is None else b2 * nu[p] + (1.0 - b2) * n
            mu[p] = b1 * mu[p] + g / (math.sqrt(nu[p] + eps_root) + eps) + wd * _f64(params[p])
            out[p] = mu[p]
        return out, {"mu": mu, "nu": nu}

    return Reference(init, update)


def fromage(learning_rate: LR, min_norm: float = 1e-6) -> Reference:
    """p_new = (p - lr * max(||p||, n) / max(||g||, n) * g) / sqrt(1 + lr^2), per array."""
    n = f32(min_norm)
    schedule = learning_rate if callable(learning_rate) else None
    constant = None if callable(learning_rate) else f32(learning_rate)

    def init(params: Flat) -> State:
        return {"count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        count, out = dict(state["count"]), {}
        for p, g in grads.items():
            lr = schedule(count[p]) if schedule else constant
            count[p] += 1
            g, x = _f64(g), _f64(params[p])
            ratio = max(np.sqrt(np.sum(x * x)), n) / max(np.sqrt(np.sum(g * g)), n)
            new = (x - lr * ratio * g) / math.sqrt(1.0 + lr * lr)
            out[p] = new - x
        return out, {"count": count}

    return Reference(init, update)


def novograd(learning_rate: LR, b1: float = 0.9, b2: float = 0.25, eps: float = 1e-6):
    """p -= lr * novograd_momentum."""
    return chain(scale_by_novograd(b1, b2, eps), scale_by_learning_rate(learning_rate))


Mask = Callable[[str], bool] | None


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
