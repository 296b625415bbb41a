"""Registry entries (see `registry.Entry`) of `multi_steps` with optax's options (a scheduled
k and a skip predicate) and of the transformations made from functions, `stateless` and
`stateless_with_tree_map`, with the NumPy references of tests/references_helpers.py."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import references as ref
import references_helpers as rh
from registry import Entry, _f

import gradtx
from gradtx import schedules

LR_SWEEP = (0.02, 0.05, 0.1)


def _every_k() -> Any:
    """3 calls for the first optimizer step (so the third call of the contract's tests is an
    optimizer step), 2 afterwards; a schedule, so its numbers are leaves of the pytree."""
    return schedules.piecewise_constant(3.0, {1: 2.0 / 3.0})


def _optax_every_k(step: Any) -> Any:
    return jnp.where(step < 1, 3, 2)


# The functions are module-level objects: a plain function is static structure, and
# `jax.tree_util.Partial` keeps the learning rate as a leaf (swept without recompiling).
def _sgd_step(lr: Any, updates: Any, params: Any) -> Any:
    """`u = -lr * g` on the whole tree (`gradtx.tree.scale` keeps `None` leaves)."""
    return gradtx.tree.scale(-lr, updates)


def _soft_sign_step(lr: Any, g: Any, param: Any) -> Any:
    """`u = -lr * g / (1 + |g|)` for one array, in the gradient's dtype."""
    return -jnp.asarray(lr, g.dtype) * g / (1 + jnp.abs(g))


def _ref_soft_sign(lr: float):
    step = ref.f32(lr)
    return lambda g, p: -step * g / (1.0 + np.abs(g))


HELPERS: tuple[Entry, ...] = (
    Entry(
        # "param": accumulators in the params' dtype, as the contract's bf16 test expects.
        id="multi_steps-schedule-skip",
        name="multi_steps",
        make=lambda lr: gradtx.multi_steps(
            gradtx.sgd(lr, momentum=0.9),
            every_k_schedule=_every_k(),
            should_skip_update_fn=gradtx.skip_not_finite,
            accumulator_dtype="param",
        ),
        reference=lambda lr: rh.multi_steps(
            ref.sgd(lr, momentum=0.9), lambda t: 3 if t < 1 else 2, rh.any_not_finite
        ),
        oracle=lambda lr: optax.MultiSteps(
            optax.sgd(_f(lr), momentum=_f(0.9)),
            every_k_schedule=_optax_every_k,
            should_skip_update_fn=optax.skip_not_finite,
        ).gradient_transformation(),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.multi_steps(
            gradtx.sgd(lr, momentum=0.9, accumulator_dtype=dt),
            every_k_schedule=_every_k(),
            should_skip_update_fn=gradtx.skip_not_finite,
            accumulator_dtype=dt,
        ),
    ),
    Entry(
        id="stateless-sgd",
        name="stateless",
        make=lambda lr: gradtx.stateless(jax.tree_util.Partial(_sgd_step, lr)),
        reference=lambda lr: rh.stateless(lambda g, p: {k: -ref.f32(lr) * v for k, v in g.items()}),
        oracle=lambda lr: optax.stateless(lambda u, p: jax.tree.map(lambda g: -_f(lr) * g, u)),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
        packed=False,  # `f` sees the whole tree: packed params are refused
    ),
    Entry(
        id="stateless_with_tree_map-soft-sign",
        name="stateless_with_tree_map",
        make=lambda lr: gradtx.stateless_with_tree_map(jax.tree_util.Partial(_soft_sign_step, lr)),
        reference=lambda lr: rh.stateless_with_tree_map(_ref_soft_sign(lr)),
        oracle=lambda lr: optax.stateless_with_tree_map(
            lambda g, p: -_f(lr) * g / (1 + jnp.abs(g))
        ),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
    ),
)
