"""Reductions over trees matched by path (`gradtx.tree.vdot`, `sum`, `norm`, ...).

`None` leaves are skipped, and every reduction accumulates in at least float32, so a
bfloat16 tree gives a float32 result.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import compute_dtype
from gradtx._core.tree_math import _acc, _aligned, _present, _same_shape, _total

__all__ = ["allclose", "max", "min", "norm", "size", "sum", "vdot"]


def vdot(a: Any, b: Any) -> jax.Array:
    """The inner product `sum(conj(a) * b)` over all leaves, accumulated in at least float32.

    Args:
        a: a tree.
        b: a tree with the same paths and shapes.

    Returns:
        A scalar; paths where either input is `None` are skipped.

    Examples:
        >>> gradtx.tree.vdot({"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([3.0, 4.0])})
        Array(11., dtype=float32)
    """
    _, paths, (xs, ys) = _aligned("vdot", ["a", "b"], [a, b])
    parts = []
    for p, x, y in zip(paths, xs, ys):
        if x is None or y is None:
            continue
        _same_shape("vdot", p, x, y)
        dtype = _acc(x, y)
        x, y = jnp.asarray(x).astype(dtype), jnp.asarray(y).astype(dtype)
        parts.append(jnp.sum(jnp.conj(x) * y))
    return _total(parts)


def sum(tree: Any) -> jax.Array:
    """The sum of every element of every leaf, accumulated in at least float32.

    Args:
        tree: a tree; `None` leaves are skipped.

    Returns:
        A scalar (0 for a tree with no leaves).

    Examples:
        >>> gradtx.tree.sum({"w": jnp.ones(3, jnp.bfloat16), "b": [jnp.ones(2), None]})
        Array(5., dtype=float32)
    """
    parts = [jnp.sum(jnp.asarray(x), dtype=_acc(x)) for _, x in _present(tree)]
    return _total(parts)


_ORDS = {1: 1, 2: 2, math.inf: math.inf}


def norm(tree: Any, ord: int | float | str = 2, squared: bool = False) -> jax.Array:
    """The norm of all leaves together, as if concatenated into one vector.

    Args:
        tree: a tree; `None` leaves are skipped.
        ord: `1` (sum of absolute values), `2` (Euclidean) or `math.inf` / `"inf"` (largest
            absolute value).
        squared: return the norm squared (for `ord=2`, the sum of squares without a square
            root).

    Returns:
        A scalar in at least float32 (0 for a tree with no elements).

    Examples:
        >>> tree = {"a": jnp.array([3.0]), "b": jnp.array([-4.0]), "c": None}
        >>> gradtx.tree.norm(tree), gradtx.tree.norm(tree, ord=1), gradtx.tree.norm(tree, "inf")
        (Array(5., dtype=float32), Array(7., dtype=float32), Array(4., dtype=float32))
    """
    key = math.inf if isinstance(ord, str) and ord.lower() == "inf" else ord
    if isinstance(key, str) or key not in _ORDS:
        raise ValueError(f"tree.norm: `ord` must be 1, 2 or inf, got {ord!r}.")
    leaves = [jnp.asarray(x) for _, x in _present(tree)]
    if key == 2:
        parts = []
        for x in leaves:
            y = jnp.abs(x.astype(_acc(x)))
            parts.append(jnp.sum(y * y))
        total = _total(parts)
        return total if squared else jnp.sqrt(total)
    if key == 1:
        value = _total([jnp.sum(jnp.abs(x.astype(_acc(x)))) for x in leaves])
    else:
        parts = [jnp.max(jnp.abs(x)).astype(_acc(x)) for x in leaves if x.size]
        dtype = compute_dtype(*parts)
        value = jnp.zeros((), dtype)
        for part in parts:
            value = jnp.maximum(value, part.astype(dtype))
    return value * value if squared else value


def _extremum(fn: str, tree: Any, reduce: Callable, combine: Callable) -> jax.Array:
    parts = [reduce(jnp.asarray(x)).astype(_acc(x)) for _, x in _present(tree) if jnp.size(x)]
    if not parts:
        raise ValueError(f"tree.{fn}: the tree has no elements (only `None` or empty leaves).")
    dtype = compute_dtype(*parts)
    value = parts[0].astype(dtype)
    for part in parts[1:]:
        value = combine(value, part.astype(dtype))
    return value


def max(tree: Any) -> jax.Array:
    """The largest element of all leaves, in at least float32.

    Args:
        tree: a tree with at least one element; `None` and empty leaves are skipped.

    Returns:
        A scalar.

    Examples:
        >>> gradtx.tree.max({"a": jnp.array([1.0, 5.0]), "b": [jnp.array(-3.0), None]})
        Array(5., dtype=float32)
    """
    return _extremum("max", tree, jnp.max, jnp.maximum)


def min(tree: Any) -> jax.Array:
    """The smallest element of all leaves, in at least float32.

    Args:
        tree: a tree with at least one element; `None` and empty leaves are skipped.

    Returns:
        A scalar.

    Examples:
        >>> gradtx.tree.min({"a": jnp.array([1.0, 5.0]), "b": [jnp.array(-3.0), None]})
        Array(-3., dtype=float32)
    """
    return _extremum("min", tree, jnp.min, jnp.minimum)


def size(tree: Any) -> int:
    """The number of elements in all leaves together (a Python int, static under `jit`).

    Args:
        tree: a tree; `None` leaves count as 0.

    Returns:
        The total number of elements.

    Examples:
        >>> gradtx.tree.size({"w": jnp.ones((2, 3)), "b": jnp.ones(3), "frozen": None})
        9
    """
    return int(builtins.sum(int(np.prod(jnp.shape(x))) for _, x in _present(tree)))


def allclose(
    a: Any, b: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False
) -> jax.Array:
    """Whether every leaf of `a` is close to `b`'s leaf at the same path (as `jnp.allclose`).

    Leaves are compared in the wider of their two dtypes (at least float32). A path where
    both trees have `None` is skipped; `None` in only one of them makes the trees not close.

    Args:
        a: a tree.
        b: a tree with the same paths and shapes.
        rtol: relative tolerance.
        atol: absolute tolerance.
        equal_nan: count NaNs at the same position as equal.

    Returns:
        A bool scalar array (usable under `jit`).

    Examples:
        >>> a = {"w": jnp.ones(2, jnp.bfloat16)}
        >>> gradtx.tree.allclose(a, {"w": jnp.full(2, 1.001)}, rtol=1e-2)
        Array(True, dtype=bool)
    """
    _, paths, (xs, ys) = _aligned("allclose", ["a", "b"], [a, b])
    result = jnp.asarray(True)
    for p, x, y in zip(paths, xs, ys):
        if x is None and y is None:
            continue
        if x is None or y is None:
            return jnp.asarray(False)
        _same_shape("allclose", p, x, y)
        dtype = _acc(x, y)
        close = jnp.allclose(
            jnp.asarray(x).astype(dtype),
            jnp.asarray(y).astype(dtype),
            rtol=rtol,
            atol=atol,
            equal_nan=equal_nan,
        )
        result = result & close
    return result
