"""Independent NumPy float64 references for gradtx.contrib.

Same conventions as `references.py`: flat dicts `{path: array}`, hyperparameters rounded to
float32 first, arithmetic in float64, written from the papers' update rules and the formulas
in gradtx.contrib's docstrings. Global quantities (D-Adaptation's estimate, DoG's distance)
are sums over every path of the flat dict.
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
    scale_by_adam,
    scale_by_learning_rate,
)
from references_misc import normalize_by_update_norm

LR = float | Callable[[int], float]


def _lr_at(learning_rate: LR, step: int) -> float:
    return learning_rate(step) if callable(learning_rate) else f32(learning_rate)


def _copies(params: Flat) -> Flat:
    return {p: _f64(x).copy() for p, x in params.items()}


# --- ADOPT --------------------------------------------------------------------------------------


def scale_by_adopt(
    b1: float = 0.9,
    b2: float = 0.9999,
    eps: float = 1e-6,
    nesterov: bool = False,
    use_clipping: bool = True,
    clip_value_fn: Callable[[float], float] = lambda t: t**0.25,
) -> Reference:
    """s = clip(g / max(sqrt(v_old), eps), +-c(t)); m = b1 m + (1 - b1) s; v = b2 v + (1-b2) g^2;
    at t = 0: b1 -> 1, b2 -> 0 (v = g^2, no step)."""
    b1, b2, eps = f32(b1), f32(b2), f32(eps)

    def init(params: Flat) -> State:
        return {"mu": _zeros(params), "nu": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, nu, count = dict(state["mu"]), dict(state["nu"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g, t = _f64(g), count[p]
            c1, c2 = (1.0, 0.0) if t == 0 else (b1, b2)
            s = g / np.maximum(np.sqrt(nu[p]), eps)
            if use_clipping:
                bound = clip_value_fn(float(t))
                s = np.clip(s, -bound, bound)
            nu[p] = c2 * nu[p] + (1.0 - c2) * g * g
            mu[p] = c1 * mu[p] + (1.0 - c1) * s
            out[p] = c1 * mu[p] + (1.0 - c1) * s if nesterov else mu[p]
            count[p] = t + 1
        return out, {"mu": mu, "nu": nu, "count": count}

    return Reference(init, update)


def adopt(learning_rate: LR, **kwargs) -> Reference:
    """p -= lr * adopt_direction(g)."""
    return chain(scale_by_adopt(**kwargs), scale_by_learning_rate(learning_rate))


# --- AdEMAMix -----------------------------------------------------------------------------------


def scale_by_ademamix(
    b1: float = 0.9,
    b2: float = 0.999,
    b3: LR = 0.9999,
    alpha: LR = 6.0,
    eps: float = 1e-8,
    eps_root: float = 0.0,
) -> Reference:
    """u = (m1 / (1 - b1^t) + alpha m2) / (sqrt(v / (1 - b2^t) + eps_root) + eps)."""
    b1, b2, eps, eps_root = f32(b1), f32(b2), f32(eps), f32(eps_root)

    def init(params: Flat) -> State:
        z = _zeros
        return {"m1": z(params), "m2": z(params), "nu": z(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        m1, m2, nu = dict(state["m1"]), dict(state["m2"]), dict(state["nu"])
        count, out = dict(state["count"]), {}
        for p, g in grads.items():
            g, t = _f64(g), count[p]
            c3, a = _lr_at(b3, t), _lr_at(alpha, t)
            m1[p] = b1 * m1[p] + (1.0 - b1) * g
            m2[p] = c3 * m2[p] + (1.0 - c3) * g
            nu[p] = b2 * nu[p] + (1.0 - b2) * g * g
            count[p] = t = t + 1
            m_hat, v_hat = m1[p] / (1.0 - b1**t), nu[p] / (1.0 - b2**t)
            out[p] = (m_hat + a * m2[p]) / (np.sqrt(v_hat + eps_root) + eps)
        return out, {"m1": m1, "m2": m2, "nu": nu, "count": count}

    return Reference(init, update)


def ademamix(
    learning_rate: LR,
    weight_decay: float = 0.0,
    mask: Callable[[str], bool] | None = None,
    **kwargs,
) -> Reference:
    """p -= lr * (ademamix_direction(g) + wd * p); alpha defaults to 5 here."""
    kwargs.setdefault("alpha", 5.0)
    return chain(
        scale_by_ademamix(**kwargs),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


# --- COCOB --------------------------------------------------------------------------------------


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


# --- D-Adaptation and Prodigy -------------------------------------------------------------------


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


# --- DoG and DoWG -------------------------------------------------------------------------------


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


# --- Muon ---------------------------------------------------------------------------------------

NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz(x: np.ndarray, coeffs=NS_COEFFS, steps: int = 5, eps: float = 1e-8):
    """X / (||X||_F + eps), then X <- a X + (b A + c A^2) X with A = X X^T (on the wide side)."""
    a, b, c = (f32(k) for k in coeffs)
    wide = x.shape[0] <= x.shape[1]
    y = x if wide else x.T
    y = y / (np.linalg.norm(y) + f32(eps))
    for _ in range(steps):
        gram = y @ y.T
        y = a * y + (b * gram + c * gram @ gram) @ y
    return y if wide else y.T


def _is_matrix(x) -> bool:
    return np.ndim(x) == 2


def muon(
    learning_rate: LR,
    beta: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    nesterov: bool = True,
    adaptive: bool = False,
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    adam_weight_decay: float = 0.0,
    adam_learning_rate: LR | None = None,
    only_scale: bool = False,
) -> Reference:
    """Muon on the 2-D leaves (Jordan et al. 2024), AdamW on the others.

    Matrices: m = beta m + (1 - beta) g; m_hat = beta m / (1 - beta^(t+1)) + (1 - beta) g /
    (1 - beta^t) (Nesterov) or m / (1 - beta^t); O = NS(m_hat) (adaptive: <m_hat, O> O);
    u = -lr (sqrt(max(1, n_out / n_in)) O + wd p). With `only_scale`, u = O on the matrices
    and g elsewhere (scale_by_muon).
    """
    beta, wd, adam_wd = f32(beta), f32(weight_decay), f32(adam_weight_decay)
    adam_lr = learning_rate if adam_learning_rate is None else adam_learning_rate
    adam = scale_by_adam(adam_b1, adam_b2, eps, 0.0, nesterov)

    def init(params: Flat) -> State:
        others = {p: x for p, x in params.items() if not _is_matrix(x)}
        return {"m": _zeros(params), "t": _counts(params), "adam": adam.init(others)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        m, t_by = dict(state["m"]), dict(state["t"])
        out = {}
        others = {p: g for p, g in grads.items() if not _is_matrix(g)}
        if only_scale:
            out.update({p: _f64(g) for p, g in others.items()})
            adam_state = state["adam"]
        else:
            adam_u, adam_state = adam.update(others, state["adam"], params)
            for p in others:
                lr = _lr_at(adam_lr, t_by[p])
                out[p] = -lr * (adam_u[p] + adam_wd * _f64(params[p]))
                t_by[p] += 1
        for p, g in grads.items():
            if not _is_matrix(g):
                continue
            g, lr = _f64(g), _lr_at(learning_rate, t_by[p])
            m[p] = beta * m[p] + (1 - beta) * g
            t_by[p] = t = t_by[p] + 1
            if nesterov:
                m_hat = beta * m[p] / (1 - beta ** (t + 1)) + (1 - beta) * g / (1 - beta**t)
            else:
                m_hat = m[p] / (1 - beta**t)
            o = newton_schulz(m_hat, eps=eps)
            if adaptive:
                o = float(np.sum(m_hat * o)) * o
            if only_scale:
                out[p] = o
                continue
            n_in, n_out = g.shape
            out[p] = -lr * (math.sqrt(max(1.0, n_out / n_in)) * o + wd * _f64(params[p]))
        return out, {"m": m, "t": t_by, "adam": adam_state}

    return Reference(init, update)


def scale_by_muon(beta: float = 0.95, nesterov: bool = True, adaptive: bool = False):
    """The orthogonalised momentum of the 2-D leaves; other leaves unchanged."""
    return muon(0.0, beta=beta, nesterov=nesterov, adaptive=adaptive, only_scale=True)


# --- SAM ----------------------------------------------------------------------------------------


def sam(
    optimizer: Reference, adv_optimizer: Reference, sync_period: int = 2, reset_state: bool = True
) -> Reference:
    """Foret et al. 2021, as a cycle: sync_period - 1 ascent steps (the adversary's update,
    negated) from the outer params x, then x + optimizer(g at the adversarial point)."""

    def init(params: Flat) -> State:
        return {
            "k": 0,
            "opt": optimizer.init(params),
            "adv": adv_optimizer.init(params),
            "outer": _copies(params),
        }

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        k = state["k"]
        outer = _copies(params) if k == 0 else state["outer"]
        if k < sync_period - 1:
            adv_u, adv = adv_optimizer.update(grads, state["adv"], params)
            out = {p: -u for p, u in adv_u.items()}
            return out, {**state, "k": k + 1, "adv": adv, "outer": outer}
        u, opt = optimizer.update(grads, state["opt"], outer)
        out = {p: outer[p] - _f64(params[p]) + u[p] for p in grads}
        adv = adv_optimizer.init(params) if reset_state else state["adv"]
        return out, {"k": 0, "opt": opt, "adv": adv, "outer": outer}

    return Reference(init, update)


def sam_sgd(learning_rate: float, rho: float, sync_period: int = 2) -> Reference:
    """SAM as published: sgd outer, normalised-gradient sgd adversary."""
    return sam(
        scale_by_learning_rate(learning_rate),
        chain(normalize_by_update_norm(1.0, 1e-6), scale_by_learning_rate(rho)),
        sync_period,
    )
