"""The one helper that lifts per-array math to trees of paths.

Transformations write their math for one array; these functions do the tree plumbing: paths,
`None` leaves (no gradient: no update, state unchanged), partial updates (only the paths
present in `updates` advance), state dtypes (a slot keeps its dtype), and boundary checks that
name the offending path.

Per-leaf state lives in *slots*: `{slot_name: {path: array}}`, e.g. Adam's
`{"mu": {...}, "nu": {...}, "count": {...}}`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gradtx._paths import flatten

__all__ = [
    "as_stored",
    "compute_dtype",
    "init_slots",
    "map_updates",
    "update_slots",
    "zeros_for",
]

Slots = dict[str, dict[str, Any]]


def compute_dtype(*arrays: Any) -> Any:
    """The dtype per-leaf math runs in: at least float32, float64 stays float64.

    Hyperparameters are float32, so `b2 = 0.999` never rounds to 1 for bfloat16 params.
    """
    dtype = jnp.float32
    # The dtypes are combined on purpose, so this must not fail under strict promotion.
    with jax.numpy_dtype_promotion("standard"):
        for a in arrays:
            dtype = jnp.promote_types(dtype, a.dtype)
    return dtype


def as_stored(value: Any, slot: Any) -> Any:
    """`value` rounded to `slot`'s storage dtype (and back to its own dtype).

    Computing an update from the state exactly as it is kept means the old state is not read
    again after the new one is written, so with donation XLA overwrites state in place instead
    of copying it first; it also makes a restored checkpoint continue bit-for-bit.
    """
    return value.astype(slot.dtype).astype(value.dtype)


def zeros_for(param: Any, dtype: Any = None) -> jax.Array:
    """Zeros shaped like `param` (an array, tracer or `jax.ShapeDtypeStruct`) with its sharding.

    Under `jit` with automatic sharding a tracer's sharding is unknown at trace time and plain
    zeros would come out replicated, so the zeros are derived from the parameter's data, which
    makes XLA give them the parameter's sharding (init runs once; the extra read is free).
    """
    dtype = param.dtype if dtype is None else jnp.dtype(dtype)
    if isinstance(param, jax.ShapeDtypeStruct):
        sharding = getattr(param, "sharding", None)
        return jnp.zeros(param.shape, dtype, device=sharding)
    if not isinstance(param, jax.core.Tracer):
        return jnp.zeros_like(param, dtype=dtype)  # copies a concrete array's sharding
    spec = getattr(getattr(jax.typeof(param), "sharding", None), "spec", None) or ()
    if any(axis is not None for axis in spec):  # explicit sharding is known while tracing
        return jnp.zeros_like(param, dtype=dtype)
    if param.size == 0 or not jnp.issubdtype(param.dtype, jnp.inexact):
        return jnp.zeros_like(param, dtype=dtype)
    return jnp.abs(jnp.nan_to_num(param * 0, nan=0.0, posinf=0.0, neginf=0.0)).astype(dtype)


def _shape_dtype(x: Any) -> tuple[tuple, Any]:
    return tuple(np.shape(x)), getattr(x, "dtype", None)


def init_slots(
    params: Any, leaf_init: Callable[[Any], dict], names: Iterable[str], where=None
) -> Slots:
    """Build slots `{name: {path: leaf_init(param)[name]}}` for the non-`None` leaves.

    Args:
        params: the params tree (arrays or `jax.ShapeDtypeStruct` leaves).
        leaf_init: per-array initialiser returning `{slot_name: array}`.
        names: the slot names; every one exists in the result, even for an empty tree.
        where: optional set of paths; others get no slots.
    """
    slots: Slots = {name: {} for name in names}
    paths, leaves, _ = flatten(params)
    for path, param in zip(paths, leaves):
        if param is None or (where is not None and path not in where):
            continue
        for name, value in leaf_init(param).items():
            slots[name][path] = value
    return slots


def _missing_state(owner: str, slot: str, path: str, known: dict) -> KeyError:
    hint = ", ".join(repr(p) for p in list(known)[:6])
    return KeyError(
        f"{owner}: the state has no {slot!r} entry for path {path!r}. The params changed since "
        f"`init` (state paths: {hint}{', ...' if len(known) > 6 else ''}). Call "
        "`gradtx.reconcile(tx, state, params)` to keep the surviving state and initialise "
        "the new paths."
    )


def _params_by_path(params: Any, owner: str, required: bool) -> dict[str, Any] | None:
    if params is None:
        if required:
            raise ValueError(f"{owner} needs the params: call `tx.update(updates, state, params)`.")
        return None
    paths, leaves, _ = flatten(params)
    return dict(zip(paths, leaves))


def update_slots(
    leaf_update: Callable[..., tuple[Any, dict]],
    updates: Any,
    slots: Slots,
    params: Any = None,
    *,
    owner: str,
    needs_params: bool = False,
    where: set[str] | None = None,
) -> tuple[Any, Slots]:
    """Apply `leaf_update(g, leaf_slots, param) -> (u, new_leaf_slots)` to every present path.

    Args:
        leaf_update: per-array math; `leaf_slots` is `{slot_name: array}` for that path and
            `param` is the parameter (or `None` when params were not given).
        updates: the gradient/update tree; `None` leaves pass through untouched.
        slots: the transformation's slots, `{slot_name: {path: array}}`.
        params: the params tree, or `None`.
        owner: the transformation's name, used in error messages.
        needs_params: raise a clear error if `params` is `None`.
        where: optional set of paths to transform; other paths pass through unchanged.

    Returns:
        The new updates (same structure as `updates`) and the new slots, in which only the
        transformed paths changed; each slot keeps its dtype.
    """
    paths, leaves, treedef = flatten(updates)
    by_path = _params_by_path(params, owner, needs_params)
    new_slots = {name: dict(values) for name, values in slots.items()}
    out = []
    for path, g in zip(paths, leaves):
        if g is None or (where is not None and path not in where):
            out.append(g)
            continue
        leaf_slots = {}
        for name, values in slots.items():
            if path not in values:
                raise _missing_state(owner, name, path, values)
            leaf_slots[name] = values[path]
        param = None
        if by_path is not None:
            param = by_path.get(path)
            if param is None and needs_params:
                raise KeyError(f"{owner}: the params have no leaf at path {path!r}.")
            if param is not None and _shape_dtype(param)[0] != tuple(np.shape(g)):
                raise ValueError(
                    f"{owner}: at path {path!r} the update has shape {tuple(np.shape(g))} but "
                    f"the parameter has shape {tuple(np.shape(param))}."
                )
        u, changed = leaf_update(g, leaf_slots, param)
        out.append(u)
        for name, value in changed.items():
            old = leaf_slots[name]
            new_slots[name][path] = jnp.asarray(value).astype(old.dtype)
    return treedef.unflatten(out), new_slots


def map_updates(
    fn: Callable[[Any, Any], Any],
    updates: Any,
    params: Any = None,
    *,
    owner: str,
    needs_params: bool = False,
    where: set[str] | None = None,
) -> Any:
    """Stateless lift: `fn(g, param) -> u` over the present paths (see `update_slots`)."""

    def leaf_update(g: Any, _: dict, param: Any) -> tuple[Any, dict]:
        return fn(g, param), {}

    new_updates, _ = update_slots(
        leaf_update, updates, {}, params, owner=owner, needs_params=needs_params, where=where
    )
    return new_updates
