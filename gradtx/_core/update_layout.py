"""Under explicit mesh axes, an update comes out with its parameter's sharding.

With explicit axes (`jax.sharding.AxisType.Explicit`) every array's type carries its
sharding, and arithmetic on a split operand gives a split result. So when the optimizer
state is split more finely than the params (ZeRO-1, or Flax's `optimizer_sharding`), the
updates come out split like the state, and `params + updates` would split the params too:
the next forward pass then fails or reshards. The user's own `update` call gives each update
its parameter's sharding instead, which is the all-gather ZeRO-1 needs, once, where it needs
it; `apply_updates` (gradtx's or optax's) then keeps each parameter as it was. Under
automatic axes nothing changes: XLA places what a step returns.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding

from gradtx._paths.paths import flatten

__all__ = ["like_params"]


def _explicit_sharding(x: Any) -> NamedSharding | None:
    """`x`'s sharding where its type carries one on explicit mesh axes, else None."""
    if not isinstance(x, jax.Array):  # `None`, packed units, abstract leaves
        return None
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty:
        return None
    explicit = jax.sharding.AxisType.Explicit
    return sharding if explicit in mesh.axis_types else None


def _spec(sharding: NamedSharding) -> tuple:
    entries = list(sharding.spec)
    while entries and entries[-1] is None:  # P("x") and P("x", None) are one layout
        entries.pop()
    return tuple(entries)


def like_params(updates: Any, params: Any) -> Any:
    """`updates`, each resharded to its parameter's sharding where that is explicit.

    Leaves are matched by path; an update whose parameter has no explicit sharding, or that
    already has the parameter's, is returned as it is (the same object).
    """
    param_paths, param_leaves, _ = flatten(params)
    targets = {}
    for path, leaf in zip(param_paths, param_leaves):
        sharding = _explicit_sharding(leaf)
        if sharding is not None:
            targets[path] = sharding
    if not targets:
        return updates
    paths, leaves, treedef = flatten(updates)
    out = []
    for path, update in zip(paths, leaves):
        target = targets.get(path)
        own = _explicit_sharding(update) if target is not None else None
        if own is not None and _spec(own) != _spec(target):
            update = jax.sharding.reshard(update, target)
        out.append(update)
    return jax.tree.unflatten(treedef, out)
