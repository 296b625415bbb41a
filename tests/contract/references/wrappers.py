"""References of the wrappers around an inner transformation: `accumulate`, `multi_steps`
with optax's options, `apply_every`, `apply_if_finite`, `lookahead` and the conditional
wrappers. Each takes the reference of its inner transformation.

`OptaxLookahead` is optax's lookahead in gradtx's convention, for the oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax

from references import Flat, Reference, State, _counts, _f64, _zeros, f32


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
