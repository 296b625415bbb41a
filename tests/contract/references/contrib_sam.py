"""References of gradtx.contrib's sharpness-aware minimisation (`sam`): an adversarial
step every `sync_period` calls, then the outer optimizer's step from the synced params.
"""

from __future__ import annotations

from references import Flat, Reference, State, _f64, chain, scale_by_learning_rate
from references.gradient_edits import normalize_by_update_norm


def _copies(params: Flat) -> Flat:
    return {p: _f64(x).copy() for p, x in params.items()}


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
