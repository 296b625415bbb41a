"""References of the second-moment rescalings without a first moment's bias correction:
RMSProp (`scale_by_rms`, `rmsprop`), AdaGrad (`scale_by_rss`, `adagrad`) and AdaDelta.

Same conventions as the package module: flat dicts, float32 hyperparameters, float64 math.
"""

from __future__ import annotations

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
    add_decayed_weights,
    chain,
    f32,
    scale_by_learning_rate,
    trace,
)


def scale_by_rms(
    decay: float = 0.9,
    eps: float = 1e-8,
    initial_scale: float = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
    centered: bool = False,
) -> Reference:
    """RMSProp (Hinton 2012), centered (Graves 2013) with `centered`.

    nu = d nu + (1 - d) g^2 (nu_0 = initial_scale);  centered: mu = d mu + (1 - d) g;
    hats divided by 1 - d^t with bias correction;  s = nu_hat (- mu_hat^2 if centered);
    u = g / sqrt(s + eps)  or  g / (sqrt(s) + eps).
    """
    d, eps, init_v = f32(decay), f32(eps), f32(initial_scale)

    def init(params: Flat) -> State:
        return {"mu": _zeros(params), "nu": _filled(params, init_v), "count": _counts(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        mu, nu, count = dict(state["mu"]), dict(state["nu"]), dict(state["count"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            nu[p] = d * nu[p] + (1.0 - d) * g * g
            mu[p] = d * mu[p] + (1.0 - d) * g
            count[p] += 1
            c = 1.0 - d ** count[p] if bias_correction else 1.0
            s = nu[p] / c - (mu[p] / c) ** 2 if centered else nu[p] / c
            out[p] = g / np.sqrt(s + eps) if eps_in_sqrt else g / (np.sqrt(s) + eps)
        return out, {"mu": mu, "nu": nu, "count": count}

    return Reference(init, update)


def scale_by_rss(initial_accumulator_value: float = 0.1, eps: float = 1e-7) -> Reference:
    """Adagrad (Duchi et al. 2011): s += g^2, u = g / sqrt(s + eps) (0 where s == 0)."""
    s0, eps = f32(initial_accumulator_value), f32(eps)

    def init(params: Flat) -> State:
        return {"s": _filled(params, s0)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        s = dict(state["s"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            s[p] = s[p] + g * g
            safe = np.where(s[p] > 0, s[p], 1.0)
            out[p] = np.where(s[p] > 0, g / np.sqrt(safe + eps), 0.0)
        return out, {"s": s}

    return Reference(init, update)


def scale_by_adadelta(rho: float = 0.9, eps: float = 1e-6) -> Reference:
    """Adadelta (Zeiler 2012): Eg = rho Eg + (1-rho) g^2; u = sqrt(Ex + eps)/sqrt(Eg + eps) g;
    Ex = rho Ex + (1-rho) u^2."""
    rho, eps = f32(rho), f32(eps)

    def init(params: Flat) -> State:
        return {"eg": _zeros(params), "ex": _zeros(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        eg, ex = dict(state["eg"]), dict(state["ex"])
        out = {}
        for p, g in grads.items():
            g = _f64(g)
            eg[p] = rho * eg[p] + (1.0 - rho) * g * g
            out[p] = np.sqrt(ex[p] + eps) / np.sqrt(eg[p] + eps) * g
            ex[p] = rho * ex[p] + (1.0 - rho) * out[p] ** 2
        return out, {"eg": eg, "ex": ex}

    return Reference(init, update)


def adagrad(learning_rate: LR, **kw) -> Reference:
    return _opt(scale_by_rss(**kw), learning_rate)


def adadelta(
    learning_rate: LR = 1.0, weight_decay: float | None = None, mask=None, **kw
) -> Reference:
    """The decay is added to the gradient before the rescaling (coupled L2)."""
    parts = [] if weight_decay is None else [add_decayed_weights(weight_decay, mask)]
    return chain(*parts, scale_by_adadelta(**kw), scale_by_learning_rate(learning_rate))


def rmsprop(
    learning_rate: LR,
    momentum: float | None = None,
    nesterov: bool = False,
    **kw,
) -> Reference:
    """RMS rescaling, then the learning rate, then momentum on the scaled steps."""
    parts = [scale_by_rms(**kw), scale_by_learning_rate(learning_rate)]
    if momentum is not None:
        parts.append(trace(momentum, nesterov))
    return chain(*parts)
