"""References of the sign-based methods: Lion (with its soft modes), sign descent, signum
and Rprop.

Same conventions as the package module: flat dicts, float32 hyperparameters, float64 math.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from references import (
    LR,
    Flat,
    Reference,
    State,
    _f64,
    _stateless,
    _zeros,
    add_decayed_weights,
    chain,
    f32,
    scale,
    scale_by_learning_rate,
)
from references.momentum import ema


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
