"""Independent NumPy float64 references for `multi_steps` with optax's options and the
transformations made from functions (`stateless`, `stateless_with_tree_map`).

Same conventions as `references.py`: flat dicts `{path: array}`, hyperparameters rounded to
float32 first, arithmetic in float64, written from gradtx's docstrings.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from references import Flat, Reference, State, _f64, _zeros


def multi_steps(
    inner: Reference,
    every_k: Callable[[int], int],
    skip: Callable[[Flat], bool] | None = None,
    use_grad_mean: bool = True,
) -> Reference:
    """Accumulate the accepted gradients; on the `every_k(t)`-th accepted call of a cycle
    (`t` the inner steps taken) run `inner` on their mean (or sum). A call that `skip`
    rejects returns zeros and changes nothing."""

    def init(params: Flat) -> State:
        return {"micro": 0, "t": 0, "acc": _zeros(params), "inner": inner.init(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        zeros = {p: np.zeros(np.shape(g)) for p, g in grads.items()}
        if skip is not None and skip(grads):
            return zeros, state
        acc = dict(state["acc"])
        for p, g in grads.items():
            acc[p] = acc[p] + _f64(g)
        micro = state["micro"] + 1
        if micro < max(int(round(every_k(state["t"]))), 1):
            return zeros, {**state, "micro": micro, "acc": acc}
        total = {p: acc[p] / micro if use_grad_mean else acc[p] for p in grads}
        out, inner_state = inner.update(total, state["inner"], params)
        for p in grads:
            acc[p] = np.zeros_like(acc[p])
        return out, {"micro": 0, "t": state["t"] + 1, "acc": acc, "inner": inner_state}

    return Reference(init, update)


def any_not_finite(grads: Flat) -> bool:
    """`skip_not_finite`'s verdict: some element is a NaN or an infinity."""
    return any(not np.all(np.isfinite(_f64(g))) for g in grads.values())


def stateless(f: Callable[[Flat, Flat], Flat]) -> Reference:
    """`u = f(g, params)` for the whole (flat) tree; no state."""

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        return f({p: _f64(g) for p, g in grads.items()}, params), state

    return Reference(lambda params: {}, update)


def stateless_with_tree_map(f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Reference:
    """`u_p = f(g_p, params_p)` for every present path; no state."""

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        return {p: f(_f64(g), _f64(params[p])) for p, g in grads.items()}, state

    return Reference(lambda params: {}, update)
