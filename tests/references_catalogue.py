"""Independent NumPy float64 references for the second round of the optimizer catalogue: SM3,
optimistic Adam, `apply_every`, per-layer per-example clipping, parameter block norms,
layer-wise DoG, AGC's unit-wise helpers and Lion's soft modes.

Same conventions as `references.py`: flat dicts `{path: array}`, hyperparameters rounded to
float32 first, arithmetic in float64, written from the papers and gradtx's docstrings.
"""

from __future__ import annotations

import itertools
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
    _zeros,
    chain,
    f32,
    scale,
    scale_by_adam,
    scale_by_learning_rate,
)

LR = float | Callable[[int], float]


def _norm(x: np.ndarray) -> float:
    return math.sqrt(float(np.sum(_f64(x) ** 2)))


# --- SM3 (Anil et al., 2019) ----------------------------------------------------------------------


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


# --- optimistic Adam (Daskalakis et al., 2018) ------------------------------------------------


def _optimistic_step(alpha: float, beta: float) -> Reference:
    """u = alpha r_t + beta (r_t - r_{t-1}), r_0 = r_1 (r: the incoming direction)."""
    a, b = f32(alpha), f32(beta)

    def init(params: Flat) -> State:
        return {"prev": {p: None for p in params}}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        prev, out = dict(state["prev"]), {}
        for p, r in grads.items():
            r = _f64(r)
            last = r if prev[p] is None else prev[p]
            out[p] = a * r + b * (r - last)
            prev[p] = r
        return out, {"prev": prev}

    return Reference(init, update)


def optimistic_adam(
    learning_rate: float,
    optimism: float | None = None,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    nesterov: bool = True,
) -> Reference:
    """p -= lr r_t + o (r_t - r_{t-1}), r_t Adam's (NAdam's with `nesterov`) direction."""
    o = learning_rate if optimism is None else optimism
    return chain(
        scale_by_adam(b1, b2, eps, nesterov=nesterov),
        _optimistic_step(learning_rate, o),
        scale(-1.0),
    )


# --- apply_every --------------------------------------------------------------------------------


def apply_every(k: int) -> Reference:
    """Per path: A = g at the start of each cycle of k updates, A + g after; u = A on the
    cycle's k-th update, 0 otherwise."""
    k = int(k)

    def init(params: Flat) -> State:
        return {"acc": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        acc, count, out = dict(state["acc"]), dict(state["count"]), {}
        for p, g in grads.items():
            phase = count[p] % k
            acc[p] = _f64(g) if phase == 0 else acc[p] + _f64(g)
            out[p] = acc[p] if phase == k - 1 else np.zeros_like(acc[p])
            count[p] += 1
        return out, {"acc": acc, "count": count}

    return Reference(init, update)


# --- per-example, per-layer clipping (McMahan et al., 2018) ------------------------------------


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


# --- parameter block norm -----------------------------------------------------------------------


def scale_by_param_block_norm(min_scale: float = 1e-3) -> Reference:
    """u = g * max(||param||, min_scale) per leaf."""
    s = f32(min_scale)
    return _stateless(lambda p, g, params: _f64(g) * max(_norm(params[p]), s))


# --- layer-wise DoG (Ivgi et al., 2023) ---------------------------------------------------------


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


# --- AGC's unit-wise helpers (Brock et al., 2021) -----------------------------------------------


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


# --- Lion's soft modes --------------------------------------------------------------------------


def scale_by_lion(
    b1: float = 0.9, b2: float = 0.99, mode: str = "hard", smooth_beta: float = 1.0
) -> Reference:
    """x = b1 m + (1 - b1) g (old m); u = sign(x), tanh(beta x) or (x if |x| < 1 else sign x);
    m = b2 m + (1 - b2) g."""
    b1, b2, beta = f32(b1), f32(b2), f32(smooth_beta)
    shape = {
        "hard": np.sign,
        "smooth": lambda x: np.tanh(beta * x),
        "refined": lambda x: np.where(np.abs(x) < 1, x, np.sign(x)),
    }[mode]

    def init(params: Flat) -> State:
        return {"mu": _zeros(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, out = dict(state["mu"]), {}
        for p, g in grads.items():
            g = _f64(g)
            out[p] = shape(b1 * mu[p] + (1.0 - b1) * g)
            mu[p] = b2 * mu[p] + (1.0 - b2) * g
        return out, {"mu": mu}

    return Reference(init, update)
