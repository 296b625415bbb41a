"""References of gradtx.contrib's second-order methods: Hutchinson's estimator of the
Hessian's diagonal and Sophia.

Sophia's reference takes the Hessian's diagonal as a function of the params: on the contract's
separable quadratic Hutchinson's estimate is that diagonal exactly, whatever the signs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from references import (
    LR,
    Flat,
    Reference,
    State,
    _counts,
    _f64,
    _no_state,
    _zeros,
    add_decayed_weights,
    chain,
    f32,
    scale_by_learning_rate,
)

Diagonal = Callable[[Flat], Flat]


def hessian_diagonal(diagonal: Diagonal) -> Reference:
    """u_p = diag(H)_p at the present paths (Hutchinson's estimate of a diagonal Hessian)."""

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        diag = diagonal(params)
        return {p: _f64(diag[p]) for p in grads}, state

    return Reference(_no_state, update)


def scale_by_sophia(
    diagonal: Diagonal,
    b1: float = 0.965,
    b2: float = 0.99,
    eps: float = 1e-8,
    gamma: float = 0.01,
    clip_threshold: float | None = 1.0,
    update_interval: int = 10,
) -> Reference:
    """m = b1 m + (1 - b1) g; u = clip(m / (1 - b1^t) / max(gamma h, eps), +-rho) with the
    previous h; then, when (t - 1) % k == 0, h = b2 h + (1 - b2) diag(H)."""
    b1, b2, eps, gamma = f32(b1), f32(b2), f32(eps), f32(gamma)
    rho = None if clip_threshold is None else f32(clip_threshold)

    def init(params: Flat) -> State:
        return {"mu": _zeros(params), "nu": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, nu, count = dict(state["mu"]), dict(state["nu"]), dict(state["count"])
        due = [p for p in grads if count[p] % update_interval == 0]
        diag = diagonal(params) if due else {}
        out = {}
        for p, g in grads.items():
            mu[p] = b1 * mu[p] + (1.0 - b1) * _f64(g)
            t = count[p] + 1
            u = mu[p] / (1.0 - b1**t) / np.maximum(gamma * nu[p], eps)
            out[p] = u if rho is None else np.clip(u, -rho, rho)
            if p in due:
                nu[p] = b2 * nu[p] + (1.0 - b2) * _f64(diag[p])
            count[p] = t
        return out, {"mu": mu, "nu": nu, "count": count}

    return Reference(init, update)


def sophia(
    learning_rate: LR,
    diagonal: Diagonal,
    weight_decay: float = 1e-4,
    mask: Callable[[str], bool] | None = None,
    **kwargs,
) -> Reference:
    """p -= lr * (sophia_direction(g) + wd * p)."""
    return chain(
        scale_by_sophia(diagonal, **kwargs),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )
