"""Contrib's shared step-size math: param copies, inner products, bias corrections."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from gradtx._core.lift import compute_dtype, update_slots, zeros_for
from gradtx._core.protocol import Params, Updates
from gradtx._paths.paths import flatten
from gradtx._tree.reductions import arrays_of


def copy_of(param: Any) -> jax.Array:
    """A copy of `param` (its own buffer, so params and state can both be donated).

    A `jax.ShapeDtypeStruct` has no values: it gives zeros of its shape and dtype, which is
    what restoring a checkpoint into `init(abstract_params)` needs.
    """
    if isinstance(param, jax.ShapeDtypeStruct):
        return zeros_for(param)
    return jnp.array(param, copy=True)


def paired_arrays(tree: Any, by_path: dict[str, Any]) -> list[tuple[jax.Array, jax.Array]]:
    """`(leaf_array, by_path[path]_array)` for every non-`None` leaf of `tree`.

    Packed units give one pair per buffer. A path missing from `by_path` is an error that
    names it.
    """
    out = []
    paths, leaves, _ = flatten(tree)
    for path, leaf in zip(paths, leaves):
        if leaf is None:
            continue
        if path not in by_path:
            raise KeyError(
                f"the state has no entry for path {path!r} (state paths: "
                f"{list(by_path)[:6]}); call `gradtx.reconcile(tx, state, params)` after "
                "changing the params."
            )
        out.extend(zip(arrays_of(leaf), arrays_of(by_path[path])))
    return out


def scalar_copy(value: Any) -> jax.Array:
    """A float32 scalar in a buffer of its own.

    A hyperparameter leaf must not be aliased by the state, or donating the state would
    donate the transformation's leaf too.
    """
    return jnp.array(value, dtype=jnp.float32, copy=True)


def bias_correction(decay: jax.Array, t: jax.Array) -> jax.Array:
    """`1 - decay**t` to full float32 precision: `-expm1(t * log1p(decay - 1))`.

    Written as `1 - decay**t` it loses up to 5 digits in float32 for `decay` near 1 and small
    `t` (`1 - 0.999**2`), which D-Adaptation's global step-size estimate then amplifies.
    """
    return -jnp.expm1(t * jnp.log1p(decay - 1))


def flat_dot(pairs: list[tuple[jax.Array, jax.Array]]) -> jax.Array:
    """The inner product of two trees given as `(a, b)` pairs of arrays, in float32.

    Each pair's products are summed by one reduction, which XLA fuses with the product: a
    single read of both arrays. (A sum in a fixed pairwise order, halving the array with
    elementwise adds, wrote the products out and read them back, which made DoG's step far
    slower on large leaves (benchmarks/kernels.py). The donated and plain compilations of a
    step still agree bit for bit.)
    """
    total = jnp.zeros((), jnp.float32)
    for a, b in pairs:
        dtype = compute_dtype(a, b)
        total = total + jnp.sum(a.astype(dtype) * b.astype(dtype)).astype(jnp.float32)
    return total


def adam_direction_updates(
    updates: Updates,
    slots: dict,
    params: Params,
    *,
    owner: str,
    step_size: Any,
    eps: Any,
    decay: Any,
) -> Any:
    """`-decay * p - step_size * m / (sqrt(v) + eps)` per path, from the moments as stored.

    The D-Adaptation and Prodigy AdamW steps both end this way, from the slots `exp_avg` (m)
    and `exp_avg_sq` (v); `step_size`, `eps` and `decay` are float32 scalars.
    """

    def step(g: Any, leaf: dict, param: Any) -> tuple[Any, dict]:
        dtype = compute_dtype(g, param, *leaf.values())
        m, v = leaf["exp_avg"].astype(dtype), leaf["exp_avg_sq"].astype(dtype)
        u = -decay.astype(dtype) * param.astype(dtype) - step_size.astype(dtype) * m / (
            jnp.sqrt(v) + eps.astype(dtype)
        )
        return u.astype(g.dtype), {}

    moments = {"exp_avg": slots["exp_avg"], "exp_avg_sq": slots["exp_avg_sq"]}
    new_updates, _ = update_slots(step, updates, moments, params, owner=owner, needs_params=True)
    return new_updates
