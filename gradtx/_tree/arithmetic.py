"""Elementwise tree functions that combine trees by path, not by position.

Every function here matches leaves by their path (`enc/layers/0/w`), so a dict and a
dataclass with the same paths combine, and two trees whose paths differ raise an error that
names the first differing path. The result has the structure of the first tree.

A `None` leaf means "nothing here" (a frozen part, a missing gradient): these functions
return `None` at a path where any input is `None` (the reductions skip it). Nothing is
modified in place.
"""

from __future__ import annotations

import builtins
import functools
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from gradtx._paths.paths import flatten
from gradtx._paths.selectors import _is_bool, select

_SHOWN = 6


def _sample(paths: Sequence[str]) -> str:
    shown = ", ".join(repr(p) for p in paths[:_SHOWN])
    return f"[{shown}{', ...' if len(paths) > _SHOWN else ''}]"


def aligned(owner: str, names: Sequence[str], trees: Sequence[Any]) -> tuple[Any, tuple, list]:
    """`(treedef of the first tree, its paths, [leaves of each tree in that path order])`.

    Raises a `ValueError`, from `owner`, naming the first path that one tree has and the
    first lacks.
    """
    paths, first, treedef = flatten(trees[0])
    columns = [first]
    for name, tree in zip(names[1:], trees[1:]):
        other_paths, other_leaves, _ = flatten(tree)
        if other_paths == paths:
            columns.append(other_leaves)
            continue
        index = dict(zip(other_paths, other_leaves))
        missing = [p for p in paths if p not in index]
        known = builtins.set(paths)
        extra = [p for p in other_paths if p not in known]
        if missing or extra:
            where = (
                f"path {missing[0]!r} is in `{names[0]}` but not in `{name}`"
                if missing
                else f"path {extra[0]!r} is in `{name}` but not in `{names[0]}`"
            )
            raise ValueError(
                f"{owner}: the trees must have the same paths, but {where}. "
                f"`{names[0]}` has paths {_sample(paths)}; `{name}` has {_sample(other_paths)}."
            )
        columns.append([index[p] for p in paths])
    return treedef, paths, columns


def _map(fn: str, names: Sequence[str], f: Callable, *trees: Any) -> Any:
    """`f(path, *leaves)` at each path, `None` where any input is `None`; shaped like `trees[0]`."""
    treedef, paths, columns = aligned(f"tree.{fn}", names, trees)
    out = [
        None if any(x is None for x in leaves) else f(p, *leaves)
        for p, leaves in zip(paths, zip(*columns))
    ]
    return treedef.unflatten(out)


def _present(tree: Any) -> list[tuple[str, Any]]:
    paths, leaves, _ = flatten(tree)
    return [(p, x) for p, x in zip(paths, leaves) if x is not None]


def _like(scalar: Any, leaf: Any) -> Any:
    """`scalar` in the dtype of a floating `leaf` (so a float32 scalar keeps bf16 leaves bf16)."""
    leaf = jnp.asarray(leaf)
    if jnp.issubdtype(leaf.dtype, jnp.inexact):
        return jnp.asarray(scalar).astype(leaf.dtype)
    return scalar


def _times(scalar: Any, leaf: Any) -> Any:
    """`scalar * leaf` in a floating leaf's dtype; an integer leaf is promoted as by NumPy."""
    leaf = jnp.asarray(leaf)
    if jnp.issubdtype(leaf.dtype, jnp.inexact):
        return _like(scalar, leaf) * leaf
    with jax.numpy_dtype_promotion("standard"):  # explicit: int32 * 0.5 is float32
        return jnp.asarray(scalar) * leaf


def add(a: Any, b: Any, *rest: Any) -> Any:
    """`a + b (+ ...)` leaf by leaf, matched by path.

    Args:
        a: a tree; the result has its structure.
        b: a tree with the same paths.
        *rest: more trees with the same paths.

    Returns:
        The sum at each path; `None` where any input is `None`.

    Examples:
        >>> gradtx.tree.add({"w": jnp.ones(2), "b": None}, {"w": jnp.ones(2), "b": 1.0})
        {'b': None, 'w': Array([2., 2.], dtype=float32)}
    """
    names = ["a", "b"] + [f"rest[{i}]" for i in range(len(rest))]
    return _map("add", names, lambda _, *xs: functools.reduce(operator.add, xs), a, b, *rest)


def sub(a: Any, b: Any) -> Any:
    """`a - b` leaf by leaf, matched by path.

    Args:
        a: a tree; the result has its structure.
        b: a tree with the same paths (any container: a dict matches a dataclass).

    Returns:
        The difference at each path; `None` where either input is `None`.

    Examples:
        >>> gradtx.tree.sub({"w": jnp.ones(2)}, {"w": jnp.full(2, 0.25)})
        {'w': Array([0.75, 0.75], dtype=float32)}
    """
    return _map("sub", ["a", "b"], lambda _, x, y: x - y, a, b)


