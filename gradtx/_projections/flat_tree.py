"""A params tree read as one vector: its float arrays in path order, and the way back.

Trees are matched by path (bounds and directions may be other containers with the same
paths); a `None` leaf stays `None` and takes no part; a packed unit (`gradtx.pack`) gives its
buffers. Whole-tree reductions run in at least float32, and `rebuild` rounds every result
once to the dtype of the array it replaces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from gradtx._core.lift import compute_dtype
from gradtx._layouts.packed import Packed, check_same_layout
from gradtx._paths.paths import flatten, is_unit

_SHOWN = 6


class FlatTree:
    """The arrays of a tree in order (a packed unit gives its buffers) and how to rebuild it."""

    def __init__(self, fn: str, tree: Any) -> None:
        self.fn = fn
        self.paths, self.leaves, self.treedef = flatten(tree)
        self.arrays: list[jax.Array] = []
        for path, leaf in zip(self.paths, self.leaves):
            if leaf is None:
                continue
            if is_unit(leaf) and not isinstance(leaf, Packed):
                raise TypeError(f"{fn}: the leaf at {path!r} is a {type(leaf).__name__}.")
            for part in leaf.buffers if is_unit(leaf) else [jnp.asarray(leaf)]:
                if not jnp.issubdtype(part.dtype, jnp.floating):
                    raise TypeError(
                        f"{fn}: the leaf at {path!r} has dtype {part.dtype}; projections "
                        "act on real floating-point arrays."
                    )
                self.arrays.append(part)

    def dtype(self) -> Any:
        """The dtype of reductions over the whole tree: at least float32."""
        return compute_dtype(*self.arrays) if self.arrays else jnp.dtype(jnp.float32)

    def rebuild(self, arrays: list[Any]) -> Any:
        """The tree with `arrays` in place of its own, each cast to the dtype it replaces."""
        it = iter(a.astype(old.dtype) for a, old in zip(arrays, self.arrays))
        out = []
        for leaf in self.leaves:
            if leaf is None:
                out.append(None)
            elif is_unit(leaf):
                out.append(leaf.replace(tuple(next(it) for _ in leaf.buffers)))
            else:
                out.append(next(it))
        return self.treedef.unflatten(out)

    def each(self, f: Callable[..., Any], *others: list[Any]) -> Any:
        """`f(x, *other values)` per array, in the array's compute dtype; the rebuilt tree."""
        out = []
        for i, x in enumerate(self.arrays):
            dtype = compute_dtype(x)
            out.append(f(x.astype(dtype), *(jnp.asarray(o[i]).astype(dtype) for o in others)))
        return self.rebuild(out)

    def scaled(self, factor: Any, dtype: Any) -> Any:
        """Every array times one scalar `factor`, computed in `dtype`."""
        return self.rebuild([x.astype(dtype) * factor for x in self.arrays])

    def like(self, name: str, other: Any) -> list[Any]:
        """`other`'s arrays in this tree's order.

        `other` is one value for every array (a scalar), or a tree with the same paths whose
        leaves have the same shapes (paths where this tree is `None` may be left out).
        """
        if _is_value(other):
            value = jnp.asarray(other)
            if value.ndim and len(self.paths) != 1:
                raise ValueError(
                    f"{self.fn}: `{name}` must be a scalar or a tree with the paths of the "
                    f"tree, got an array of shape {value.shape}."
                )
            return [value] * len(self.arrays)
        paths, leaves, _ = flatten(other)
        by_path = dict(zip(paths, leaves))
        lost = [p for p, x in zip(self.paths, self.leaves) if x is not None and p not in by_path]
        extra = [p for p in paths if p not in set(self.paths)]
        if lost or extra:
            where = (
                f"path {lost[0]!r} is in the tree but not in `{name}`"
                if lost
                else f"path {extra[0]!r} is in `{name}` but not in the tree"
            )
            raise ValueError(
                f"{self.fn}: `{name}` must have the paths of the tree, but {where} (tree: "
                f"{list(self.paths)[:_SHOWN]}; `{name}`: {list(paths)[:_SHOWN]})."
            )
        out: list[Any] = []
        for path, leaf in zip(self.paths, self.leaves):
            if leaf is None:  # takes no part: `other` may have anything there, or nothing
                continue
            value = by_path[path]
            if value is None:
                raise ValueError(f"{self.fn}: `{name}` is None at path {path!r}.")
            if is_unit(leaf) or is_unit(value):
                unit, also = (leaf, value) if is_unit(leaf) else (value, leaf)
                check_same_layout(unit, also, self.fn, path)
                out.extend(value.buffers)
                continue
            value = jnp.asarray(value)
            if value.ndim and value.shape != jnp.shape(leaf):
                raise ValueError(
                    f"{self.fn}: at path {path!r} `{name}` has shape {value.shape} but the "
                    f"tree has shape {jnp.shape(leaf)}."
                )
            out.append(value)
        return out


def _is_value(x: Any) -> bool:
    """A number or an array (one value for every leaf), not a tree."""
    if x is None or is_unit(x):
        return False
    return jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x))


def scalar(fn: str, name: str, value: Any) -> jax.Array:
    """`value` as an array, or a `ValueError` naming `fn` and `name` if it is not a scalar."""
    array = jnp.asarray(value)
    if array.ndim:
        raise ValueError(f"{fn}: `{name}` must be a scalar, got shape {array.shape}.")
    return array


def vdot(xs: list[Any], ys: list[Any], dtype: Any) -> jax.Array:
    """The inner product of two lists of arrays read as one vector each, in `dtype`."""
    total = jnp.zeros((), dtype)
    for x, y in zip(xs, ys):
        total = total + jnp.sum(x.astype(dtype) * jnp.broadcast_to(y, x.shape).astype(dtype))
    return total
