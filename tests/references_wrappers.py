"""Independent NumPy float64 references for the wrapper combinators.

Same conventions as `references.py`: flat dicts `{path: array}`, hyperparameters rounded to
float32 first, arithmetic in float64, written from the papers and gradtx's docstrings. Each
wrapper takes the reference of its inner transformation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from references import Flat, Reference, State, _f64, _zeros, f32


def accumulate(inner: Reference, every: int) -> Reference:
    """Sum the gradients of `every` calls; on the last one run `inner` on their mean.

    Calls that do not complete a cycle return zeros and leave `inner`'s state alone.
    """

    def init(params: Flat) -> State:
        return {"micro": 0, "acc": _zeros(params), "inner": inner.init(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        acc = dict(state["acc"])
        for p, g in grads.items():
            acc[p] = acc[p] + _f64(g)
        micro = state["micro"] + 1
        if micro < every:
            zeros = {p: np.zeros(np.shape(g)) for p, g in grads.items()}
            return zeros, {"micro": micro, "acc": acc, "inner": state["inner"]}
        mean = {p: acc[p] / every for p in grads}
        out, inner_state = inner.update(mean, state["inner"], params)
        for p in grads:
            acc[p] = np.zeros_like(acc[p])
        return out, {"micro": 0, "acc": acc, "inner": inner_state}

    return Reference(init, update)


def _finite(tree: Flat) -> bool:
    return all(bool(np.all(np.isfinite(_f64(x)))) for x in tree.values())


def apply_if_finite(inner: Reference, max_consecutive_errors: int) -> Reference:
    """Take `inner`'s step if the gradient and the update are finite; otherwise return zeros
    and keep `inner`'s old state, unless more than `max_consecutive_errors` steps in a row
    (this one included) were not finite."""

    def init(params: Flat) -> State:
        return {"inner": inner.init(params), "bad_run": 0, "bad_total": 0}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        out, inner_state = inner.update(grads, state["inner"], params)
        ok = _finite(grads) and _finite(out)
        bad_run = 0 if ok else state["bad_run"] + 1
        bad_total = state["bad_total"] + (0 if ok else 1)
        if not ok and bad_run <= max_consecutive_errors:
            out = {p: np.zeros(np.shape(u)) for p, u in out.items()}
            inner_state = state["inner"]
        return out, {"inner": inner_state, "bad_run": bad_run, "bad_total": bad_total}

    return Reference(init, update)


def lookahead(fast: Reference, sync_period: int, alpha: float) -> Reference:
    """Lookahead (Zhang et al., 2019) with the slow weights in the state.

    Each path counts its steps; at every `sync_period`-th one, with fast weight
    `theta' = theta + u`: `slow += alpha * (theta' - slow)` and the update moves the param
    to the new slow weight, `u' = slow - theta`.
    """
    a = f32(alpha)

    def init(params: Flat) -> State:
        return {
            "fast": fast.init(params),
            "slow": {p: _f64(x).copy() for p, x in params.items()},
            "count": {p: 0 for p in params},
        }

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        out, fast_state = fast.update(grads, state["fast"], params)
        slow, count = dict(state["slow"]), dict(state["count"])
        for p in grads:
            count[p] += 1
            if count[p] % sync_period == 0:
                theta = _f64(params[p])
                slow[p] = slow[p] + a * (theta + out[p] - slow[p])
                out[p] = slow[p] - theta
        return out, {"fast": fast_state, "slow": slow, "count": count}

    return Reference(init, update)


def _conditional(
    inner: Reference, should_transform: Callable[[int], bool], zero_skipped: bool
) -> Reference:
    def init(params: Flat) -> State:
        return {"step": 0, "inner": inner.init(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        step = state["step"]
        if should_transform(step):
            out, inner_state = inner.update(grads, state["inner"], params)
        elif zero_skipped:
            out, inner_state = {p: np.zeros(np.shape(g)) for p, g in grads.items()}, state["inner"]
        else:
            out, inner_state = {p: _f64(g) for p, g in grads.items()}, state["inner"]
        return out, {"step": step + 1, "inner": inner_state}

    return Reference(init, update)


def conditionally_transform(inner: Reference, should_transform: Callable[[int], bool]) -> Reference:
    """`inner` at the calls `n` (from 0) where `should_transform(n)`; the gradient otherwise."""
    return _conditional(inner, should_transform, zero_skipped=False)


def conditionally_mask(inner: Reference, should_transform: Callable[[int], bool]) -> Reference:
    """`inner` at the calls `n` (from 0) where `should_transform(n)`; zeros otherwise."""
    return _conditional(inner, should_transform, zero_skipped=True)


# --- optax in gradtx's conventions (oracles) ---------------------------------------------------


class OptaxLookahead:
    """optax's lookahead in gradtx's convention, as the oracle.

    optax keeps `LookaheadParams(fast, slow)` as the params and returns updates for both; here
    the params are the fast weights and the slow ones live in the state. The adapter keeps the
    slow weights next to optax's state, hands optax `LookaheadParams(fast=params, slow=slow)`,
    returns the fast updates and adds the slow updates to its slow weights.
    """

    def __init__(self, inner: Any, sync_period: int, alpha: Any) -> None:
        self.inner = optax.lookahead(inner, sync_period, alpha)

    def init(self, params: Any) -> Any:
        synced = optax.LookaheadParams.init_synced(params)
        return self.inner.init(synced), params

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        inner_state, slow = state
        both = optax.LookaheadParams(fast=params, slow=slow)
        out, inner_state = self.inner.update(updates, inner_state, both)
        slow = jax.tree.map(lambda s, u: s + u, slow, out.slow)
        return out.fast, (inner_state, slow)
