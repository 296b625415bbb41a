"""Optimistic gradient descent's extrapolation from the previous update."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import compute_dtype, zeros_for
from gradtx._core.module import hyperparam
from gradtx._core.per_array import PerArrayTransform
from gradtx._layouts.step_counts import next_count


class ScaleByOptimisticGradient(PerArrayTransform):
    """`u = (alpha + beta) g - beta g_prev` (see `scale_by_optimistic_gradient`)."""

    name: ClassVar[str] = "scale_by_optimistic_gradient"
    alpha: Any = hyperparam(1.0)
    beta: Any = hyperparam(1.0)

    def state_keys(self) -> tuple[str, ...]:
        """The last gradient `previous_gradient` and the path's step `count`."""
        return ("previous_gradient", "count")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A zero previous gradient (the param's dtype) and count 0."""
        return {"previous_gradient": zeros_for(param), "count": jnp.zeros((), jnp.int32)}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """The optimistic combination; at a path's first step `g_prev = g`."""
        dtype = compute_dtype(g, slots["previous_gradient"])
        grad = g.astype(dtype)
        count = next_count(slots["count"])
        prev = jnp.where(count == 1, grad, slots["previous_gradient"].astype(dtype))
        alpha, beta = self.alpha.astype(dtype), self.beta.astype(dtype)
        u = (alpha + beta) * grad - beta * prev
        return u, {"previous_gradient": grad, "count": count}


def scale_by_optimistic_gradient(
    alpha: float = 1.0, beta: float = 1.0
) -> ScaleByOptimisticGradient:
    r"""The optimistic gradient: extrapolate from the previous gradient.

    $$u_t = (\alpha + \beta)\, g_t - \beta\, g_{t-1}$$

    with $g_0 = g_1$ at a path's first step (so $u_1 = \alpha g_1$). With a learning rate this
    is optimistic gradient descent, used for min-max problems.

    Args:
        alpha: the weight of the current gradient.
        beta: the weight of the gradient's change.

    State:
        `previous_gradient/<path>` shaped like the parameter; `count/<path>` (int32).

    Examples:
        >>> tx = gradtx.scale_by_optimistic_gradient()
        >>> state = tx.init({"w": jnp.zeros(1)})
        >>> u, state = tx.update({"w": jnp.array([1.0])}, state)
        >>> u, state = tx.update({"w": jnp.array([3.0])}, state)
        >>> u["w"]
        Array([5.], dtype=float32)

    References:
        Mokhtari et al., "A Unified Analysis of Extra-gradient and Optimistic Gradient Methods
        for Saddle Point Problems: Proximal Point Approach", 2019.
    """
    return ScaleByOptimisticGradient(alpha, beta)
