"""References of the Adam family: AMSGrad, AdaMax, AdaBelief, RAdam, Yogi, Adan, NAdam
and their optimizers (Adam itself, `scale_by_adam`, `adam` and `adamw`, is in the package
module, which the other families compose).

Written from the papers and the formulas in gradtx's docstrings, one loop over paths each;
hyperparameters are rounded to float32 first (`f32`), the arithmetic runs in float64.
"""

from __future__ import annotations

import math

import numpy as np

from references import (
    LR,
    Flat,
    Reference,
    State,
    _counts,
    _f64,
    _filled,
    _opt,
    _zeros,
    f32,
    scale_by_adam,
)


def _nesterov_or_plain(m: np.ndarray, g: np.ndarray, b1: float, t: int, nesterov: bool):
    if nesterov:
        return b1 * m / (1.0 - b1 ** (t + 1)) + (1.0 - b1) * g / (1.0 - b1**t)
    return m / (1.0 - b1**t)


def scale_by_amsgrad(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    bias_correction_mu: bool = True,
    bias_correction_nu: bool = True,
) -> Reference:
    """AMSGrad (Reddi et al. 2018): Adam's moments, the denominator from the running
    maximum of (bias-corrected) nu."""
    b1, b2, eps, eps_root = f32(b1), f32(b2), f32(eps), f32(eps_root)

    def init(params: Flat) -> State:
        return {
            "mu": _zeros(params),
            "nu": _zeros(params),
            "nu_max": _zeros(params),
            "count": _counts(params),
        }

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, nu, count = dict(state["mu"]), dict(state["nu"]), dict(state["count"])
        nu_max = dict(state["nu_max"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            mu[p] = b1 * mu[p] + (1.0 - b1) * g
            nu[p] = b2 * nu[p] + (1.0 - b2) * g * g
            count[p] += 1
            t = count[p]
            m_hat = mu[p] / (1.0 - b1**t) if bias_correction_mu else mu[p]
            v_hat = nu[p] / (1.0 - b2**t) if bias_correction_nu else nu[p]
            nu_max[p] = np.maximum(nu_max[p], v_hat)
            out[p] = m_hat / (np.sqrt(nu_max[p] + eps_root) + eps)
        return out, {"mu": mu, "nu": nu, "nu_max": nu_max, "count": count}

    return Reference(init, update)


def scale_by_adamax(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Reference:
    """AdaMax (Kingma & Ba 2015, 7.1): u = m / (1 - b1^t) / v, v = max(|g| + eps, b2 v)."""
    b1, b2, eps = f32(b1), f32(b2), f32(eps)

    def init(params: Flat) -> State:
        return {"mu": _zeros(params), "nu": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, nu, count = dict(state["mu"]), dict(state["nu"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            mu[p] = b1 * mu[p] + (1.0 - b1) * g
            nu[p] = np.maximum(np.abs(g) + eps, b2 * nu[p])
            count[p] += 1
            out[p] = mu[p] / (1.0 - b1 ** count[p]) / nu[p]
        return out, {"mu": mu, "nu": nu, "count": count}

    return Reference(init, update)


def scale_by_belief(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-16,
    eps_root: float = 1e-16,
    nesterov: bool = False,
) -> Reference:
    """AdaBelief (Zhuang et al. 2020): s = b2 s + (1 - b2)(g - m)^2 + eps_root,
    u = m_hat / (sqrt(s / (1 - b2^t)) + eps)."""
    b1, b2, eps, eps_root = f32(b1), f32(b2), f32(eps), f32(eps_root)

    def init(params: Flat) -> State:
        return {"mu": _zeros(params), "nu": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, nu, count = dict(state["mu"]), dict(state["nu"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            mu[p] = b1 * mu[p] + (1.0 - b1) * g
            nu[p] = b2 * nu[p] + (1.0 - b2) * (g - mu[p]) ** 2 + eps_root
            count[p] += 1
            t = count[p]
            m_hat = _nesterov_or_plain(mu[p], g, b1, t, nesterov)
            out[p] = m_hat / (np.sqrt(nu[p] / (1.0 - b2**t)) + eps)
        return out, {"mu": mu, "nu": nu, "count": count}

    return Reference(init, update)


def radam_rho(b2: float, t: int) -> float:
    """rho_t = rho_inf - 2 t b2^t / (1 - b2^t), in float64 (exact enough for t >= 1)."""
    b2 = f32(b2)
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    b2t = b2**t
    return rho_inf - 2.0 * t * b2t / (1.0 - b2t)


def scale_by_radam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    threshold: float = 5.0,
    nesterov: bool = False,
) -> Reference:
    """RAdam (Liu et al. 2020): Adam's step times the rectification r_t once rho_t reaches
    the threshold, plain bias-corrected momentum before."""
    b1, eps, eps_root, thr = f32(b1), f32(eps), f32(eps_root), f32(threshold)
    b2_32 = f32(b2)
    rho_inf = 2.0 / (1.0 - b2_32) - 1.0

    def init(params: Flat) -> State:
        return {"mu": _zeros(params), "nu": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, nu, count = dict(state["mu"]), dict(state["nu"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            mu[p] = b1 * mu[p] + (1.0 - b1) * g
            nu[p] = b2_32 * nu[p] + (1.0 - b2_32) * g * g
            count[p] += 1
            t = count[p]
            m_hat = _nesterov_or_plain(mu[p], g, b1, t, nesterov)
            rho = radam_rho(b2, t)
            if rho >= thr:
                r = math.sqrt(
                    (rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho)
                )
                v_hat = nu[p] / (1.0 - b2_32**t)
                out[p] = r * m_hat / (np.sqrt(v_hat + eps_root) + eps)
            else:
                out[p] = m_hat
        return out, {"mu": mu, "nu": nu, "count": count}

    return Reference(init, update)


def scale_by_yogi(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-3,
    eps_root: float = 0.0,
    initial_accumulator_value: float = 1e-6,
) -> Reference:
    """Yogi (Zaheer et al. 2018): v = v - (1 - b2) sign(v - g^2) g^2, both moments starting
    at `initial_accumulator_value`, Adam's bias corrections and denominator."""
    b1, b2, eps, eps_root = f32(b1), f32(b2), f32(eps), f32(eps_root)
    v0 = f32(initial_accumulator_value)

    def init(params: Flat) -> State:
        return {"mu": _filled(params, v0), "nu": _filled(params, v0), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, nu, count = dict(state["mu"]), dict(state["nu"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            mu[p] = b1 * mu[p] + (1.0 - b1) * g
            g2 = g * g
            nu[p] = nu[p] - (1.0 - b2) * np.sign(nu[p] - g2) * g2
            count[p] += 1
            t = count[p]
            m_hat, v_hat = mu[p] / (1.0 - b1**t), nu[p] / (1.0 - b2**t)
            out[p] = m_hat / (np.sqrt(v_hat + eps_root) + eps)
        return out, {"mu": mu, "nu": nu, "count": count}

    return Reference(init, update)


def scale_by_adan(
    b1: float = 0.98,
    b2: float = 0.92,
    b3: float = 0.99,
    eps: float = 1e-8,
    eps_root: float = 0.0,
) -> Reference:
    """Adan (Xie et al. 2022, Algorithm 1, betas as decays): with diff = g - g_prev (0 at a
    path's first step), m, d and n are moving averages of g, diff and (g + (1-b2) diff)^2;
    u = (m_hat + (1 - b2) d_hat) / (sqrt(n_hat + eps_root) + eps)."""
    b1, b2, b3, eps, eps_root = f32(b1), f32(b2), f32(b3), f32(eps), f32(eps_root)

    def init(params: Flat) -> State:
        return {
            "m": _zeros(params),
            "d": _zeros(params),
            "n": _zeros(params),
            "prev": {p: None for p in params},
            "count": _counts(params),
        }

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        m, d, n = dict(state["m"]), dict(state["d"]), dict(state["n"])
        prev, count = dict(state["prev"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            diff = np.zeros_like(g) if prev[p] is None else g - prev[p]
            m[p] = b1 * m[p] + (1.0 - b1) * g
            d[p] = b2 * d[p] + (1.0 - b2) * diff
            n[p] = b3 * n[p] + (1.0 - b3) * (g + (1.0 - b2) * diff) ** 2
            prev[p] = g
            count[p] += 1
            t = count[p]
            direction = m[p] / (1.0 - b1**t) + (1.0 - b2) * d[p] / (1.0 - b2**t)
            out[p] = direction / (np.sqrt(n[p] / (1.0 - b3**t) + eps_root) + eps)
        return out, {"m": m, "d": d, "n": n, "prev": prev, "count": count}

    return Reference(init, update)


def nadam(learning_rate: LR, **kw) -> Reference:
    return _opt(scale_by_adam(nesterov=True, **kw), learning_rate)


def nadamw(learning_rate: LR, weight_decay: float = 1e-4, mask=None, **kw) -> Reference:
    return _opt(scale_by_adam(nesterov=True, **kw), learning_rate, weight_decay, mask)


def adamax(learning_rate: LR, **kw) -> Reference:
    return _opt(scale_by_adamax(**kw), learning_rate)


def adamaxw(learning_rate: LR, weight_decay: float = 1e-4, mask=None, **kw) -> Reference:
    return _opt(scale_by_adamax(**kw), learning_rate, weight_decay, mask)


def amsgrad(learning_rate: LR, **kw) -> Reference:
    return _opt(scale_by_amsgrad(**kw), learning_rate)


def adabelief(learning_rate: LR, **kw) -> Reference:
    return _opt(scale_by_belief(**kw), learning_rate)


def radam(learning_rate: LR, **kw) -> Reference:
    return _opt(scale_by_radam(**kw), learning_rate)


def yogi(learning_rate: LR, **kw) -> Reference:
    return _opt(scale_by_yogi(**kw), learning_rate)


def adan(learning_rate: LR, weight_decay: float | None = None, mask=None, **kw) -> Reference:
    kw.setdefault("eps_root", 1e-8)
    return _opt(scale_by_adan(**kw), learning_rate, weight_decay, mask)
