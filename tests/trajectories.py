"""Training runs that record the evaluation weights beside the params, step by step."""

from __future__ import annotations

from typing import Any

import jax

import gradtx


def eval_trajectory(tx: Any, params: Any, grads: list) -> tuple[list, list, Any]:
    """Jitted steps of `tx` from `params` over `grads`: the params after each step, the
    evaluation weights (`gradtx.eval_params`) after each step, and the last state."""

    @jax.jit
    def step(params, state, g):
        u, state = tx.update(g, state, params)
        params = gradtx.apply_updates(params, u)
        return params, state, gradtx.eval_params(tx, state, params)

    state, ys, xs = tx.init(params), [], []
    for g in grads:
        params, state, x = step(params, state, g)
        ys.append(params)
        xs.append(x)
    return ys, xs, state
