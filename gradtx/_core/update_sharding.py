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

from gradtx._layouts.packed import spec_axes
from gradtx._paths.paths import flatten, map_with_old


def _on_explicit_axes(sharding: Any) -> NamedSharding | None:
    """`sharding` if it is on a mesh with explicit axes, else None."""
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty or jax.sharding.AxisType.Explicit not in mesh.axis_types:
        return None
    return sharding


def _explicit_sharding(x: Any) -> NamedSharding | None:
    """`x`'s sharding where its type carries one on explicit mesh axes, else None."""
    if not isinstance(x, jax.Array):  # `None`, packed units, abstract leaves
        return None
    return _on_explicit_axes(getattr(jax.typeof(x), "sharding", None))


def explicit(tree: Any) -> bool:
    """Whether `tree`'s first array lives on explicit mesh axes (then all of a step does)."""
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            return _explicit_sharding(leaf) is not None
    return False


def _explicit_of(ref: Any) -> NamedSharding | None:
    """The explicit sharding of an array, or of an abstract leaf from `jax.eval_shape`."""
    if isinstance(ref, jax.Array):
        return _explicit_sharding(ref)
    return _on_explicit_axes(getattr(ref, "sharding", None))


def like(x: Any, ref: Any) -> Any:
    """`x` resharded to `ref`'s explicit sharding where the two differ, else `x`.

    For values that must have one type under explicit axes: the branches of a `lax.cond`,
    the cases of a `where`.
    """
    return _resharded(x, _explicit_of(ref))


def _resharded(x: Any, target: NamedSharding | None) -> Any:
    """`x` resharded to `target` where both are explicit and differ, else `x`."""
    if target is None:
        return x
    own = _explicit_sharding(x)
    if own is None or _spec(own) == _spec(target):
        return x
    return jax.sharding.reshard(x, target)


def _is_real(x: Any) -> bool:
    return bool(jax.numpy.issubdtype(x.dtype, jax.numpy.inexact))


def _spec(sharding: NamedSharding) -> tuple:
    return spec_axes(sharding.spec)


def like_params(updates: Any, params: Any) -> Any:
    """`updates`, each resharded to its parameter's sharding where that is explicit.

    Leaves are matched by path; an update whose parameter has no explicit sharding, or that
    already has the parameter's, is returned as it is (the same object).
    """
    if not explicit(params):
        return updates
    param_paths, param_leaves, _ = flatten(params)
    targets = {}
    for path, leaf in zip(param_paths, param_leaves):
        sharding = _explicit_sharding(leaf)
        if sharding is not None:
            targets[path] = sharding
    if not targets:
        return updates
    paths, leaves, treedef = flatten(updates)
    out = [_resharded(update, targets.get(path)) for path, update in zip(paths, leaves)]
    return jax.tree.unflatten(treedef, out)


def in_state_layout(g: Any, param: Any, slots: dict[str, Any]) -> tuple[Any, Any]:
    """`g` and `param` resharded to the layout of a slot shaped like them, if explicit.

    Under ZeRO-1 (or a declared state layout) a slot is split more finely than its gradient.
    Elementwise math mixes them, and explicit axes refuse some such mixes (`where`, `cond`
    branches), so the math runs in the state's layout: each device takes its slice of the
    gradient, which needs no communication. `like_params` gathers the updates at the end.
    """
    own = _explicit_sharding(g)
    if own is None:
        return g, param
    shape = tuple(g.shape)
    for slot in slots.values():
        target = _explicit_sharding(slot)
        if target is None or tuple(slot.shape) != shape or not _is_real(slot):
            continue
        if _spec(target) == _spec(own):
            return g, param
        g = jax.sharding.reshard(g, target)
        if _explicit_sharding(param) is not None:
            param = jax.sharding.reshard(param, target)
        return g, param
    return g, param


def whole(x: Any) -> Any:
    """`x` gathered onto every device where an explicit sharding splits it, else `x`.

    For math that needs all of an array at once under explicit axes: a reshape or slice
    across a split dimension, or a product over one (Newton-Schulz, the inner products of
    L-BFGS). Under automatic axes XLA inserts the same gather itself.
    """
    sharding = _explicit_sharding(x)
    if sharding is None or not _spec(sharding):
        return x
    return jax.sharding.reshard(x, NamedSharding(sharding.mesh, jax.sharding.PartitionSpec()))


def like_state(new_state: Any, state: Any) -> Any:
    """`new_state` with each leaf in the explicit layout of the same leaf of `state`.

    The state keeps its layout from step to step, as `state_shardings` promised it: a slot
    that the math rebuilt from whole arrays (a line search's gradient at its last point) is
    split again where the old one was.
    """

    def laid_out(_: tuple, leaf: Any, ref: Any) -> Any:
        same = ref is not None and getattr(ref, "shape", None) == getattr(leaf, "shape", ())
        return like(leaf, ref) if same and isinstance(leaf, jax.Array) else leaf

    return map_with_old(laid_out, new_state, state)
