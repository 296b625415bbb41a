r"""Euclidean projections of a params tree onto convex sets (`gradtx.projections`).

Each function returns $\mathrm{argmin}_{y \in C} \|x - y\|_2^2$ for one set $C$, with $x$
the whole tree read as one vector (the simplex and the balls are over all leaves together,
as in optax). Trees are matched by path (`lower`, `upper` and `a` may be other containers
with the same paths); a `None` leaf stays `None` and takes no part; packed params
(`gradtx.pack`) work on their buffers. The arithmetic runs in at least float32 and every
result is rounded once to its leaf's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from gradtx._core.lift import compute_dtype
from gradtx._layouts.packed import Packed, check_same_layout
from gradtx._paths.paths import flatten, is_unit

__all__ = [
    "projection_box",
    "projection_halfspace",
    "projection_hypercube",
    "projection_hyperplane",
    "projection_l1_ball",
    "projection_l1_sphere",
    "projection_l2_ball",
    "projection_l2_sphere",
    "projection_linf_ball",
    "projection_non_negative",
    "projection_simplex",
    "projection_vector",
]

_SHOWN = 6


class _Flat:
    """The arrays of a tree in order (a packed unit gives its buffers) and how to rebuild it."""

    def __init__(self, fn: str, tree: Any) -> None:
        self.fn = fn
        self.paths, leaves, self.treedef = flatten(tree)
        self.leaves = leaves
        self.arrays: list[jax.Array] = []
        self.where: list[str] = []  # the path of each array
        for path, leaf in zip(self.paths, leaves):
            if leaf is None:
                continue
            if is_unit(leaf):
                if not isinstance(leaf, Packed):
                    raise TypeError(f"{fn}: the leaf at {path!r} is a {type(leaf).__name__}.")
                parts = list(leaf.buffers)
            else:
                parts = [jnp.asarray(leaf)]
            for part in parts:
                if not jnp.issubdtype(part.dtype, jnp.floating):
                    raise TypeError(
                        f"{fn}: the leaf at {path!r} has dtype {part.dtype}; projections "
                        "act on real floating-point arrays."
                    )
                self.arrays.append(part)
                self.where.append(path)

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


def _scalar(fn: str, name: str, value: Any) -> jax.Array:
    array = jnp.asarray(value)
    if array.ndim:
        raise ValueError(f"{fn}: `{name}` must be a scalar, got shape {array.shape}.")
    return array


def _each(flat: _Flat, f: Callable[..., Any], *others: list[Any]) -> Any:
    """`f(x, *other values)` per array, in the array's compute dtype; the rebuilt tree."""
    out = []
    for i, x in enumerate(flat.arrays):
        dtype = compute_dtype(x)
        out.append(f(x.astype(dtype), *(jnp.asarray(o[i]).astype(dtype) for o in others)))
    return flat.rebuild(out)


def _vdot(xs: list[Any], ys: list[Any], dtype: Any) -> jax.Array:
    total = jnp.zeros((), dtype)
    for x, y in zip(xs, ys):
        total = total + jnp.sum(x.astype(dtype) * jnp.broadcast_to(y, x.shape).astype(dtype))
    return total


def _scaled(flat: _Flat, factor: Any, dtype: Any) -> Any:
    """Every array times one scalar `factor`."""
    return flat.rebuild([x.astype(dtype) * factor for x in flat.arrays])


def projection_non_negative(tree: Any) -> Any:
    r"""Projection onto the non-negative orthant: $y = \max(x, 0)$ elementwise.

    Args:
        tree: the tree to project.

    Returns:
        A tree shaped like `tree`.

    Examples:
        >>> gradtx.projections.projection_non_negative({"w": jnp.array([-1.0, 2.0])})
        {'w': Array([0., 2.], dtype=float32)}
    """
    flat = _Flat("projection_non_negative", tree)
    return _each(flat, lambda x: jnp.maximum(x, jnp.zeros((), x.dtype)))


def projection_box(tree: Any, lower: Any, upper: Any) -> Any:
    r"""Projection onto the box $\{y : l \le y \le h\}$: $y = \min(\max(x, l), h)$.

    Args:
        tree: the tree to project.
        lower: $l$, a scalar or a tree with the paths (and shapes) of `tree`.
        upper: $h$, a scalar or a tree with the paths (and shapes) of `tree`.

    Returns:
        A tree shaped like `tree`.

    Examples:
        >>> tree = {"w": jnp.array([-2.0, 0.5, 3.0])}
        >>> gradtx.projections.projection_box(tree, -1.0, {"w": jnp.array([1.0, 0.0, 2.0])})
        {'w': Array([-1.,  0.,  2.], dtype=float32)}
    """
    flat = _Flat("projection_box", tree)
    lows, highs = flat.like("lower", lower), flat.like("upper", upper)
    return _each(flat, lambda x, lo, hi: jnp.minimum(jnp.maximum(x, lo), hi), lows, highs)


