"""Predicates that reject a micro-step of `multi_steps` (`should_skip_update_fn=`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from gradtx._core.protocol import Params, Updates
from gradtx._tree.reductions import global_sum


def skip_not_finite(
    updates: Updates, gradient_step: Any, params: Params
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""Skip a micro-step whose updates hold a NaN or an infinity.

    For `gradtx.multi_steps(..., should_skip_update_fn=gradtx.skip_not_finite)`: the call is
    rejected when $n = \#\{i : u_i \notin \mathbb{R}\} > 0$, counted over every element of
    every leaf (integer leaves are always finite).

    Args:
        updates: the gradient of the micro-step (`None` leaves are skipped).
        gradient_step: the optimizer step (unused; part of the predicate's signature).
        params: the params (unused; part of the predicate's signature).

    Returns:
        `(should_skip, aux)`: a bool scalar, and `{"should_skip": ..., "num_not_finite": n}`
        with `n` an int32 scalar.

    Examples:
        >>> skip, aux = gradtx.skip_not_finite(
        ...     {"w": jnp.array([1.0, jnp.nan]), "b": jnp.array([jnp.inf])}, 0, None
        ... )
        >>> bool(skip), int(aux["num_not_finite"])
        (True, 2)
    """
    del gradient_step, params
    count = jnp.zeros((), jnp.int32)
    for x in jax.tree.leaves(updates):  # `None` skipped; packed params give their buffers
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact):
            count = count + jnp.sum(~jnp.isfinite(x), dtype=jnp.int32)
    should_skip = count > 0
    return should_skip, {"should_skip": should_skip, "num_not_finite": count}


def skip_large_updates(
    updates: Updates, gradient_step: Any, params: Params, max_squared_norm: Any
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""Skip a micro-step whose updates have a squared global norm of `max_squared_norm` or more.

    The call is rejected unless $\|u\|_2^2 = \sum_i |u_i|^2 < $ `max_squared_norm`, so a NaN
    or infinite norm is rejected too. Bind the bound before passing it to `multi_steps`, once
    (a plain function is static structure, so the same object reuses a compiled step):
    `skip = functools.partial(gradtx.skip_large_updates, max_squared_norm=100.0)`.

    Args:
        updates: the gradient of the micro-step (`None` leaves are skipped).
        gradient_step: the optimizer step (unused; part of the predicate's signature).
        params: the params (unused; part of the predicate's signature).
        max_squared_norm: the smallest squared norm that is rejected.

    Returns:
        `(should_skip, aux)`: a bool scalar, and `{"should_skip": ..., "norm_squared": ...}`
        with the squared norm accumulated in at least float32.

    Examples:
        >>> skip, aux = gradtx.skip_large_updates({"w": jnp.array([3.0, 4.0])}, 0, None, 20.0)
        >>> bool(skip), float(aux["norm_squared"])
        (True, 25.0)
    """
    del gradient_step, params
    total = global_sum(updates, dtype=None)
    limit = jnp.asarray(max_squared_norm).astype(total.dtype)
    should_skip = ~(total < limit)
    return should_skip, {"should_skip": should_skip, "norm_squared": total}
