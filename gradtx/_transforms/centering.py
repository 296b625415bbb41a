"""Gradient centralisation: each update minus its mean over all but the last axis."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import compute_dtype
from gradtx._core.per_array import PerArrayTransform


class Centralize(PerArrayTransform):
    """Subtract the mean over all axes but the first (see `centralize`)."""

    name: ClassVar[str] = "centralize"
    per_leaf_structure: ClassVar[bool] = True

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = g - mean(g, axes 1..)` for arrays of rank 2 or more; else `u = g`."""
        if g.ndim < 2:
            return g, {}
        x = g.astype(compute_dtype(g))
        u = x - jnp.mean(x, axis=tuple(range(1, g.ndim)), keepdims=True)
        return u.astype(g.dtype), {}


def centralize() -> Centralize:
    r"""Gradient centralization: subtract from each array its mean over all axes but the first.

    For an array of rank $\ge 2$, $u_{i\ldots} = g_{i\ldots} - \operatorname{mean}_{\ldots}
    g_{i\ldots}$ (one mean per index of the first axis); vectors and scalars pass unchanged.
    The math needs the whole array, not one element at a time.

    Examples:
        >>> tx = gradtx.centralize()
        >>> g = {"w": jnp.array([[1.0, 3.0], [0.0, 4.0]]), "b": jnp.array([1.0, 3.0])}
        >>> u, _ = tx.update(g, tx.init(g))
        >>> u["w"], u["b"]
        (Array([[-1.,  1.], [-2.,  2.]], dtype=float32), Array([1., 3.], dtype=float32))

    References:
        Yong et al., "Gradient Centralization: A New Optimization Technique for Deep Neural
        Networks", 2020.
    """
    return Centralize()
