"""References of Schedule-Free learning, and its optax oracles.

The references follow Defazio et al., "The Road Less Scheduled" (arXiv:2405.15682), keeping
the three sequences the paper names explicitly (x, y, z), in float64, hyperparameters rounded
to float32 first as in the package module. Their states hold `x`, so tests read the reference
eval weights with `reference_eval_params`.

The optax oracles are `optax.contrib.schedule_free` around a base whose rate is the paper's:
optax calls the wrapper's rate with the step counted from 1 and its base optimizer's with the
step counted from 0, so its `schedule_free_sgd` with a warm-up takes a first step of rate 0,
and its `schedule_free_adamw` leaves Adam's bias correction out of the averaging weights
(tests/combinators/test_schedule_free.py pins both differences).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import optax

from references import Flat, Reference, State, _f64, f32


def _f(x: float) -> np.float32:
    """optax is fed float32 hyperparameters, like gradtx stores them."""
    return np.float32(x)


Rate = Callable[[int], float]


def warmup_rate(learning_rate: float, warmup_steps: int | None) -> Rate:
    """The paper's rate at step `t` (from 1): `lr * min(1, t / warmup_steps)`."""
    lr = f32(learning_rate)
    if not warmup_steps:
        return lambda t: lr
    return lambda t: lr * min(1.0, t / warmup_steps)


def _init(params: Flat) -> State:
    """x = z = y at the start; no step, weight or rate yet."""
    copies = {p: _f64(x).copy() for p, x in params.items()}
    z = {p: x.copy() for p, x in copies.items()}
    return {"x": copies, "z": z, "t": 0, "weight_sum": 0.0, "lr_max": 0.0}


def _step(state: State, steps: Flat, gamma: float, params: Flat, b1: float, power: float):
    """The paper's step once z's step is known: `z <- z + step`;
    `c = lr_max^p / sum_i lr_max_i^p` (lr_max the largest rate so far, `c = 0` while every
    weight is 0); `x <- (1 - c) x + c z`; `y <- b1 x + (1 - b1) z`. Returns the updates (the
    new y minus the old) and the new state."""
    lr_max = max(state["lr_max"], gamma)
    weight = lr_max**power
    weight_sum = state["weight_sum"] + weight
    c = weight / weight_sum if weight_sum > 0 else 0.0
    x, z, out = dict(state["x"]), dict(state["z"]), {}
    for p, step in steps.items():
        z[p] = z[p] + step
        x[p] = (1.0 - c) * x[p] + c * z[p]
        out[p] = b1 * x[p] + (1.0 - b1) * z[p] - _f64(params[p])
    new = {"x": x, "z": z, "t": state["t"] + 1, "weight_sum": weight_sum, "lr_max": lr_max}
    return out, {**state, **new}


def reference_eval_params(state: State) -> Flat:
    """The reference's average `x`, the weights to evaluate."""
    return dict(state["x"])


def schedule_free_sgd(
    learning_rate: float,
    warmup_steps: int | None = None,
    b1: float = 0.9,
    weight_decay: float | None = None,
    weight_lr_power: float = 2.0,
) -> Reference:
    """Schedule-Free SGD, the paper's Algorithm 1 with decay at y: at step `t` (from 1),
    `z <- z - gamma_t (g + wd * y)` with `gamma_t = lr min(1, t / warmup_steps)`."""
    wd = 0.0 if weight_decay is None else f32(weight_decay)
    rate = warmup_rate(learning_rate, warmup_steps)
    b1, power = f32(b1), f32(weight_lr_power)

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        gamma = rate(state["t"] + 1)
        steps = {p: -gamma * (_f64(g) + wd * _f64(params[p])) for p, g in grads.items()}
        return _step(state, steps, gamma, params, b1, power)

    return Reference(_init, update)


def schedule_free_adamw(
    learning_rate: float = 0.0025,
    warmup_steps: int | None = None,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    weight_lr_power: float = 2.0,
) -> Reference:
    """Schedule-Free AdamW, the paper's Algorithm 2: at step `t` (from 1),
    `v <- b2 v + (1 - b2) g^2`, `gamma_t = lr min(1, t / warmup_steps) sqrt(1 - b2^t)`,
    `z <- z - gamma_t (g / (sqrt(v) + eps) + wd * y)`, the averaging weights from `gamma_t`."""
    b2, eps, wd = f32(b2), f32(eps), f32(weight_decay)
    warm = warmup_rate(learning_rate, warmup_steps)
    b1, power = f32(b1), f32(weight_lr_power)

    def init(params: Flat) -> State:
        return {**_init(params), "v": {p: np.zeros(np.shape(x)) for p, x in params.items()}}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        t = state["t"] + 1
        gamma = warm(t) * math.sqrt(1.0 - b2**t)
        v, steps = dict(state["v"]), {}
        for p, g in grads.items():
            g = _f64(g)
            v[p] = b2 * v[p] + (1.0 - b2) * g * g
            steps[p] = -gamma * (g / (np.sqrt(v[p]) + eps) + wd * _f64(params[p]))
        return _step({**state, "v": v}, steps, gamma, params, b1, power)

    return Reference(init, update)


def around(base: Reference, rate: Rate, b1: float, weight_lr_power: float) -> Reference:
    """The wrapper around a base reference whose update is z's step; `rate(t)` is the
    wrapper's rate at step `t` from 1 (the base reference keeps its own counts)."""
    b1, power = f32(b1), f32(weight_lr_power)

    def init(params: Flat) -> State:
        return {**_init(params), "base": base.init(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        steps, base_state = base.update(grads, state["base"], params)
        gamma = rate(state["t"] + 1)
        return _step({**state, "base": base_state}, steps, gamma, params, b1, power)

    return Reference(init, update)


def optax_warmup(learning_rate: float, warmup_steps: int | None) -> Callable:
    """The paper's warm-up as an optax schedule of the step `t` counted from 1."""
    if not warmup_steps:
        return lambda t: _f(learning_rate)
    return optax.warmup_constant_schedule(0.0, _f(learning_rate), warmup_steps)


def optax_schedule_free_sgd(
    learning_rate: float, warmup_steps: int | None, b1: float, weight_decay: float, power: float
) -> optax.GradientTransformation:
    """optax's `schedule_free` around SGD whose rate at its step `k` (from 0) is the
    wrapper's at `k + 1`, as the paper has it."""
    rate = optax_warmup(learning_rate, warmup_steps)
    base = optax.chain(
        optax.add_decayed_weights(_f(weight_decay)), optax.sgd(lambda k: rate(k + 1))
    )
    return optax.contrib.schedule_free(base, rate, b1=_f(b1), weight_lr_power=_f(power))


def optax_schedule_free_adamw(
    learning_rate: float,
    warmup_steps: int | None,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
    power: float,
) -> optax.GradientTransformation:
    """optax's `schedule_free` around RMS scaling, with Algorithm 2's rate (bias correction
    in the rate, so in the averaging weights too)."""
    warm = optax_warmup(learning_rate, warmup_steps)

    def rate(t):
        return warm(t) * np.sqrt(1 - _f(b2) ** np.float32(t)).astype(np.float32)

    base = optax.chain(
        optax.scale_by_rms(decay=_f(b2), eps=_f(eps), eps_in_sqrt=False),
        optax.add_decayed_weights(_f(weight_decay)),
        optax.scale_by_learning_rate(lambda k: rate(k + 1)),
    )
    return optax.contrib.schedule_free(base, rate, b1=_f(b1), weight_lr_power=_f(power))
