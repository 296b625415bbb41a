"""Independent NumPy float64 references for gradtx.contrib: Simplified AdEMAMix, Sophia and
Hutchinson's estimator, GaLore, DP-SGD's aggregation, `normalize`.

Same conventions as `references.py`: flat dicts `{path: array}`, hyperparameters rounded to
float32 first, arithmetic in float64, one loop over paths, each written from the paper's
update rule (and the formulas of gradtx.contrib's docstrings). Where a method draws random
numbers (DP-SGD's noise), the reference draws them from the key stream the docstring
documents, with `jax.random`, and does the rest of the arithmetic in NumPy. Sophia's
reference takes the Hessian's diagonal as a function of the params: on the contract's
separable quadratic Hutchinson's estimate is that diagonal exactly, whatever the signs.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import jax
import numpy as np
from references import (
    Flat,
    Reference,
    State,
    _counts,
    _f64,
    _no_state,
    _zeros,
    add_decayed_weights,
    chain,
    f32,
    scale_by_adam,
    scale_by_learning_rate,
    trace,
)
from references_per_leaf import per_example_global_norm_clip

LR = float | Callable[[int], float]
Diagonal = Callable[[Flat], Flat]


def _at(value: LR, step: int) -> float:
    return value(step) if callable(value) else f32(value)


# --- Simplified AdEMAMix ------------------------------------------------------------------------


def scale_by_simplified_ademamix(
    b1: float = 0.99,
    b2: float = 0.95,
    alpha: LR = 0.0,
    eps: float = 1e-8,
    eps_root: float = 0.0,
) -> Reference:
    """m = b1 m + g (no 1 - b1); n = b2 n + (1 - b2) g^2; t counted per path;
    u = (m + alpha(t - 1) g) / (sqrt(n / (1 - b2^t) + eps_root) + eps)."""
    b1, b2, eps, eps_root = f32(b1), f32(b2), f32(eps), f32(eps_root)

    def init(params: Flat) -> State:
        return {"m": _zeros(params), "n": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        m, n, count = dict(state["m"]), dict(state["n"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            a = _at(alpha, count[p])
            m[p] = b1 * m[p] + g
            n[p] = b2 * n[p] + (1.0 - b2) * g * g
            count[p] += 1
            n_hat = n[p] / (1.0 - b2 ** count[p])
            out[p] = (m[p] + a * g) / (np.sqrt(n_hat + eps_root) + eps)
        return out, {"m": m, "n": n, "count": count}

    return Reference(init, update)


def simplified_ademamix(
    learning_rate: LR,
    weight_decay: float = 0.0,
    mask: Callable[[str], bool] | None = None,
    **kwargs,
) -> Reference:
    """p -= lr * (simplified_ademamix_direction(g) + wd * p)."""
    return chain(
        scale_by_simplified_ademamix(**kwargs),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


# --- Sophia -------------------------------------------------------------------------------------


def hessian_diagonal(diagonal: Diagonal) -> Reference:
    """u_p = diag(H)_p at the present paths (Hutchinson's estimate of a diagonal Hessian)."""

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        diag = diagonal(params)
        return {p: _f64(diag[p]) for p in grads}, state

    return Reference(_no_state, update)


def scale_by_sophia(
    diagonal: Diagonal,
    b1: float = 0.965,
    b2: float = 0.99,
    eps: float = 1e-8,
    gamma: float = 0.01,
    clip_threshold: float | None = 1.0,
    update_interval: int = 10,
) -> Reference:
    """m = b1 m + (1 - b1) g; u = clip(m / (1 - b1^t) / max(gamma h, eps), +-rho) with the
    previous h; then, when (t - 1) % k == 0, h = b2 h + (1 - b2) diag(H)."""
    b1, b2, eps, gamma = f32(b1), f32(b2), f32(eps), f32(gamma)
    rho = None if clip_threshold is None else f32(clip_threshold)

    def init(params: Flat) -> State:
        return {"mu": _zeros(params), "nu": _zeros(params), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, nu, count = dict(state["mu"]), dict(state["nu"]), dict(state["count"])
        due = [p for p in grads if count[p] % update_interval == 0]
        diag = diagonal(params) if due else {}
        out = {}
        for p, g in grads.items():
            mu[p] = b1 * mu[p] + (1.0 - b1) * _f64(g)
            t = count[p] + 1
            u = mu[p] / (1.0 - b1**t) / np.maximum(gamma * nu[p], eps)
            out[p] = u if rho is None else np.clip(u, -rho, rho)
            if p in due:
                nu[p] = b2 * nu[p] + (1.0 - b2) * _f64(diag[p])
            count[p] = t
        return out, {"mu": mu, "nu": nu, "count": count}

    return Reference(init, update)


def sophia(
    learning_rate: LR,
    diagonal: Diagonal,
    weight_decay: float = 1e-4,
    mask: Callable[[str], bool] | None = None,
    **kwargs,
) -> Reference:
    """p -= lr * (sophia_direction(g) + wd * p)."""
    return chain(
        scale_by_sophia(diagonal, **kwargs),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


# --- GaLore -------------------------------------------------------------------------------------


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


# --- DP-SGD -------------------------------------------------------------------------------------


def differentially_private_aggregate(
    l2_norm_clip: float, noise_multiplier: float, key: int = 0
) -> Reference:
    """Per-example grads (leading batch axis B): u = (sum_i clip_C(g_i) + sigma C xi) / B,
    xi drawn for each path from its key stream: fold_in(key, crc32(path)), then
    `key, sample = split(key)` and `normal(sample, shape)` (float32) at each update."""
    clip = per_example_global_norm_clip(l2_norm_clip)
    std = f32(l2_norm_clip) * f32(noise_multiplier)
    base = jax.random.key(key)

    def init(params: Flat) -> State:
        keys = {p: jax.random.fold_in(base, zlib.crc32(p.encode())) for p in params}
        return {"clip": clip.init(params), "key": keys}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        batch = len(next(iter(grads.values())))
        summed, clip_state = clip.update(grads, state["clip"], params)
        keys, out = dict(state["key"]), {}
        for p, g in summed.items():
            keys[p], sample = jax.random.split(keys[p])
            noise = np.asarray(jax.random.normal(sample, np.shape(g)), np.float64)
            out[p] = (_f64(g) + std * noise) / batch
        return out, {"clip": clip_state, "key": keys}

    return Reference(init, update)


def dpsgd(
    learning_rate: LR,
    l2_norm_clip: float,
    noise_multiplier: float,
    seed: int,
    momentum: float | None = None,
    nesterov: bool = False,
) -> Reference:
    """p -= lr * dp_mean(g), or with momentum p -= lr * trace(dp_mean(g))."""
    parts = [differentially_private_aggregate(l2_norm_clip, noise_multiplier, seed)]
    if momentum is not None:
        parts.append(trace(momentum, nesterov))
    return chain(*parts, scale_by_learning_rate(learning_rate))


# --- normalize ----------------------------------------------------------------------------------


def normalize() -> Reference:
    """u = g / ||g||, the norm over every leaf; 0 for a zero gradient."""

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        norm = math.sqrt(sum(float(np.sum(_f64(g) ** 2)) for g in grads.values()))
        return {p: _f64(g) / norm if norm > 0 else _f64(g) for p, g in grads.items()}, state

    return Reference(_no_state, update)
