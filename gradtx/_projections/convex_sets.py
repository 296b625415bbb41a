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

import jax.numpy as jnp
from jax import lax

from gradtx._core.lift import compute_dtype
from gradtx._projections.flat_tree import FlatTree, scalar, vdot


def _clip(x: Any, low: Any, high: Any) -> Any:
    return jnp.minimum(jnp.maximum(x, low), high)


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
    return FlatTree("projection_non_negative", tree).each(
        lambda x: jnp.maximum(x, jnp.zeros((), x.dtype))
    )


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
    flat = FlatTree("projection_box", tree)
    return flat.each(_clip, flat.like("lower", lower), flat.like("upper", upper))


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
    flat = FlatTree("projection_hypercube", tree)
    return flat.each(lambda x, hi: _clip(x, jnp.zeros((), x.dtype), hi), flat.like("scale", scale))


def _radius(fn: str, tree: Any, scale: Any) -> tuple[FlatTree, Any, Any]:
    """`(tree read as one vector, the dtype of its reductions, the scalar scale in it)`."""
    flat = FlatTree(fn, tree)
    dtype = flat.dtype()
    return flat, dtype, scalar(fn, "scale", scale).astype(dtype)


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
    flat, dtype, s = _radius("projection_simplex", tree, scale)
    return flat.rebuild(_simplex(flat.arrays, s, dtype))


def _l1_sphere(flat: FlatTree, scale: Any, dtype: Any) -> list[Any]:
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
    flat, dtype, s = _radius("projection_l1_sphere", tree, scale)
    return flat.rebuild(_l1_sphere(flat, s, dtype))


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
    flat, dtype, s = _radius("projection_l1_ball", tree, scale)
    norm = sum((jnp.sum(jnp.abs(x.astype(dtype))) for x in flat.arrays), jnp.zeros((), dtype))

    def outside(arrays: list[Any]) -> list[Any]:
        return [y.astype(x.dtype) for y, x in zip(_l1_sphere(flat, s, dtype), arrays)]

    return flat.rebuild(lax.cond(norm <= s, lambda xs: list(xs), outside, flat.arrays))


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
    flat, dtype, s = _radius("projection_l2_sphere", tree, scale)
    return flat.scaled(s / jnp.sqrt(vdot(flat.arrays, flat.arrays, dtype)), dtype)


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
    flat, dtype, s = _radius("projection_l2_ball", tree, scale)
    squared = vdot(flat.arrays, flat.arrays, dtype)
    return flat.scaled(s / jnp.sqrt(jnp.maximum(squared, s * s)), dtype)


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
    flat = FlatTree(fn, tree)
    s = scalar(fn, "scale", scale)
    return flat.each(lambda x, r: _clip(x, -r, r), [s] * len(flat.arrays))


def _along(fn: str, x: Any, a: Any, factor: Callable[..., Any], keep: bool) -> Any:
    """`factor(<a, x>, <a, a>, dtype) * a`, plus `x` when `keep`; inner products over the tree."""
    flat = FlatTree(fn, x)
    directions = [jnp.broadcast_to(d, v.shape) for d, v in zip(flat.like("a", a), flat.arrays)]
    dtype = compute_dtype(*flat.arrays, *directions)
    f = factor(vdot(flat.arrays, directions, dtype), vdot(directions, directions, dtype), dtype)
    out = []
    for v, d in zip(flat.arrays, directions):
        step = f * d.astype(dtype)
        out.append(v.astype(dtype) + step if keep else step)
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
    return _along("projection_vector", x, a, lambda ax, aa, dtype: ax / aa, keep=False)


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
    offset = scalar(fn, "b", b)
    return _along(fn, x, a, lambda ax, aa, dtype: (offset.astype(dtype) - ax) / aa, keep=True)


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
    offset = scalar(fn, "b", b)

    def inward(ax: Any, aa: Any, dtype: Any) -> Any:
        return jnp.minimum((offset.astype(dtype) - ax) / aa, jnp.zeros((), dtype))

    return _along(fn, x, a, inward, keep=True)
