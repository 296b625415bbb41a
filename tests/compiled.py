"""The compiled program of a donated training step, as the tests that count its copies read it."""

from __future__ import annotations

from typing import Any

import jax

import gradtx


def donated_step_program(tx: Any, params: Any, grads: Any, apply: Any = None) -> str:
    """The entry computation of `tx`'s jitted step `(params, state, grads) -> (params,
    state)`, compiled with params and state donated; `apply` adds the updates to the params
    (default `gradtx.apply_updates`)."""
    apply = gradtx.apply_updates if apply is None else apply

    def step(p, s, g):
        updates, s = tx.update(g, s, p)
        return apply(p, updates), s

    lowered = jax.jit(step, donate_argnums=(0, 1)).lower(params, tx.init(params), grads)
    hlo = lowered.compile().as_text()
    return hlo[hlo.index("ENTRY") :]