def mul(a: Any, b: Any) -> Any:
    """`a * b` leaf by leaf (elementwise), matched by path.

    Args:
        a: a tree; the result has its structure.
        b: a tree with the same paths.

    Returns:
        The product at each path; `None` where either input is `None`.

    Examples:
        >>> gradtx.tree.mul({"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([3.0, 4.0])})
        {'w': Array([3., 8.], dtype=float32)}
    """
    return _map("mul", ["a", "b"], lambda _, x, y: x * y, a, b)


def div(a: Any, b: Any) -> Any:
    """`a / b` leaf by leaf (elementwise), matched by path.

    Args:
        a: a tree; the result has its structure.
        b: a tree with the same paths.

    Returns:
        The quotient at each path; `None` where either input is `None`.

    Examples:
        >>> gradtx.tree.div({"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([4.0, 4.0])})
        {'w': Array([0.25, 0.5 ], dtype=float32)}
    """
    return _map("div", ["a", "b"], lambda _, x, y: x / y, a, b)


def scale(scalar: Any, tree: Any) -> Any:
    """`scalar * tree`, each floating leaf keeping its dtype.

    Args:
        scalar: a number or scalar array, cast to each floating leaf's dtype (integer leaves
            are promoted as by NumPy: `int32 * 0.5` is float32).
        tree: a tree.

    Returns:
        A tree shaped like `tree`; `None` leaves stay `None`.

    Examples:
        >>> gradtx.tree.scale(0.5, {"w": jnp.ones(2, jnp.bfloat16), "b": None})
        {'b': None, 'w': Array([0.5, 0.5], dtype=bfloat16)}
    """
    return _map("scale", ["tree"], lambda _, x: _times(scalar, x), tree)


def add_scale(a: Any, scalar: Any, b: Any) -> Any:
    """`a + scalar * b` leaf by leaf, matched by path.

    Args:
        a: a tree; the result has its structure.
        scalar: a number or scalar array (cast to each floating leaf's dtype).
        b: a tree with the same paths.

    Returns:
        The result at each path; `None` where either input is `None`.

    Examples:
        >>> gradtx.tree.add_scale({"w": jnp.ones(2)}, -0.1, {"w": jnp.full(2, 5.0)})
        {'w': Array([0.5, 0.5], dtype=float32)}
    """

    def one(_: str, x: Any, y: Any) -> Any:
        with jax.numpy_dtype_promotion("standard"):  # integer leaves, promoted as by NumPy
            return x + _times(scalar, y)

    return _map("add_scale", ["a", "b"], one, a, b)


def zeros_like(tree: Any, dtype: Any = None) -> Any:
    """Zeros shaped like each leaf.

    Args:
        tree: a tree.
        dtype: the leaves' dtype; by default each leaf's own.

    Returns:
        A tree shaped like `tree`; `None` leaves stay `None`.

    Examples:
        >>> gradtx.tree.zeros_like({"w": jnp.ones(2), "frozen": None})
        {'frozen': None, 'w': Array([0., 0.], dtype=float32)}
    """
    return _map("zeros_like", ["tree"], lambda _, x: jnp.zeros_like(x, dtype=dtype), tree)


def ones_like(tree: Any, dtype: Any = None) -> Any:
    """Ones shaped like each leaf.

    Args:
        tree: a tree.
        dtype: the leaves' dtype; by default each leaf's own.

    Returns:
        A tree shaped like `tree`; `None` leaves stay `None`.

    Examples:
        >>> gradtx.tree.ones_like({"w": jnp.zeros(2)}, dtype=jnp.int32)
        {'w': Array([1, 1], dtype=int32)}
    """
    return _map("ones_like", ["tree"], lambda _, x: jnp.ones_like(x, dtype=dtype), tree)


def full_like(tree: Any, fill_value: Any, dtype: Any = None) -> Any:
    """`fill_value` shaped like each leaf.

    Args:
        tree: a tree.
        fill_value: the value of every element.
        dtype: the leaves' dtype; by default each leaf's own.

    Returns:
        A tree shaped like `tree`; `None` leaves stay `None`.

    Examples:
        >>> gradtx.tree.full_like({"w": jnp.zeros(2)}, 3.0)
        {'w': Array([3., 3.], dtype=float32)}
    """
    return _map("full_like", ["tree"], lambda _, x: jnp.full_like(x, fill_value, dtype=dtype), tree)


def cast(tree: Any, dtype: Any) -> Any:
    """Every leaf cast to `dtype` (all leaves, integer ones included).

    Args:
        tree: a tree.
        dtype: the target dtype; `None` returns the leaves as they are.

    Returns:
        A tree shaped like `tree`; `None` leaves stay `None`.

    Examples:
        >>> gradtx.tree.cast({"w": jnp.ones(2)}, jnp.bfloat16)
        {'w': Array([1, 1], dtype=bfloat16)}
    """
    return _map(
        "cast", ["tree"], lambda _, x: x if dtype is None else jnp.asarray(x).astype(dtype), tree
    )


