"""Applying updates to params, matched by path."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from gradtx._core.call_checks import check_leaves
from gradtx._core.dispatch import eager_dispatch
from gradtx._core.lift import cast, promoted
from gradtx._core.protocol import Params, Updates
from gradtx._layouts.packed import check_same_layout
from gradtx._paths.paths import flatten, is_unit


def apply_updates(params: Params, updates: Updates) -> Params:
    """Return `params + updates`, matched by path, each result in its parameter's dtype.

    Each sum is taken in the promoted dtype of the parameter and its update and rounded once
    to the parameter's dtype: a float32 update (from float32 optimizer state) of a bfloat16
    parameter is added in float32. Code that adds updates by hand must do the same cast
    (`(p + u).astype(p.dtype)`), or the sum comes out in the update's wider dtype.

    Params whose update is `None` or absent are returned unchanged (the same array), so a
    partial update tree touches only its paths. The containers may differ (a dict of updates
    for a dataclass of params) as long as the paths agree. Nothing is modified in place.

    Args:
        params: the params tree.
        updates: updates for some or all of the params' paths.

    Returns:
        A tree with the structure of `params`.

    Examples:
        >>> params = {"w": jnp.ones(2, jnp.bfloat16), "b": jnp.zeros(2)}
        >>> gradtx.apply_updates(params, {"w": jnp.full(2, 0.5), "b": None})["w"]
        Array([1.5, 1.5], dtype=bfloat16)
    """
    p_paths, p_leaves, treedef = flatten(params)
    u_paths, u_leaves, _ = flatten(updates)
    check_leaves("apply_updates", "updates", u_paths, u_leaves)
    index = {path: i for i, path in enumerate(p_paths)}
    out = list(p_leaves)
    targets, pairs = [], []
    for path, u in zip(u_paths, u_leaves):
        if u is None:
            continue
        i = index.get(path)
        if i is None or p_leaves[i] is None:
            packed = [p for p, x in zip(p_paths, p_leaves) if is_unit(x)]
            hint = f" The params are packed at {packed}: pack the updates too." if packed else ""
            raise KeyError(
                f"apply_updates: there is an update for path {path!r} but no parameter there. "
                f"Parameter paths: {[p for p in p_paths[:6]]}{' ...' if len(p_paths) > 6 else ''}"
                + hint
            )
        if is_unit(p_leaves[i]) or is_unit(u):
            unit, other = (p_leaves[i], u) if is_unit(p_leaves[i]) else (u, p_leaves[i])
            check_same_layout(unit, other, "apply_updates", path)
        elif jnp.shape(p_leaves[i]) != jnp.shape(u):
            raise ValueError(
                f"apply_updates: at path {path!r} the update has shape {jnp.shape(u)} but the "
                f"parameter has shape {jnp.shape(p_leaves[i])}."
            )
        # A parameter without an update may be anything (an Equinox module's activation).
        check_leaves("apply_updates", "params", [path], [p_leaves[i]])
        targets.append(i)
        pairs.append((p_leaves[i], u))
    # Only the updated leaves go through the (eagerly: compiled) sum; the others are
    # returned as the very same arrays.
    # Packed params add buffer by buffer.
    flat_pairs, owners = [], []
    for k, (p, u) in enumerate(pairs):
        if is_unit(p):
            flat_pairs.extend(zip(p.buffers, u.buffers))
            owners.extend([k] * len(p.buffers))
        else:
            flat_pairs.append((p, u))
            owners.append(k)
    sums: list[list] = [[] for _ in pairs]
    for k, new in zip(owners, _add_pairs(flat_pairs)):
        sums[k].append(new)
    for k, (i, (p, _)) in enumerate(zip(targets, pairs)):
        out[i] = p.replace(tuple(sums[k])) if is_unit(p) else sums[k][0]
    return treedef.unflatten(out)


@eager_dispatch
def _add_pairs(pairs: list[tuple[Any, Any]]) -> list[Any]:
    # `lax.add` of two arrays cast to one dtype is what `+` would bind; `+` itself (a jitted
    # `jnp.add`) costs several times more tracing per leaf, on every trace of a step
    # (benchmarks/lab/host_overhead.py).
    out = []
    for p, u in pairs:
        p = p if isinstance(p, jax.Array) else jnp.asarray(p)
        dtype = promoted(p.dtype, u.dtype)  # explicit: add in the wider dtype
        p_, u_ = cast(p, dtype), cast(u, dtype)
        total = lax.add(p_, u_) if p_.shape == u_.shape else p_ + u_  # a shared scalar
        out.append(cast(total, p.dtype))
    return out
