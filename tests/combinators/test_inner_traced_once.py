"""Combinators that run their inner step in a `lax.cond` or for a check trace it once."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import gradtx

PARAMS = {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)}


def counting(inner: gradtx.Transformation, calls: list) -> gradtx.Transformation:
    """`inner` after a pass-through step that counts its Python calls (the traces)."""

    def count(updates, params):
        calls.append(1)
        return updates

    return gradtx.chain(gradtx.stateless(count), inner)


INNER = {  # elementwise steps, without and with per-element state
    "sgd": lambda: gradtx.sgd(0.1),
    "adam": lambda: gradtx.adam(0.1),
}


WRAPPERS = {
    "apply_if_finite": lambda tx: gradtx.apply_if_finite(tx, 3),
    "apply_if_finite, gradients": lambda tx: gradtx.apply_if_finite(tx, 3, check_updates=False),
    "accumulate": lambda tx: gradtx.accumulate(tx, 4),
    "conditionally_mask": lambda tx: gradtx.conditionally_mask(tx, lambda step: step % 2 == 0),
}


@pytest.mark.parametrize("inner", list(INNER.values()), ids=list(INNER))
@pytest.mark.parametrize("wrap", list(WRAPPERS.values()), ids=list(WRAPPERS))
def test_the_inner_update_is_traced_once_per_step(wrap, inner):
    """The wrapper looks at the inner step, needs its output shapes and runs it (in a branch,
    or for a check) from one trace, replayed: on many leaves each trace of Adam costs more
    than the rest of building the step. The replayed step gives the traced one's results."""
    calls: list = []
    tx = wrap(counting(inner(), calls))
    state = tx.init(PARAMS)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), PARAMS)
    del calls[:]
    step = jax.jit(lambda g, s: tx.update(g, s, PARAMS))
    updates, _ = step(grads, state)
    assert len(calls) == 1
    reference = wrap(counting(inner(), []))
    expected, _ = reference.update(grads, reference.init(PARAMS), PARAMS)
    for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(expected)):
        assert jnp.array_equal(a, b)