def cast_like(tree: Any, other: Any) -> Any:
    """Each leaf of `tree` cast to the dtype of `other`'s leaf at the same path.

    Args:
        tree: a tree; the result has its structure.
        other: a tree with the same paths, giving the dtypes.

    Returns:
        The cast leaves; `None` where either input is `None`.

    Examples:
        >>> params = {"w": jnp.ones(2, jnp.bfloat16)}
        >>> gradtx.tree.cast_like({"w": jnp.full(2, 0.5)}, params)
        {'w': Array([0.5, 0.5], dtype=bfloat16)}
    """

    def one(_: str, x: Any, y: Any) -> Any:
        return jnp.asarray(x).astype(jnp.asarray(y).dtype)

    return _map("cast_like", ["tree", "other"], one, tree, other)


def clip(tree: Any, min_value: Any = None, max_value: Any = None) -> Any:
    """Each element clipped to `[min_value, max_value]`, each leaf keeping its dtype.

    Args:
        tree: a tree.
        min_value: the lower bound (a scalar), or `None` for none; for integer leaves it is
            rounded up.
        max_value: the upper bound (a scalar), or `None` for none; for integer leaves it is
            rounded down.

    Returns:
        A tree shaped like `tree`; `None` leaves stay `None`.

    Examples:
        >>> gradtx.tree.clip({"w": jnp.array([-2.0, 0.5, 3.0])}, -1.0, 1.0)
        {'w': Array([-1. ,  0.5,  1. ], dtype=float32)}
    """

    def bound(value: Any, x: Any, round_: Callable) -> Any:
        if value is None or jnp.issubdtype(x.dtype, jnp.inexact):
            return None if value is None else _like(value, x)
        return round_(jnp.asarray(value)).astype(x.dtype)  # integer leaves: whole bounds

    def one(_: str, x: Any) -> Any:
        x = jnp.asarray(x)
        return jnp.clip(x, bound(min_value, x, jnp.ceil), bound(max_value, x, jnp.floor))

    return _map("clip", ["tree"], one, tree)


def _is_bool_leaf(x: Any) -> bool:
    return isinstance(x, (bool, np.bool_)) or getattr(x, "dtype", None) == np.bool_


def _elementwise_bools(cond: Any) -> bool:
    """True for a tree of bool arrays to apply elementwise (not a tree of concrete bools)."""
    if isinstance(cond, (str, re.Pattern)):
        return False
    try:
        leaves = [x for _, x in _present(cond)]
    except Exception:
        return False
    if not leaves or not builtins.all(_is_bool_leaf(x) for x in leaves):
        return False
    return not builtins.all(_is_bool(x) and not isinstance(x, Tracer) for x in leaves)


def where(cond: Any, a: Any, b: Any, *, strict: bool = True) -> Any:
    """`a` where `cond` holds, `b` elsewhere, matched by path.

    `cond` is either a selector (a glob, list of globs, compiled regex, function, or a tree of
    Python bools that may be a prefix of the tree, see `gradtx.paths.select`), which picks
    whole leaves of `a` by path, or a tree of bool arrays with the same paths as `a`, applied
    elementwise as `jnp.where`.

    Args:
        cond: a selector or a tree of bool arrays.
        a: a tree; the result has its structure.
        b: a tree with the same paths.
        strict: with a selector, raise if it matches no path (it is almost always a typo).

    Returns:
        The chosen leaves; `None` where `a` or `b` is `None`.

    Examples:
        >>> a = {"enc": {"w": jnp.ones(2)}, "head": {"w": jnp.ones(2)}}
        >>> gradtx.tree.where("enc", a, gradtx.tree.zeros_like(a))["head"]
        {'w': Array([0., 0.], dtype=float32)}
        >>> mask = {"enc": {"w": jnp.array([True, False])}, "head": {"w": jnp.array([False, True])}}
        >>> gradtx.tree.where(mask, a, gradtx.tree.zeros_like(a))["enc"]
        {'w': Array([1., 0.], dtype=float32)}
    """  # noqa: E501
    if _elementwise_bools(cond):
        return _map("where", ["a", "b", "cond"], lambda _, x, y, c: jnp.where(c, x, y), a, b, cond)
    chosen = builtins.set(select(a, cond, strict=strict, argument="cond"))
    return _map("where", ["a", "b"], lambda p, x, y: x if p in chosen else y, a, b)


def map_with_path(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    """`fn(path, leaf, *rest_leaves)` at each path of `tree`, `rest` matched by path.

    Args:
        fn: called with the path string (`"enc/layers/0/w"`), the leaf of `tree` and the
            leaves of `rest` at that path.
        tree: a tree; the result has its structure.
        *rest: trees with the same paths.

    Returns:
        `fn`'s results; `None` (without calling `fn`) where any input is `None`.

    Examples:
        >>> params = {"w": jnp.ones(2), "bias": jnp.ones(2)}
        >>> gradtx.tree.map_with_path(lambda p, x: x * 0 if p.endswith("bias") else x, params)
        {'bias': Array([0., 0.], dtype=float32), 'w': Array([1., 1.], dtype=float32)}
    """
    names = ["tree"] + [f"rest[{i}]" for i in range(len(rest))]
    return _map("map_with_path", names, fn, tree, *rest)
