"""References of the momentum methods beyond `trace` and `sgd` (which are in the package
module): the exponential moving average `ema` and the `nesterov` optimizer.
"""

from __future__ import annotations

from references import (
    LR,
    Flat,
    Reference,
    State,
    _counts,
    _f64,
    _zeros,
    chain,
    f32,
    scale_by_learning_rate,
    trace,
)


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


def nesterov(learning_rate: LR, momentum: float = 0.9) -> Reference:
    """p -= lr * (g + mu * t), t = g + mu * t."""
    return chain(trace(momentum, nesterov=True), scale_by_learning_rate(learning_rate))
