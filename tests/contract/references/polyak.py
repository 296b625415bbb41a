"""References of the Polyak step size (`scale_by_polyak`, `polyak_sgd`), which reads the
loss: the references take `loss(params) -> float` and call it with each update's params.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from references import Flat, Reference, State, _f64, _no_state, chain, f32, scale_by_learning_rate


def _sq_norm(grads: Flat) -> float:
    return float(sum(np.sum(_f64(g) ** 2) for g in grads.values()))


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


def polyak_sgd(loss: Callable[[Flat], float], max_learning_rate: float = 1.0) -> Reference:
    """p -= polyak_step * g."""
    return chain(
        scale_by_polyak(loss, max_learning_rate=max_learning_rate), scale_by_learning_rate(1.0)
    )
