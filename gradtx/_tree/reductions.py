"""Reductions over trees matched by path (`gradtx.tree.vdot`, `sum`, `norm`, ...).

`None` leaves are skipped, and every reduction accumulates in at least float32, so a
bfloat16 tree gives a float32 result.

`global_sum` is the one reduction of a whole tree that every global norm goes through
(`gradtx.tree.norm`, `clip_by_global_norm` and its relatives, the skip predicates, contrib's
step-size estimates): it reads packed params by their buffers, a complex leaf as its pair of
reals, and the small leaves side by side.
"""

from __future__ import annotations

import builtins
import functools
import math
from collections.abc import Callable, ValuesView
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gradtx._core.lift import compute_dtype, split_explicitly
from gradtx._core.widening import narrow_source
from gradtx._layouts.complex import is_complex, to_real
from gradtx._layouts.packed import LARGE_LEAF, concatenate
from gradtx._paths.paths import flatten, is_unit
from gradtx._tree.arithmetic import _present, aligned


def _acc(*arrays: Any) -> Any:
    """The dtype reductions accumulate in: at least float32 (complex stays complex)."""
    return compute_dtype(*(jnp.asarray(a) for a in arrays))


def _fold(combine: Callable, parts: list[Any]) -> jax.Array:
    """`combine` over per-leaf scalars, in the widest of their dtypes."""
    dtype = compute_dtype(*parts)
    first, *rest = (part.astype(dtype) for part in parts)
    return functools.reduce(combine, rest, first)


def _total(parts: list[Any]) -> jax.Array:
    """The sum of per-leaf scalars, in the widest of their dtypes (float32 0 for none)."""
    return _fold(jnp.add, [jnp.zeros((), jnp.float32), *parts])


def _pair(fn: str, path: str, x: Any, y: Any) -> tuple[jax.Array, jax.Array]:
    """`x` and `y` in the dtype both reduce in, after checking that their shapes agree."""
    if jnp.shape(x) != jnp.shape(y):
        raise ValueError(
            f"tree.{fn}: at path {path!r} the shapes differ: {jnp.shape(x)} and {jnp.shape(y)}."
        )
    dtype = _acc(x, y)
    return jnp.asarray(x).astype(dtype), jnp.asarray(y).astype(dtype)


def arrays_of(value: Any) -> tuple:
    """The arrays behind one leaf of a tree: a packed unit's buffers, else the leaf itself.

    A complex array gives its real view (complex parameters are pairs of reals), so sums see
    `re^2 + im^2` and line up with state kept in the real layout. `None` gives none.
    """
    if value is None:
        return ()
    if is_unit(value):
        return tuple(value.buffers)
    if not hasattr(value, "dtype"):  # a Python number
        value = jnp.asarray(value)
    return (to_real(value),) if is_complex(value) else (value,)


def _squares(x: jax.Array) -> jax.Array:
    return jnp.sum(x * x)


def sum_of_squares(x: Any) -> jax.Array:
    """`sum(|x|^2)` of one array, in at least float32 (a complex one as its pair of reals)."""
    (array,) = arrays_of(x)
    return _squares(_widened(array))


def _joins_small(x: Any) -> bool:
    """Whether `x` joins the shared reduction of small leaves.

    That is a real float of at most 32 bits with fewer than `LARGE_LEAF` elements, not split
    over devices by an explicit sharding (which a flattening reshape may not cross).
    """
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize > 4:
        return False
    return np.size(x) < LARGE_LEAF and not split_explicitly(x)


def _widened(x: Any) -> jax.Array:
    """`x` in the dtype it is reduced in (`compute_dtype`)."""
    dtype = compute_dtype(x)
    if x.dtype != dtype and jnp.issubdtype(x.dtype, jnp.floating):
        # XLA's CPU backend hands a large reduction to a library kernel that cannot fuse a
        # conversion other consumers share (see gradtx/_core/widening.py); behind the barrier
        # the conversion is the reduction's own, which makes it much faster
        # (benchmarks/lab/moments.py).
        x = lax.optimization_barrier(x)
    return x.astype(dtype)


def global_sum(
    tree: Any, fn: Callable[[jax.Array], jax.Array] = _squares, *, dtype: Any = jnp.float32
) -> jax.Array:
    """`sum(fn(array))` over every array of `tree`; by default its sum of squares.

    Every array is one of `arrays_of` a leaf (packed buffers, a complex leaf's real view;
    `None` skipped), reduced in at least float32. `fn` must sum a function of the elements
    (`jnp.sum(x * x)`, `jnp.sum(jnp.abs(x))`): the small leaves are reduced together, by one
    `fn` of them side by side, which compiles far faster than a reduction per leaf
    (benchmarks/compile_time.py): each reduction is a kernel and an output of its own, and
    the copy is small.

    Args:
        tree: a tree, or the values of a dict of trees.
        fn: the sum over one array.
        dtype: the dtype of the result; `None` for the widest of the arrays' (at least float32).
    """
    if isinstance(tree, ValuesView):
        tree = list(tree)
    parts, small = [], []
    for leaf in flatten(tree)[1]:
        for array in arrays_of(leaf):
            array = narrow_source(array)  # a widened update reduces from its narrow source
            if _joins_small(array):
                small.append(jnp.ravel(array).astype(jnp.float32))
            else:
                parts.append(fn(_widened(array)))
    if small:
        parts.append(fn(concatenate(small)))
    total = _total(parts)
    return total if dtype is None else total.astype(dtype)


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
    _, paths, (xs, ys) = aligned("tree.vdot", ["a", "b"], [a, b])
    parts = []
    for p, x, y in zip(paths, xs, ys):
        if x is None or y is None:
            continue
        x, y = _pair("vdot", p, x, y)
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


def norm(tree: Any, ord: int | float | str = 2, squared: bool = False) -> jax.Array:
    """The norm of all leaves together, as if concatenated into one vector.

    Packed params count by the leaves they hold, and a complex leaf as its pair of reals
    (`|z|^2 = re^2 + im^2`), as everywhere in gradtx.

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
    if isinstance(key, str) or key not in (1, 2, math.inf):
        raise ValueError(f"tree.norm: `ord` must be 1, 2 or inf, got {ord!r}.")
    if key == 2:
        total = global_sum(tree, dtype=None)
        return total if squared else jnp.sqrt(total)
    if key == 1:
        value = global_sum(tree, lambda x: jnp.sum(jnp.abs(x)), dtype=None)
    else:
        arrays = [x for leaf in flatten(tree)[1] for x in arrays_of(leaf) if x.size]
        peaks = [jnp.max(jnp.abs(x)).astype(compute_dtype(x)) for x in arrays]
        value = _fold(jnp.maximum, [jnp.zeros((), jnp.float32), *peaks])
    return value * value if squared else value


def _extremum(fn: str, tree: Any, reduce: Callable, combine: Callable) -> jax.Array:
    parts = [reduce(jnp.asarray(x)).astype(_acc(x)) for _, x in _present(tree) if jnp.size(x)]
    if not parts:
        raise ValueError(f"tree.{fn}: the tree has no elements (only `None` or empty leaves).")
    return _fold(combine, parts)


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
    _, paths, (xs, ys) = aligned("tree.allclose", ["a", "b"], [a, b])
    result = jnp.asarray(True)
    for p, x, y in zip(paths, xs, ys):
        if x is None and y is None:
            continue
        if x is None or y is None:
            return jnp.asarray(False)
        x, y = _pair("allclose", p, x, y)
        result = result & jnp.allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan)
    return result