def projection_hypercube(tree: Any, scale: Any = 1.0) -> Any:
    r"""Projection onto the hypercube $\{y : 0 \le y \le s\}$ (`projection_box(tree, 0, s)`).

    Args:
        tree: the tree to project.
        scale: $s$, a scalar or a tree with the paths of `tree` (default 1: the unit cube).

    Returns:
        A tree shaped like `tree`.

    Examples:
        >>> gradtx.projections.projection_hypercube({"w": jnp.array([-1.0, 0.5, 2.0])})
        {'w': Array([0. , 0.5, 1. ], dtype=float32)}
    """
    flat = _Flat("projection_hypercube", tree)
    highs = flat.like("scale", scale)
    return _each(flat, lambda x, hi: jnp.minimum(jnp.maximum(x, jnp.zeros((), x.dtype)), hi), highs)


def _simplex(values: list[Any], scale: Any, dtype: Any) -> list[Any]:
    r"""The projection of the concatenated `values` onto $\{y \ge 0, \sum y = s\}$.

    Sort-based (Duchi et al., 2008): with $u$ sorted in decreasing order and
    $\rho = \max\{j : u_j - (\sum_{i \le j} u_i - s)/j > 0\}$, the threshold is
    $\tau = (\sum_{i \le \rho} u_i - s)/\rho$ and $y = \max(x - \tau, 0)$.
    """
    if not values or sum(v.size for v in values) == 0:
        return list(values)
    s = scale.astype(dtype)
    v = jnp.concatenate([x.astype(dtype).reshape(-1) for x in values])
    u = jnp.flip(jnp.sort(v))
    css = jnp.cumsum(u)
    index = jnp.arange(1, v.size + 1, dtype=dtype)
    rho = jnp.sum(u - (css - s) / index > 0, dtype=jnp.int32)
    rho = jnp.maximum(rho, 1)
    tau = (css[rho - 1] - s) / rho.astype(dtype)
    zero = jnp.zeros((), dtype)
    return [jnp.maximum(x.astype(dtype) - tau, zero) for x in values]


def projection_simplex(tree: Any, scale: Any = 1.0) -> Any:
    r"""Projection onto the simplex $\{y : y \ge 0, \sum_i y_i = s\}$, over the whole tree.

    Every element of every leaf is one coordinate of $x$. The projection is
    $y = \max(x - \tau, 0)$ with the threshold $\tau$ found by sorting $x$ (Duchi et al.,
    2008), $O(n \log n)$ for $n$ elements. With `scale = 1`, the probability simplex.

    Args:
        tree: the tree to project.
        scale: $s > 0$, the sum of the result (a scalar).

    Returns:
        A tree shaped like `tree`, its elements non-negative and summing to $s$.

    Examples:
        >>> tree = {"w": jnp.array([2.5, 3.0]), "b": jnp.array(0.5)}
        >>> gradtx.projections.projection_simplex(tree)
        {'b': Array(0., dtype=float32), 'w': Array([0.25, 0.75], dtype=float32)}

    References:
        Duchi, Shalev-Shwartz, Singer and Chandra, *Efficient projections onto the l1-ball
        for learning in high dimensions*, ICML 2008.
    """
    fn = "projection_simplex"
    flat = _Flat(fn, tree)
    dtype = flat.dtype()
    return flat.rebuild(_simplex(flat.arrays, _scalar(fn, "scale", scale), dtype))


def _l1_sphere(flat: _Flat, scale: Any, dtype: Any) -> list[Any]:
    magnitudes = _simplex([jnp.abs(x.astype(dtype)) for x in flat.arrays], scale, dtype)
    return [jnp.sign(x.astype(dtype)) * m for x, m in zip(flat.arrays, magnitudes)]


def projection_l1_sphere(tree: Any, scale: Any = 1.0) -> Any:
    r"""Projection onto the l1 sphere $\{y : \|y\|_1 = s\}$, over the whole tree.

    $y = \mathrm{sign}(x) \odot P_\Delta(|x|)$, with $P_\Delta$ the projection onto the
    simplex of sum $s$ (`projection_simplex`).

    Args:
        tree: the tree to project.
        scale: $s > 0$, the radius (a scalar).

    Returns:
        A tree shaped like `tree`.

    Examples:
        >>> gradtx.projections.projection_l1_sphere({"w": jnp.array([0.2, -0.2])})
        {'w': Array([ 0.5, -0.5], dtype=float32)}
    """
    fn = "projection_l1_sphere"
    flat = _Flat(fn, tree)
    return flat.rebuild(_l1_sphere(flat, _scalar(fn, "scale", scale), flat.dtype()))


def projection_l1_ball(tree: Any, scale: Any = 1.0) -> Any:
    r"""Projection onto the l1 ball $\{y : \|y\|_1 \le s\}$, over the whole tree.

    $x$ itself when $\|x\|_1 \le s$, else its projection onto the l1 sphere (the branch is
    chosen with `jax.lax.cond`, so the sort runs only when needed).

    Args:
        tree: the tree to project.
        scale: $s > 0$, the radius (a scalar).

    Returns:
        A tree shaped like `tree`.

    Examples:
        >>> tree = {"w": jnp.array([2.5, 3.0]), "b": jnp.array(0.5)}
        >>> gradtx.projections.projection_l1_ball(tree)
        {'b': Array(0., dtype=float32), 'w': Array([0.25, 0.75], dtype=float32)}

    References:
        Duchi, Shalev-Shwartz, Singer and Chandra, *Efficient projections onto the l1-ball
        for learning in high dimensions*, ICML 2008.
    """
    fn = "projection_l1_ball"
    flat = _Flat(fn, tree)
    dtype = flat.dtype()
    s = _scalar(fn, "scale", scale).astype(dtype)
    norm = jnp.zeros((), dtype)
    for x in flat.arrays:
        norm = norm + jnp.sum(jnp.abs(x.astype(dtype)))

    def outside(arrays: list[Any]) -> list[Any]:
        return [y.astype(x.dtype) for y, x in zip(_l1_sphere(flat, s, dtype), arrays)]

    return flat.rebuild(lax.cond(norm <= s, lambda xs: list(xs), outside, flat.arrays))


def _l2_norm(flat: _Flat, dtype: Any) -> jax.Array:
    return jnp.sqrt(_vdot(flat.arrays, flat.arrays, dtype))


def projection_l2_sphere(tree: Any, scale: Any = 1.0) -> Any:
    r"""Projection onto the l2 sphere $\{y : \|y\|_2 = s\}$: $y = s\,x / \|x\|_2$.

    The norm is that of the whole tree. At $x = 0$ every point of the sphere is as near, and
    the result is NaN.

    Args:
        tree: the tree to project.
        scale: $s > 0$, the radius (a scalar).

    Returns:
        A tree shaped like `tree`.

    Examples:
        >>> gradtx.projections.projection_l2_sphere({"w": jnp.array([3.0]), "b": jnp.array(4.0)})
        {'b': Array(0.8, dtype=float32), 'w': Array([0.6], dtype=float32)}
    """
    fn = "projection_l2_sphere"
    flat = _Flat(fn, tree)
    dtype = flat.dtype()
    s = _scalar(fn, "scale", scale).astype(dtype)
    return _scaled(flat, s / _l2_norm(flat, dtype), dtype)


def projection_l2_ball(tree: Any, scale: Any = 1.0) -> Any:
    r"""Projection onto the l2 ball $\{y : \|y\|_2 \le s\}$: $y = x \cdot s / \max(\|x\|_2, s)$.

    Args:
        tree: the tree to project.
        scale: $s > 0$, the radius (a scalar).

    Returns:
        A tree shaped like `tree`.

    Examples:
        >>> gradtx.projections.projection_l2_ball({"w": jnp.array([3.0, 4.0])}, scale=2.5)
        {'w': Array([1.5, 2. ], dtype=float32)}
    """
    fn = "projection_l2_ball"
    flat = _Flat(fn, tree)
    dtype = flat.dtype()
    s = _scalar(fn, "scale", scale).astype(dtype)
    squared = _vdot(flat.arrays, flat.arrays, dtype)
    return _scaled(flat, s / jnp.sqrt(jnp.maximum(squared, s * s)), dtype)


def projection_linf_ball(tree: Any, scale: Any = 1.0) -> Any:
    r"""Projection onto the l-infinity ball $\{y : \|y\|_\infty \le s\}$, elementwise.

    $y = \min(\max(x, -s), s)$.

    Args:
        tree: the tree to project.
        scale: $s \ge 0$, the radius (a scalar).

    Returns:
        A tree shaped like `tree`.

    Examples:
        >>> gradtx.projections.projection_linf_ball({"w": jnp.array([-3.0, 0.5, 2.0])})
        {'w': Array([-1. ,  0.5,  1. ], dtype=float32)}
    """
    fn = "projection_linf_ball"
    flat = _Flat(fn, tree)
    s = _scalar(fn, "scale", scale)
    return _each(flat, lambda x, r: jnp.minimum(jnp.maximum(x, -r), r), [s] * len(flat.arrays))


def _direction(fn: str, x: Any, a: Any) -> tuple[_Flat, list[Any], Any, jax.Array, jax.Array]:
    """`(flat x, a's arrays broadcast to x's, dtype, <a, x>, <a, a>)`."""
    flat = _Flat(fn, x)
    directions = [jnp.broadcast_to(d, v.shape) for d, v in zip(flat.like("a", a), flat.arrays)]
    dtype = compute_dtype(*flat.arrays, *directions)
    ax = _vdot(flat.arrays, directions, dtype)
    return flat, directions, dtype, ax, _vdot(directions, directions, dtype)


def _along(flat: _Flat, directions: list[Any], dtype: Any, factor: Any, keep: bool) -> Any:
    """`factor * a`, plus `x` when `keep`, array by array."""
    out = []
    for x, d in zip(flat.arrays, directions):
        step = factor * d.astype(dtype)
        out.append(x.astype(dtype) + step if keep else step)
    return flat.rebuild(out)


def projection_vector(x: Any, a: Any) -> Any:
    r"""Projection onto the line spanned by `a`.

    $y = (\langle x, a \rangle / \langle a, a \rangle)\,a$, with the inner products over the
    whole tree.

    Args:
        x: the tree to project.
        a: the direction, a tree with the paths and shapes of `x`.

    Returns:
        A tree shaped like `x`.

    Examples:
        >>> x, a = {"w": jnp.array([2.0, 1.0])}, {"w": jnp.array([1.0, 0.0])}
        >>> gradtx.projections.projection_vector(x, a)
        {'w': Array([2., 0.], dtype=float32)}
    """
    flat, directions, dtype, ax, aa = _direction("projection_vector", x, a)
    return _along(flat, directions, dtype, ax / aa, keep=False)


def projection_hyperplane(x: Any, a: Any, b: Any) -> Any:
    r"""Projection onto the hyperplane $\{y : \langle a, y \rangle = b\}$.

    $y = x + \frac{b - \langle a, x \rangle}{\langle a, a \rangle} a$, with the inner products
    over the whole tree.

    Args:
        x: the tree to project.
        a: the normal of the hyperplane, a tree with the paths and shapes of `x`.
        b: the offset (a scalar).

    Returns:
        A tree shaped like `x`.

    Examples:
        >>> x, a = {"w": jnp.array([1.0, 1.0])}, {"w": jnp.array([1.0, 1.0])}
        >>> gradtx.projections.projection_hyperplane(x, a, 4.0)
        {'w': Array([2., 2.], dtype=float32)}
    """
    fn = "projection_hyperplane"
    offset = _scalar(fn, "b", b)
    flat, directions, dtype, ax, aa = _direction(fn, x, a)
    return _along(flat, directions, dtype, (offset.astype(dtype) - ax) / aa, keep=True)


def projection_halfspace(x: Any, a: Any, b: Any) -> Any:
    r"""Projection onto the halfspace $\{y : \langle a, y \rangle \le b\}$.

    $y = x + \min\!\big(0, \frac{b - \langle a, x \rangle}{\langle a, a \rangle}\big) a$: $x$
    itself when it is inside.

    Args:
        x: the tree to project.
        a: the normal of the halfspace, a tree with the paths and shapes of `x`.
        b: the offset (a scalar).

    Returns:
        A tree shaped like `x`.

    Examples:
        >>> a = {"w": jnp.array([1.0, 1.0])}
        >>> gradtx.projections.projection_halfspace({"w": jnp.array([3.0, 1.0])}, a, 2.0)
        {'w': Array([2., 0.], dtype=float32)}
        >>> gradtx.projections.projection_halfspace({"w": jnp.array([0.5, 1.0])}, a, 2.0)
        {'w': Array([0.5, 1. ], dtype=float32)}
    """
    fn = "projection_halfspace"
    offset = _scalar(fn, "b", b)
    flat, directions, dtype, ax, aa = _direction(fn, x, a)
    step = jnp.minimum((offset.astype(dtype) - ax) / aa, jnp.zeros((), dtype))
    return _along(flat, directions, dtype, step, keep=True)
