"""Independent NumPy references for gradtx's transformations, in float64.

Each function returns a `Reference`: an `(init, update)` pair over flat dicts `{path: array}`
of params and gradients (`None` leaves are left out). The math follows the papers and the
formulas in gradtx's docstrings; it is written here from scratch, one loop over paths each.

gradtx stores numeric hyperparameters as float32, so every hyperparameter is first rounded to
float32 (`f32(0.999)`); the arithmetic itself then runs in float64, which makes the reference
a slightly *more* accurate version of what gradtx computes.

This package module holds those conventions, the schedules and the elementary transformations
the family modules compose (scale, trace, weight decay, clipping, Adam, SGD, `chain`), and the
optimizer assembly (`_opt`: a rescaling, weight decay, the learning rate) several families
share. The family modules next to it follow the same conventions; none imports gradtx.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

Flat = dict[str, np.ndarray]
State = dict[str, Any]
# A learning rate: a number, or a schedule of the step.
LR = float | Callable[[int], float]


def f32(x: float) -> float:
    """`x` rounded to float32, as a Python float (gradtx's hyperparameters are float32)."""
    return float(np.float32(x))


class Reference(NamedTuple):
    """`init(params) -> state`, `update(grads, state, params) -> (updates, state)`."""

    init: Callable[[Flat], State]
    update: Callable[[Flat, State, Flat], tuple[Flat, State]]


def _f64(x: Any) -> np.ndarray:
    return np.asarray(x, np.float64)


def _no_state(params: Flat) -> State:
    return {}


def _zeros(params: Flat) -> dict[str, np.ndarray]:
    return {p: np.zeros(np.shape(x), np.float64) for p, x in params.items()}


def _counts(params: Flat) -> dict[str, int]:
    return {p: 0 for p in params}


def _stateless(fn: Callable[[str, np.ndarray, Flat], np.ndarray]) -> Reference:
    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        return {p: fn(p, _f64(g), params) for p, g in grads.items()}, state

    return Reference(_no_state, update)


# --- schedules (from the formulas in gradtx.schedules' docstrings) ------------------------------


def linear_schedule(init_value: float, end_value: float, steps: int) -> Callable[[int], float]:
    """`v(t) = (v0 - v1) * (1 - min(t, T) / T) + v1`."""
    v0, v1 = f32(init_value), f32(end_value)

    def schedule(t: int) -> float:
        frac = 1.0 - min(max(t, 0), steps) / steps
        return (v0 - v1) * frac + v1

    return schedule


def cosine_decay_schedule(init_value: float, steps: int, alpha: float) -> Callable[[int], float]:
    """`v(t) = v0 * ((1 - alpha) * c + alpha)`, `c = (1 + cos(pi * min(t, T) / T)) / 2`."""
    v0, a = f32(init_value), f32(alpha)

    def schedule(t: int) -> float:
        c = 0.5 * (1.0 + math.cos(math.pi * min(max(t, 0), steps) / steps))
        return v0 * ((1.0 - a) * c + a)

    return schedule


# --- transformations ----------------------------------------------------------------------------


def identity() -> Reference:
    """`u = g`."""
    return _stateless(lambda p, g, params: g)


def set_to_zero() -> Reference:
    """`u = 0`."""
    return _stateless(lambda p, g, params: np.zeros_like(g))


def scale(step_size: float) -> Reference:
    """`u = step_size * g`."""
    s = f32(step_size)
    return _stateless(lambda p, g, params: s * g)


def scale_by_schedule(schedule: Callable[[int], float]) -> Reference:
    """`u = schedule(n_p) * g` with `n_p` the number of earlier updates of path `p`."""

    def init(params: Flat) -> State:
        return {"count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        counts = dict(state["count"])
        out = {}
        for p, g in grads.items():
            out[p] = schedule(counts[p]) * _f64(g)
            counts[p] += 1
        return out, {"count": counts}

    return Reference(init, update)


def scale_by_learning_rate(
    learning_rate: float | Callable[[int], float], flip_sign: bool = True
) -> Reference:
    """`u = -lr * g` (`+lr * g` without `flip_sign`); `lr` a constant or a schedule."""
    sign = -1.0 if flip_sign else 1.0
    if callable(learning_rate):
        schedule = learning_rate
        return scale_by_schedule(lambda t: sign * schedule(t))
    lr = f32(learning_rate)
    return _stateless(lambda p, g, params: sign * lr * g)


def trace(decay: float, nesterov: bool = False) -> Reference:
    """Heavy ball: `t = g + decay * t`, `u = t`; Nesterov: `u = g + decay * t` (new `t`)."""
    d = f32(decay)

    def init(params: Flat) -> State:
        return {"trace": _zeros(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        traces = dict(state["trace"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            traces[p] = g + d * traces[p]
            out[p] = g + d * traces[p] if nesterov else traces[p]
        return out, {"trace": traces}

    return Reference(init, update)


def add_decayed_weights(
    weight_decay: float, mask: Callable[[str], bool] | None = None
) -> Reference:
    """`u = g + wd * param` on the paths where `mask(path)` holds (all without a mask)."""
    wd = f32(weight_decay)

    def fn(p: str, g: np.ndarray, params: Flat) -> np.ndarray:
        if mask is not None and not mask(p):
            return g
        return g + wd * _f64(params[p])

    return _stateless(fn)


def clip(max_delta: float) -> Reference:
    """Each element clipped to `[-max_delta, max_delta]`."""
    m = f32(max_delta)
    return _stateless(lambda p, g, params: np.minimum(np.maximum(g, -m), m))


def clip_by_global_norm(max_norm: float) -> Reference:
    """`u = g * min(1, max_norm / ||g||)`, the norm over all leaves together."""
    m = f32(max_norm)

    def init(params: Flat) -> State:
        return {"global_norm": 0.0}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        norm = math.sqrt(sum(float(np.sum(_f64(g) ** 2)) for g in grads.values()))
        factor = 1.0 if norm < m else m / norm
        return {p: _f64(g) * factor for p, g in grads.items()}, {"global_norm": norm}

    return Reference(init, update)


def scale_by_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    nesterov: bool = False,
) -> Reference:
    """Adam's rescaling (Kingma & Ba, 2015), NAdam's with `nesterov` (Dozat, 2016).

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  t counted per path;
    m_hat = m / (1 - b1^t)  or, Nesterov,  b1 m / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t);
    v_hat = v / (1 - b2^t);  u = m_hat / (sqrt(v_hat + eps_root) + eps).
    """
    b1, b2, eps, eps_root = f32(b1), f32(b2), f32(eps), f32(eps_root)

    def init(params: Flat) -> State:
        return {"mu": _zeros(params), "nu": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, nu, count = dict(state["mu"]), dict(state["nu"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            mu[p] = b1 * mu[p] + (1.0 - b1) * g
            nu[p] = b2 * nu[p] + (1.0 - b2) * g * g
            count[p] += 1
            t = count[p]
            if nesterov:
                m_hat = b1 * mu[p] / (1.0 - b1 ** (t + 1)) + (1.0 - b1) * g / (1.0 - b1**t)
            else:
                m_hat = mu[p] / (1.0 - b1**t)
            v_hat = nu[p] / (1.0 - b2**t)
            out[p] = m_hat / (np.sqrt(v_hat + eps_root) + eps)
        return out, {"mu": mu, "nu": nu, "count": count}

    return Reference(init, update)


def chain(*refs: Reference) -> Reference:
    """The references applied in sequence; the state is a tuple of the children's states."""

    def init(params: Flat) -> State:
        return {"chain": tuple(r.init(params) for r in refs)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        states = []
        for r, s in zip(refs, state["chain"]):
            grads, s = r.update(grads, s, params)
            states.append(s)
        return grads, {"chain": tuple(states)}

    return Reference(init, update)


# --- optimizers ---------------------------------------------------------------------------------


def sgd(
    learning_rate: float | Callable[[int], float],
    momentum: float | None = None,
    nesterov: bool = False,
) -> Reference:
    """`p -= lr * g`, or with momentum `p -= lr * trace(g)`."""
    step = scale_by_learning_rate(learning_rate)
    if momentum is None:
        return step
    return chain(trace(momentum, nesterov), step)


def adam(
    learning_rate: float | Callable[[int], float],
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    nesterov: bool = False,
) -> Reference:
    """`p -= lr * adam_direction(g)`."""
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, nesterov), scale_by_learning_rate(learning_rate)
    )


def adamw(
    learning_rate: float | Callable[[int], float],
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    weight_decay: float = 1e-4,
    mask: Callable[[str], bool] | None = None,
    nesterov: bool = False,
) -> Reference:
    """AdamW (Loshchilov & Hutter, 2019): `p -= lr * (adam_direction(g) + wd * p)`."""
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, nesterov),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


# --- shared by the families: filled slots, an optimizer's assembly --------------------------------


def _filled(params: Flat, value: float) -> dict[str, np.ndarray]:
    return {p: np.full(np.shape(x), value, np.float64) for p, x in params.items()}


def _opt(rescale: Reference, learning_rate: LR, wd: float | None = None, mask=None) -> Reference:
    parts = [rescale]
    if wd is not None:
        parts.append(add_decayed_weights(wd, mask))
    return chain(*parts, scale_by_learning_rate(learning_rate))
