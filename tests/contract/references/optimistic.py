"""References of the optimistic methods: optimistic gradient descent and optimistic Adam,
which extrapolate with the previous gradient.

Same conventions as the package module: flat dicts, float32 hyperparameters, float64 math.
"""

from __future__ import annotations

from references import (
    LR,
    Flat,
    Reference,
    State,
    _f64,
    chain,
    f32,
    scale,
    scale_by_adam,
    scale_by_learning_rate,
)


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


def optimistic_gradient_descent(learning_rate: LR, alpha: float = 1.0, beta: float = 1.0):
    """p -= lr * ((alpha + beta) g - beta g_prev)."""
    return chain(scale_by_optimistic_gradient(alpha, beta), scale_by_learning_rate(learning_rate))
