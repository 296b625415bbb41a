"""Independent NumPy float64 references for gradtx.contrib: reduce_on_plateau, MADGRAD,
Mechanic, MoMo, MoMo-Adam and ACProp.

Same conventions as `references.py`: flat dicts `{path: array}`, hyperparameters rounded to
float32 first, arithmetic in float64, one loop over paths. Each is written from the paper's
update rule (and the formulas of gradtx.contrib's docstrings); global quantities are sums
over every path of the flat dict. Methods that read the loss take `loss(params) -> float`
and call it with the params of each update.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from references import (
    Flat,
    Reference,
    State,
    _counts,
    _f64,
    _zeros,
    add_decayed_weights,
    chain,
    f32,
    scale_by_learning_rate,
)

LR = float | Callable[[int], float]
Loss = Callable[[Flat], float]


def _at(value: LR, step: int) -> float:
    return value(step) if callable(value) else f32(value)


def _dot(a: Flat, b: Flat) -> float:
    return float(sum(np.sum(_f64(a[p]) * _f64(b[p])) for p in a))


# --- reduce on plateau --------------------------------------------------------------------------


def reduce_on_plateau(
    loss: Loss,
    factor: float = 0.1,
    patience: int = 10,
    rtol: float = 1e-4,
    atol: float = 0.0,
    cooldown: int = 0,
    accumulation_size: int = 1,
    min_scale: float = 0.0,
) -> Reference:
    """Average `accumulation_size` losses; a window whose mean is not below
    `(1 - rtol) best - atol` counts towards a plateau; `patience` such windows multiply the
    scale by `factor` (not below `min_scale`) and start `cooldown` windows of rest. u = s g."""
    factor, rtol, atol, min_scale = f32(factor), f32(rtol), f32(atol), f32(min_scale)

    def init(params: Flat) -> State:
        return {"scale": 1.0, "best": math.inf, "plateau": 0, "cooldown": 0, "values": []}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        state = {**state, "values": [*state["values"], loss(params)]}
        if len(state["values"]) == accumulation_size:
            mean = sum(state["values"]) / accumulation_size
            state["values"] = []
            if mean < (1 - rtol) * state["best"] - atol:
                state["best"], state["plateau"] = mean, 0
            else:
                state["plateau"] += 1
            if state["cooldown"] > 0:
                state["cooldown"] -= 1
                state["plateau"] = 0
            else:
                if state["plateau"] == patience:
                    state["scale"] *= factor
                    state["plateau"], state["cooldown"] = 0, cooldown
                state["scale"] = max(state["scale"], min_scale)
        return {p: state["scale"] * _f64(g) for p, g in grads.items()}, state

    return Reference(init, update)


# --- MADGRAD ------------------------------------------------------------------------------------


def scale_by_madgrad(learning_rate: LR, momentum: float = 0.9, eps: float = 1e-6) -> Reference:
    """Defazio & Jelassi: lam = (lr + eps) sqrt(k + 1); nu += lam g^2; s += lam g;
    z = x0 - s / (cbrt(nu) + eps); x_new = c x + (1 - c) z (k per path)."""
    c, eps = f32(momentum), f32(eps)

    def init(params: Flat) -> State:
        x0 = {p: _f64(x).copy() for p, x in params.items()}
        return {"nu": _zeros(params), "s": _zeros(params), "x0": x0, "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        nu, s, count = dict(state["nu"]), dict(state["s"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g, x, k = _f64(g), _f64(params[p]), count[p]
            lam = (_at(learning_rate, k) + eps) * math.sqrt(k + 1)
            nu[p] = nu[p] + lam * g * g
            s[p] = s[p] + lam * g
            z = state["x0"][p] - s[p] / (np.cbrt(nu[p]) + eps)
            out[p] = c * x + (1 - c) * z - x
            count[p] = k + 1
        return out, {**state, "nu": nu, "s": s, "count": count}

    return Reference(init, update)


def madgrad(
    learning_rate: LR, momentum: float = 0.9, weight_decay: float = 0.0, eps: float = 1e-6
) -> Reference:
    """MADGRAD on the gradient plus `weight_decay * x`."""
    return chain(add_decayed_weights(weight_decay), scale_by_madgrad(learning_rate, momentum, eps))


# --- Mechanic -----------------------------------------------------------------------------------


def mechanize(
    base: Reference,
    weight_decay: float = 1e-2,
    eps: float = 1e-8,
    s_init: float = 1e-6,
    num_betas: int = 6,
) -> Reference:
    """Cutkosky, Defazio & Mehta: x = x0 - S delta; delta -= u_base; bettors i = 1..n with
    beta_i = 1 - 10^-i bet on h = <g + wd S |g| / (|x| + eps) x, delta>."""
    wd, eps, s_init = f32(weight_decay), f32(eps), f32(s_init)
    betas = np.array([f32(1 - 0.1**i) for i in range(1, num_betas + 1)])

    def init(params: Flat) -> State:
        zero = np.zeros(num_betas)
        return {"base": base.init(params), "x0": None, "r": zero, "m": zero, "v": zero,
                "s": np.full(num_betas, s_init)}  # fmt: skip

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        base_u, base_state = base.update(grads, state["base"], params)
        x = {p: _f64(params[p]) for p in grads}
        x0 = state["x0"] if state["x0"] is not None else {p: v.copy() for p, v in x.items()}
        total = float(np.sum(state["s"]))
        delta = {p: (x0[p] - x[p]) / (total + eps) for p in grads}
        g = {p: _f64(v) for p, v in grads.items()}
        g_norm, x_norm = math.sqrt(_dot(g, g)), math.sqrt(_dot(x, x))
        coef = wd * total * g_norm / (x_norm + eps)
        h = _dot({p: g[p] + coef * x[p] for p in g}, delta)
        clipped = np.clip(h, -state["m"], state["m"])
        m = np.maximum(betas * state["m"], abs(h) + eps)
        v = betas**2 * state["v"] + h * h
        r = betas * state["r"] + clipped * state["s"]
        s = (s_init / num_betas * m + np.maximum(r, 0.0)) / (np.sqrt(v) + eps)
        new_total = float(np.sum(s))
        out = {p: x0[p] - new_total * (delta[p] - base_u[p]) - x[p] for p in grads}
        return out, {"base": base_state, "x0": x0, "r": r, "m": m, "v": v, "s": s}

    return Reference(init, update)


# --- MoMo and MoMo-Adam ---------------------------------------------------------------------------


def _momo_step(
    alpha: float,
    rho: float,
    barf: float,
    gamma: float,
    dx: float,
    norm: float,
    lb: float,
    bc1: float,
    lower_bound: float,
    adapt: bool,
) -> tuple[float, float]:
    """Schaipp et al., Lemma 3.1 with the MoMo* bound: (tau, the next lower bound)."""
    if adapt:
        cap = rho * (barf - gamma) + dx
        if cap < rho * bc1 * lb:
            lb = max(cap / (2 * bc1 * rho), lower_bound)
    t1 = (
        0.0
        if norm <= np.finfo(np.float64).eps
        else max(rho * (barf - bc1 * lb - gamma) + dx, 0) / norm
    )
    tau = min(alpha / bc1, t1)
    if adapt:
        lb = max((barf + dx - gamma - 0.5 * tau * norm) / bc1, lower_bound)
    return tau, lb


def momo(
    loss: Loss,
    learning_rate: LR = 1.0,
    beta: float = 0.9,
    lower_bound: float = 0.0,
    weight_decay: float = 0.0,
    adapt_lower_bound: bool = False,
) -> Reference:
    """MoMo (Schaipp et al. 2024, Algorithm 1 with the proximal weight decay): averages of
    the loss, the gradients and <g, x> (started at their first values); x_new =
    (x - tau d) / (1 + alpha wd)."""
    beta, f_star, wd = f32(beta), f32(lower_bound), f32(weight_decay)

    def init(params: Flat) -> State:
        return {"d": _zeros(params), "barf": 0.0, "gamma": 0.0, "lb": f_star, "k": 0}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        k = state["k"]
        b = 0.0 if k == 0 else beta
        x = {p: _f64(params[p]) for p in grads}
        d = dict(state["d"])
        for p, g in grads.items():
            d[p] = b * d[p] + (1 - b) * _f64(g)
        present = {p: d[p] for p in grads}
        barf = b * state["barf"] + (1 - b) * loss(params)
        gamma = b * state["gamma"] + (1 - b) * _dot(grads, x)
        alpha = _at(learning_rate, k)
        rho = 1 + alpha * wd
        tau, lb = _momo_step(
            alpha, rho, barf, gamma, _dot(present, x), _dot(present, present), state["lb"], 1.0,
            f_star, adapt_lower_bound,
        )  # fmt: skip
        out = {p: (x[p] - tau * d[p]) / rho - x[p] for p in grads}
        return out, {"d": d, "barf": barf, "gamma": gamma, "lb": lb, "k": k + 1}

    return Reference(init, update)


def momo_adam(
    loss: Loss,
    learning_rate: LR = 1e-2,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    lower_bound: float = 0.0,
    weight_decay: float = 0.0,
    adapt_lower_bound: bool = False,
) -> Reference:
    """MoMo-Adam (Schaipp et al. 2024, Algorithm 2): Adam's d / D direction, averages from
    zero with bias corrections, x_new = (x - tau d / D) / (1 + alpha wd)."""
    b1, b2, eps = f32(b1), f32(b2), f32(eps)
    f_star, wd = f32(lower_bound), f32(weight_decay)

    def init(params: Flat) -> State:
        return {"d": _zeros(params), "v": _zeros(params), "barf": 0.0, "gamma": 0.0,
                "lb": f_star, "k": 0}  # fmt: skip

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        k = state["k"] + 1
        x = {p: _f64(params[p]) for p in grads}
        d, v = dict(state["d"]), dict(state["v"])
        for p, g in grads.items():
            g = _f64(g)
            d[p] = b1 * d[p] + (1 - b1) * g
            v[p] = b2 * v[p] + (1 - b2) * g * g
        precond = {p: eps + np.sqrt(v[p] / (1 - b2**k)) for p in grads}
        present = {p: d[p] for p in grads}
        barf = b1 * state["barf"] + (1 - b1) * loss(params)
        gamma = b1 * state["gamma"] + (1 - b1) * _dot(grads, x)
        alpha = _at(learning_rate, k - 1)
        rho = 1 + alpha * wd
        norm = _dot(present, {p: d[p] / precond[p] for p in grads})
        tau, lb = _momo_step(
            alpha, rho, barf, gamma, _dot(present, x), norm, state["lb"], 1 - b1**k, f_star,
            adapt_lower_bound,
        )  # fmt: skip
        out = {p: (x[p] - tau * d[p] / precond[p]) / rho - x[p] for p in grads}
        return out, {"d": d, "v": v, "barf": barf, "gamma": gamma, "lb": lb, "k": k}

    return Reference(init, update)


# --- ACProp -------------------------------------------------------------------------------------


def scale_by_acprop(
    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-16, eps_root: float = 1e-16
) -> Reference:
    """Zhuang et al. 2021: m = b1 m + (1 - b1) g; u = g / (sqrt(s_hat_prev) + eps) with
    s_hat_prev = s / (1 - b2^(t-1)) (1 at t = 1); then s = b2 s + (1 - b2)(g - m)^2 + eps_root."""
    b1, b2, eps, eps_root = f32(b1), f32(b2), f32(eps), f32(eps_root)

    def init(params: Flat) -> State:
        return {"m": _zeros(params), "s": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        m, s, count = dict(state["m"]), dict(state["s"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g, t = _f64(g), count[p]
            s_hat = 1.0 if t == 0 else s[p] / (1 - b2**t)
            out[p] = g / (np.sqrt(s_hat) + eps)
            m[p] = b1 * m[p] + (1 - b1) * g
            s[p] = b2 * s[p] + (1 - b2) * (g - m[p]) ** 2 + eps_root
            count[p] = t + 1
        return out, {"m": m, "s": s, "count": count}

    return Reference(init, update)


def acprop(
    learning_rate: LR,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-16,
    eps_root: float = 1e-16,
    weight_decay: float = 0.0,
    mask: Callable[[str], bool] | None = None,
) -> Reference:
    """x -= lr (acprop_direction(g) + wd x)."""
    return chain(
        scale_by_acprop(b1, b2, eps, eps_root),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )
