"""References of gradtx.contrib's Adam-like methods: ADOPT, AdEMAMix and Simplified
AdEMAMix, MADGRAD and ACProp.

Same conventions as the package module: flat dicts, float32 hyperparameters, float64 math,
each written from the paper's update rule (and the formulas of gradtx.contrib's docstrings).
"""

from __future__ import annotations

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
    _zeros,
    add_decayed_weights,
    chain,
    f32,
    scale_by_learning_rate,
)


def _lr_at(learning_rate: LR, step: int) -> float:
    return learning_rate(step) if callable(learning_rate) else f32(learning_rate)


def scale_by_adopt(
    b1: float = 0.9,
    b2: float = 0.9999,
    eps: float = 1e-6,
    nesterov: bool = False,
    use_clipping: bool = True,
    clip_value_fn: Callable[[float], float] = lambda t: t**0.25,
) -> Reference:
    """s = clip(g / max(sqrt(v_old), eps), +-c(t)); m = b1 m + (1 - b1) s; v = b2 v + (1-b2) g^2;
    at t = 0: b1 -> 1, b2 -> 0 (v = g^2, no step)."""
    b1, b2, eps = f32(b1), f32(b2), f32(eps)

    def init(params: Flat) -> State:
        return {"mu": _zeros(params), "nu": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, nu, count = dict(state["mu"]), dict(state["nu"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g, t = _f64(g), count[p]
            c1, c2 = (1.0, 0.0) if t == 0 else (b1, b2)
            s = g / np.maximum(np.sqrt(nu[p]), eps)
            if use_clipping:
                bound = clip_value_fn(float(t))
                s = np.clip(s, -bound, bound)
            nu[p] = c2 * nu[p] + (1.0 - c2) * g * g
            mu[p] = c1 * mu[p] + (1.0 - c1) * s
            out[p] = c1 * mu[p] + (1.0 - c1) * s if nesterov else mu[p]
            count[p] = t + 1
        return out, {"mu": mu, "nu": nu, "count": count}

    return Reference(init, update)


def adopt(learning_rate: LR, **kwargs) -> Reference:
    """p -= lr * adopt_direction(g)."""
    return chain(scale_by_adopt(**kwargs), scale_by_learning_rate(learning_rate))


def scale_by_ademamix(
    b1: float = 0.9,
    b2: float = 0.999,
    b3: LR = 0.9999,
    alpha: LR = 6.0,
    eps: float = 1e-8,
    eps_root: float = 0.0,
) -> Reference:
    """u = (m1 / (1 - b1^t) + alpha m2) / (sqrt(v / (1 - b2^t) + eps_root) + eps)."""
    b1, b2, eps, eps_root = f32(b1), f32(b2), f32(eps), f32(eps_root)

    def init(params: Flat) -> State:
        z = _zeros
        return {"m1": z(params), "m2": z(params), "nu": z(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        m1, m2, nu = dict(state["m1"]), dict(state["m2"]), dict(state["nu"])
        count, out = dict(state["count"]), {}
        for p, g in grads.items():
            g, t = _f64(g), count[p]
            c3, a = _lr_at(b3, t), _lr_at(alpha, t)
            m1[p] = b1 * m1[p] + (1.0 - b1) * g
            m2[p] = c3 * m2[p] + (1.0 - c3) * g
            nu[p] = b2 * nu[p] + (1.0 - b2) * g * g
            count[p] = t = t + 1
            m_hat, v_hat = m1[p] / (1.0 - b1**t), nu[p] / (1.0 - b2**t)
            out[p] = (m_hat + a * m2[p]) / (np.sqrt(v_hat + eps_root) + eps)
        return out, {"m1": m1, "m2": m2, "nu": nu, "count": count}

    return Reference(init, update)


def ademamix(
    learning_rate: LR,
    weight_decay: float = 0.0,
    mask: Callable[[str], bool] | None = None,
    **kwargs,
) -> Reference:
    """p -= lr * (ademamix_direction(g) + wd * p); alpha defaults to 5 here."""
    kwargs.setdefault("alpha", 5.0)
    return chain(
        scale_by_ademamix(**kwargs),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def scale_by_madgrad(learning_rate: LR, momentum: float = 0.9, eps: float = 1e-6) -> Reference:
    """Defazio & Jelassi: lam = (lr + eps) sqrt(k + 1); nu += lam g^2; s += lam g;
    z = x0 - s / (cbrt(nu) + eps); x_new = c x + (1 - c) z (k per path)."""
    c, eps = f32(momentum), f32(eps)

    def init(params: Flat) -> State:
        x0 = {p: _f64(x).copy() for p, x in params.items()}
        return {"nu": _zeros(params), "s": _zeros(params), "x0": x0, "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        nu, s, count = dict(state["nu"]), dict(state["s"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g, x, k = _f64(g), _f64(params[p]), count[p]
            lam = (_at(learning_rate, k) + eps) * math.sqrt(k + 1)
            nu[p] = nu[p] + lam * g * g
            s[p] = s[p] + lam * g
            z = state["x0"][p] - s[p] / (np.cbrt(nu[p]) + eps)
            out[p] = c * x + (1 - c) * z - x
            count[p] = k + 1
        return out, {**state, "nu": nu, "s": s, "count": count}

    return Reference(init, update)


def madgrad(
    learning_rate: LR, momentum: float = 0.9, weight_decay: float = 0.0, eps: float = 1e-6
) -> Reference:
    """MADGRAD on the gradient plus `weight_decay * x`."""
    return chain(add_decayed_weights(weight_decay), scale_by_madgrad(learning_rate, momentum, eps))


def scale_by_acprop(
    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-16, eps_root: float = 1e-16
) -> Reference:
    """Zhuang et al. 2021: m = b1 m + (1 - b1) g; u = g / (sqrt(s_hat_prev) + eps) with
    s_hat_prev = s / (1 - b2^(t-1)) (1 at t = 1); then s = b2 s + (1 - b2)(g - m)^2 + eps_root."""
    b1, b2, eps, eps_root = f32(b1), f32(b2), f32(eps), f32(eps_root)

    def init(params: Flat) -> State:
        return {"m": _zeros(params), "s": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        m, s, count = dict(state["m"]), dict(state["s"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g, t = _f64(g), count[p]
            s_hat = 1.0 if t == 0 else s[p] / (1 - b2**t)
            out[p] = g / (np.sqrt(s_hat) + eps)
            m[p] = b1 * m[p] + (1 - b1) * g
            s[p] = b2 * s[p] + (1 - b2) * (g - m[p]) ** 2 + eps_root
            count[p] = t + 1
        return out, {"m": m, "s": s, "count": count}

    return Reference(init, update)


def acprop(
    learning_rate: LR,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-16,
    eps_root: float = 1e-16,
    weight_decay: float = 0.0,
    mask: Callable[[str], bool] | None = None,
) -> Reference:
    """x -= lr (acprop_direction(g) + wd x)."""
    return chain(
        scale_by_acprop(b1, b2, eps, eps_root),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def _at(value: LR, step: int) -> float:
    return value(step) if callable(value) else f32(value)


def scale_by_simplified_ademamix(
    b1: float = 0.99,
    b2: float = 0.95,
    alpha: LR = 0.0,
    eps: float = 1e-8,
    eps_root: float = 0.0,
) -> Reference:
    """m = b1 m + g (no 1 - b1); n = b2 n + (1 - b2) g^2; t counted per path;
    u = (m + alpha(t - 1) g) / (sqrt(n / (1 - b2^t) + eps_root) + eps)."""
    b1, b2, eps, eps_root = f32(b1), f32(b2), f32(eps), f32(eps_root)

    def init(params: Flat) -> State:
        return {"m": _zeros(params), "n": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        m, n, count = dict(state["m"]), dict(state["n"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            a = _at(alpha, count[p])
            m[p] = b1 * m[p] + g
            n[p] = b2 * n[p] + (1.0 - b2) * g * g
            count[p] += 1
            n_hat = n[p] / (1.0 - b2 ** count[p])
            out[p] = (m[p] + a * g) / (np.sqrt(n_hat + eps_root) + eps)
        return out, {"m": m, "n": n, "count": count}

    return Reference(init, update)


def simplified_ademamix(
    learning_rate: LR,
    weight_decay: float = 0.0,
    mask: Callable[[str], bool] | None = None,
    **kwargs,
) -> Reference:
    """p -= lr * (simplified_ademamix_direction(g) + wd * p)."""
    return chain(
        scale_by_simplified_ademamix(**kwargs),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )
