"""Independent NumPy float64 references for sign-based and miscellaneous transformations.

Same conventions as `references.py`: flat dicts `{path: array}`, hyperparameters rounded to
float32 first, arithmetic in float64, written from the papers and gradtx's docstrings.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import jax
import numpy as np
from references import (
    Flat,
    Reference,
    State,
    _counts,
    _f64,
    _no_state,
    _stateless,
    _zeros,
    add_decayed_weights,
    chain,
    f32,
    scale,
    scale_by_learning_rate,
    trace,
)

LR = float | Callable[[int], float]


def _sq_norm(grads: Flat) -> float:
    return float(sum(np.sum(_f64(g) ** 2) for g in grads.values()))


def scale_by_lion(b1: float = 0.9, b2: float = 0.99) -> Reference:
    """u = sign(b1 m + (1 - b1) g) with the old m; then m = b2 m + (1 - b2) g."""
    b1, b2 = f32(b1), f32(b2)

    def init(params: Flat) -> State:
        return {"mu": _zeros(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, out = dict(state["mu"]), {}
        for p, g in grads.items():
            g = _f64(g)
            out[p] = np.sign(b1 * mu[p] + (1.0 - b1) * g)
            mu[p] = b2 * mu[p] + (1.0 - b2) * g
        return out, {"mu": mu}

    return Reference(init, update)


def scale_by_sign() -> Reference:
    """u = sign(g)."""
    return _stateless(lambda p, g, params: np.sign(g))


def scale_by_rprop(
    learning_rate: float,
    eta_minus: float = 0.5,
    eta_plus: float = 1.2,
    min_step: float = 1e-6,
    max_step: float = 50.0,
) -> Reference:
    """iRprop-, element by element, with explicit branches."""
    lr, em, ep, lo, hi = (f32(x) for x in (learning_rate, eta_minus, eta_plus, min_step, max_step))

    def init(params: Flat) -> State:
        return {
            "step": {p: np.full(np.shape(x), lr) for p, x in params.items()},
            "prev": _zeros(params),
        }

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        steps, prevs, out = dict(state["step"]), dict(state["prev"]), {}
        for p, g in grads.items():
            g = _f64(g).reshape(-1)
            step = steps[p].reshape(-1).copy()
            prev = prevs[p].reshape(-1).copy()
            u = np.zeros_like(g)
            for i in range(g.size):
                s = g[i] * prev[i]
                if s > 0:
                    step[i] = min(max(step[i] * ep, lo), hi)
                elif s < 0:
                    step[i] = min(max(step[i] * em, lo), hi)
                u[i] = 0.0 if s < 0 else step[i] * np.sign(g[i])
            shape = np.shape(steps[p])
            steps[p], prevs[p], out[p] = step.reshape(shape), u.reshape(shape), u.reshape(shape)
        return out, {"step": steps, "prev": prevs}

    return Reference(init, update)


def scale_by_polyak(
    loss: Callable[[Flat], float],
    f_min: float = 0.0,
    max_learning_rate: float = 1.0,
    eps: float = 0.0,
    variant: str = "sps",
) -> Reference:
    """u = min((f - f*) / (||g||^2 + eps), max_lr) g, with f = loss(params)."""
    f_min, max_lr, eps = f32(f_min), f32(max_learning_rate), f32(eps)

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        gap = loss(params) - f_min
        if variant == "sps+":
            gap = max(gap, 0.0)
        denominator = _sq_norm(grads) + eps
        step = 0.0 if denominator <= 2.0**-52 else min(gap / denominator, max_lr)
        return {p: step * _f64(g) for p, g in grads.items()}, state

    return Reference(_no_state, update)


def ema(decay: float, debias: bool = True) -> Reference:
    """e = d e + (1 - d) g; u = e / (1 - d^t) with debias, else e."""
    d = f32(decay)

    def init(params: Flat) -> State:
        return {"ema": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        e, count, out = dict(state["ema"]), dict(state["count"]), {}
        for p, g in grads.items():
            e[p] = d * e[p] + (1.0 - d) * _f64(g)
            count[p] += 1
            out[p] = e[p] / (1.0 - d ** count[p]) if debias else e[p]
        return out, {"ema": e, "count": count}

    return Reference(init, update)


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


def scale_by_optimistic_gradient(alpha: float = 1.0, beta: float = 1.0) -> Reference:
    """u = (alpha + beta) g - beta g_prev, g_prev = g at a path's first step."""
    a, b = f32(alpha), f32(beta)

    def init(params: Flat) -> State:
        return {"prev": {p: None for p in params}}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        prev, out = dict(state["prev"]), {}
        for p, g in grads.items():
            g = _f64(g)
            last = g if prev[p] is None else prev[p]
            out[p] = (a + b) * g - b * last
            prev[p] = g
        return out, {"prev": prev}

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


# --- optimizers ---------------------------------------------------------------------------------


def lion(
    learning_rate: LR,
    b1: float = 0.9,
    b2: float = 0.99,
    weight_decay: float = 1e-3,
    mask: Callable[[str], bool] | None = None,
) -> Reference:
    """p -= lr * (sign-momentum + wd * p)."""
    return chain(
        scale_by_lion(b1, b2),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def sign_sgd(learning_rate: LR) -> Reference:
    """p -= lr * sign(g)."""
    return chain(scale_by_sign(), scale_by_learning_rate(learning_rate))


def signum(learning_rate: LR, beta: float = 0.9) -> Reference:
    """p -= lr * sign(ema(g))."""
    return chain(ema(beta, debias=False), scale_by_sign(), scale_by_learning_rate(learning_rate))


def rprop(learning_rate: float, eta_minus: float = 0.5, eta_plus: float = 1.2) -> Reference:
    """p -= rprop_step."""
    return chain(scale_by_rprop(learning_rate, eta_minus, eta_plus), scale(-1.0))


def noisy_sgd(learning_rate: LR, eta: float = 0.01, gamma: float = 0.55, seed: int = 0):
    """p -= lr * (g + noise)."""
    return chain(add_noise(eta, gamma, seed), scale_by_learning_rate(learning_rate))


def polyak_sgd(loss: Callable[[Flat], float], max_learning_rate: float = 1.0) -> Reference:
    """p -= polyak_step * g."""
    return chain(
        scale_by_polyak(loss, max_learning_rate=max_learning_rate), scale_by_learning_rate(1.0)
    )


def optimistic_gradient_descent(learning_rate: LR, alpha: float = 1.0, beta: float = 1.0):
    """p -= lr * ((alpha + beta) g - beta g_prev)."""
    return chain(scale_by_optimistic_gradient(alpha, beta), scale_by_learning_rate(learning_rate))


def novograd(learning_rate: LR, b1: float = 0.9, b2: float = 0.25, eps: float = 1e-6):
    """p -= lr * novograd_momentum."""
    return chain(scale_by_novograd(b1, b2, eps), scale_by_learning_rate(learning_rate))


def nesterov(learning_rate: LR, momentum: float = 0.9) -> Reference:
    """p -= lr * (g + mu * t), t = g + mu * t."""
    return chain(trace(momentum, nesterov=True), scale_by_learning_rate(learning_rate))
