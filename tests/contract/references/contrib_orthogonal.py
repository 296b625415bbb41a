"""References of gradtx.contrib's methods that act on matrices through orthogonal factors:
Muon (Newton-Schulz orthogonalisation of the momentum) and GaLore (projection onto the
leading singular vectors).

Same conventions as the package module: flat dicts, float32 hyperparameters, float64 math.
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
    _counts,
    _f64,
    _zeros,
    add_decayed_weights,
    chain,
    f32,
    scale_by_adam,
    scale_by_learning_rate,
)


def _lr_at(learning_rate: LR, step: int) -> float:
    return learning_rate(step) if callable(learning_rate) else f32(learning_rate)


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


def scale_by_galore(
    rank: int = 128,
    update_proj_gap: int = 200,
    scale: float = 1.0,
    inner: Reference | None = None,
) -> Reference:
    """For each 2-D leaf G (m x n), r = min(rank, m, n): every `update_proj_gap` steps of the
    path P = U[:, :r] (m >= n) or V[:, :r] (m < n) from G = U S V^T; R = P^T G or G P; the
    inner optimizer on R (other leaves: on G); u = scale * P opt(R) or scale * opt(R) P^T."""
    inner = scale_by_adam() if inner is None else inner
    s = f32(scale)

    def low_rank_shape(shape: tuple[int, ...]) -> tuple[bool, tuple[int, int]]:
        m, n = shape
        r = min(rank, m, n)
        return m >= n, ((r, n) if m >= n else (m, r))

    def init(params: Flat) -> State:
        proxies, projector, count = {}, {}, {}
        for p, x in params.items():
            if np.ndim(x) == 2:
                left, low = low_rank_shape(np.shape(x))
                r = low[0] if left else low[1]
                projector[p] = np.zeros((np.shape(x)[0] if left else np.shape(x)[1], r))
                count[p] = 0
                proxies[p] = np.zeros(low)
            else:
                proxies[p] = _f64(x)
        return {"projector": projector, "count": count, "inner": inner.init(proxies)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        projector, count = dict(state["projector"]), dict(state["count"])
        low = {}
        for p, g in grads.items():
            g = _f64(g)
            if p not in projector:
                low[p] = g
                continue
            left, shape = low_rank_shape(np.shape(g))
            r = shape[0] if left else shape[1]
            if count[p] % update_proj_gap == 0:
                u_, _, vt = np.linalg.svd(g, full_matrices=False)
                projector[p] = u_[:, :r] if left else vt[:r, :].T
            low[p] = projector[p].T @ g if left else g @ projector[p]
            count[p] += 1
        inner_updates, inner_state = inner.update(low, state["inner"], params)
        out = {}
        for p, u in inner_updates.items():
            if p not in projector:
                out[p] = u
                continue
            left = np.shape(grads[p])[0] >= np.shape(grads[p])[1]
            out[p] = s * (projector[p] @ u if left else u @ projector[p].T)
        return out, {"projector": projector, "count": count, "inner": inner_state}

    return Reference(init, update)


def galore(
    learning_rate: LR,
    weight_decay: float = 0.0,
    mask: Callable[[str], bool] | None = None,
    **kwargs,
) -> Reference:
    """p -= lr * (galore_direction(g) + wd * p)."""
    return chain(
        scale_by_galore(**kwargs),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )
