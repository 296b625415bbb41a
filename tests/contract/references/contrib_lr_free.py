"""References of gradtx.contrib's methods that set their own step size: COCOB,
D-Adaptation, Prodigy, DoG and DoWG, Mechanic, MoMo and MoMo-Adam, and reduce_on_plateau.

Global quantities (D-Adaptation's estimate, DoG's distance) are sums over every path of the
flat dict. Methods that read the loss take `loss(params) -> float` and call it with the params
of each update. Same conventions as the package module.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from references import (
    LR,
    Flat,
    Reference,
    State,
    _f64,
    _zeros,
    add_decayed_weights,
    chain,
    f32,
    scale_by_learning_rate,
)


def _lr_at(learning_rate: LR, step: int) -> float:
    return learning_rate(step) if callable(learning_rate) else f32(learning_rate)


def _copies(params: Flat) -> Flat:
    return {p: _f64(x).copy() for p, x in params.items()}


def scale_by_cocob(alpha: float = 100.0, eps: float = 1e-8) -> Reference:
    """Coin betting per element (Orabona & Tommasi 2017, Algorithm 2), from x0 = params at init."""
    alpha, eps = f32(alpha), f32(eps)

    def init(params: Flat) -> State:
        return {
            "x0": _copies(params),
            "L": {p: np.full(np.shape(x), eps) for p, x in params.items()},
            "G": _zeros(params),
            "R": _zeros(params),
            "C": _zeros(params),
        }

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        new = {k: dict(v) for k, v in state.items()}
        out = {}
        for p, g in grads.items():
            g, x, x0 = _f64(g), _f64(params[p]), state["x0"][p]
            L = new["L"][p] = np.maximum(new["L"][p], np.abs(g))
            G = new["G"][p] = new["G"][p] + np.abs(g)
            R = new["R"][p] = np.maximum(new["R"][p] - g * (x - x0), 0.0)
            C = new["C"][p] = new["C"][p] - g
            x_next = x0 + C / (L * np.maximum(G + L, alpha * L)) * (L + R)
            out[p] = x_next - x
        return out, new

    return Reference(init, update)


def cocob(
    learning_rate: LR = 1.0, alpha: float = 100.0, eps: float = 1e-8, weight_decay: float = 0.0
) -> Reference:
    """The betting step on lr * (g + wd * p)."""
    return chain(
        add_decayed_weights(weight_decay),
        scale_by_learning_rate(learning_rate, flip_sign=False),
        scale_by_cocob(alpha, eps),
    )


def dadapt_adamw(
    learning_rate: LR = 1.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    estim_lr0: float = 1e-6,
    weight_decay: float = 0.0,
) -> Reference:
    """Defazio & Mishchenko 2023, Algorithm (D-Adapt Adam), with a global step t and estimate d."""
    b1, b2, eps, wd = f32(betas[0]), f32(betas[1]), f32(eps), f32(weight_decay)
    sb2 = math.sqrt(b2)

    def init(params: Flat) -> State:
        z = _zeros
        return {"m": z(params), "v": z(params), "s": z(params), "d": f32(estim_lr0), "r": 0.0,
                "t": 0}  # fmt: skip

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        t, d = state["t"] + 1, state["d"]
        lam = d * _lr_at(learning_rate, state["t"]) * math.sqrt(1 - b2**t) / (1 - b1**t)
        m, v, s = dict(state["m"]), dict(state["v"]), dict(state["s"])
        inner = 0.0
        for p, g in grads.items():
            g = _f64(g)
            inner += float(np.sum(g * s[p] / (np.sqrt(v[p]) + eps)))
            m[p] = b1 * m[p] + (1 - b1) * lam * g
            v[p] = b2 * v[p] + (1 - b2) * g * g
            s[p] = sb2 * s[p] + (1 - sb2) * lam * g
        r = sb2 * state["r"] + (1 - sb2) * lam * inner
        l1 = sum(float(np.sum(np.abs(x))) for x in s.values())
        new_d = max(d, r / ((1 - sb2) * l1)) if l1 > 0 else d
        out = {p: -m[p] / (np.sqrt(v[p]) + eps) - wd * lam * _f64(params[p]) for p in grads}
        return out, {"m": m, "v": v, "s": s, "d": new_d, "r": r, "t": t}

    return Reference(init, update)


def prodigy(
    learning_rate: LR = 1.0,
    betas: tuple[float, float] = (0.9, 0.999),
    beta3: float | None = None,
    eps: float = 1e-8,
    estim_lr0: float = 1e-6,
    estim_lr_coef: float = 1.0,
    weight_decay: float = 0.0,
    safeguard_warmup: bool = False,
) -> Reference:
    """Mishchenko & Defazio 2024, Algorithm 4 (Prodigy, Adam version), global t and d."""
    b1, b2, eps, wd = f32(betas[0]), f32(betas[1]), f32(eps), f32(weight_decay)
    b3 = math.sqrt(b2) if beta3 is None else f32(beta3)
    d0, coef = f32(estim_lr0), f32(estim_lr_coef)

    def init(params: Flat) -> State:
        z = _zeros
        return {"m": z(params), "v": z(params), "s": z(params), "x0": _copies(params),
                "d": d0, "r": 0.0, "t": 0}  # fmt: skip

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        t, d = state["t"] + 1, state["d"]
        lam = d * _lr_at(learning_rate, state["t"]) * math.sqrt(1 - b2**t) / (1 - b1**t)
        weight = d / d0 if safeguard_warmup else lam / d0
        m, v, s = dict(state["m"]), dict(state["v"]), dict(state["s"])
        inner = 0.0
        for p, g in grads.items():
            g = _f64(g)
            inner += float(np.sum(g * (state["x0"][p] - _f64(params[p]))))
            m[p] = b1 * m[p] + (1 - b1) * d * g
            v[p] = b2 * v[p] + (1 - b2) * (d * g) ** 2
            s[p] = b3 * s[p] + weight * d * g
        r = b3 * state["r"] + (d / d0) * lam * inner
        l1 = sum(float(np.sum(np.abs(x))) for x in s.values())
        new_d = max(d, coef * r / l1) if l1 > 0 else d
        out = {
            p: -lam * m[p] / (np.sqrt(v[p]) + new_d * eps) - wd * lam * _f64(params[p])
            for p in grads
        }
        return out, {**state, "m": m, "v": v, "s": s, "d": new_d, "r": r, "t": t}

    return Reference(init, update)


def _sq(values) -> float:
    return float(sum(np.sum(_f64(x) ** 2) for x in values))


def scale_by_dog(init_step: tuple[str, float] = ("heuristic", 1e-6), eps: float = 1e-8):
    """Ivgi et al. 2023: u = max(r_eps, max_k ||x_k - x0||) / sqrt(sum_k ||g_k||^2 + eps) g."""
    kind, value = init_step[0], f32(init_step[1])
    eps = f32(eps)

    def init(params: Flat) -> State:
        r_eps = {
            "distance": value,
            "heuristic": value * (1 + math.sqrt(_sq(params.values()))),
            "learning_rate": 0.0,
        }[kind]
        return {"x0": _copies(params), "r": r_eps, "G": 0.0, "first": True}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        dist = math.sqrt(_sq(_f64(params[p]) - state["x0"][p] for p in params))
        r = max(state["r"], dist)
        G = state["G"] + _sq(grads.values())
        step = r / math.sqrt(G + eps)
        if kind == "learning_rate" and state["first"]:
            step = value
        out = {p: step * _f64(g) for p, g in grads.items()}
        return out, {**state, "r": r, "G": G, "first": False}

    return Reference(init, update)


def scale_by_dowg(init_estim_sq_dist: float | None = None, eps: float = 1e-4) -> Reference:
    """Khaled et al. 2023: r2 = max(r2, ||x - x0||^2); v += r2 ||g||^2; u = r2/(sqrt(v)+eps) g."""
    eps = f32(eps)
    r2_0 = eps if init_estim_sq_dist is None else f32(init_estim_sq_dist)

    def init(params: Flat) -> State:
        return {"x0": _copies(params), "r2": r2_0, "v": 0.0}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        r2 = max(state["r2"], _sq(_f64(params[p]) - state["x0"][p] for p in params))
        v = state["v"] + r2 * _sq(grads.values())
        step = r2 / (math.sqrt(v) + eps)
        return {p: step * _f64(g) for p, g in grads.items()}, {**state, "r2": r2, "v": v}

    return Reference(init, update)


def dog(learning_rate: LR = 1.0, init_step=("heuristic", 1e-6), eps: float = 1e-8) -> Reference:
    """p -= lr * dog_step * g."""
    return chain(scale_by_dog(init_step, eps), scale_by_learning_rate(learning_rate))


def dowg(learning_rate: LR = 1.0, init_estim_sq_dist=None, eps: float = 1e-4) -> Reference:
    """p -= lr * dowg_step * g."""
    return chain(scale_by_dowg(init_estim_sq_dist, eps), scale_by_learning_rate(learning_rate))


Loss = Callable[[Flat], float]


def _at(value: LR, step: int) -> float:
    return value(step) if callable(value) else f32(value)


def _dot(a: Flat, b: Flat) -> float:
    return float(sum(np.sum(_f64(a[p]) * _f64(b[p])) for p in a))


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
