"""Adaptive gradient clipping (AGC): each unit's update clipped relative to its parameter's norm."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import compute_dtype
from gradtx._core.module import hyperparam, static
from gradtx._core.stacked import StackedTransform, as_stacked

__all__ = ["adaptive_grad_clip"]


def _as_axis(axis: Any, name: str = "axis") -> tuple[int, ...] | None:
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if not all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in axes):
        raise TypeError(f"`{name}` must be an int, a tuple of ints or None, got {axis!r}")
    return tuple(int(a) for a in axes)


def unit_axes(shape: tuple[int, ...], axis: tuple[int, ...] | None) -> tuple[int, ...]:
    """The axes summed over for one unit's norm: a unit is one output of the layer.

    Vectors and scalars (after dropping size-1 axes) are one unit; rank 2 and 3 (a linear
    kernel `(in, out)` or a multi-head one) sum over axis 0; rank 4 (a conv kernel
    `HWIO`) over `(0, 1, 2)`; rank 5 (`DHWIO`) over `(0, 1, 2, 3)`.
    """
    if axis is not None:
        return axis
    if sum(d != 1 for d in shape) <= 1:
        return tuple(range(len(shape)))
    if len(shape) in (2, 3):
        return (0,)
    if len(shape) in (4, 5):
        return tuple(range(len(shape) - 1))
    raise ValueError(
        f"adaptive_grad_clip: no default unit for an array of shape {shape} (rank "
        f"{len(shape)}); pass `axis=` to say which axes one unit spans."
    )


def unitwise_norm(x: Any, axes: tuple[int, ...], dtype: Any) -> Any:
    """Each unit's L2 norm, broadcast back to `x`'s shape."""
    y = x.astype(dtype)
    return jnp.sqrt(jnp.sum(y * y, axis=axes, keepdims=True))


class AdaptiveGradClip(StackedTransform):
    """Unit-wise clipping of `g` to `clipping * max(||param||, eps)` (see `adaptive_grad_clip`)."""

    name: ClassVar[str] = "adaptive_grad_clip"
    needs_params: ClassVar[bool] = True
    clipping: Any = hyperparam()
    eps: Any = hyperparam(1e-3)
    axis: Any = static(None, converter=_as_axis)
    stacked: Any = static((), converter=as_stacked)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Rescale each unit whose gradient norm exceeds `clipping` times its param norm."""
        dtype = compute_dtype(g, param)
        axes = unit_axes(tuple(g.shape), self.axis)
        g_norm = unitwise_norm(g, axes, dtype)
        p_norm = unitwise_norm(param, axes, dtype)
        max_norm = self.clipping.astype(dtype) * jnp.maximum(p_norm, self.eps.astype(dtype))
        # The floor 1e-6 only guards the division; the branch is taken only if g_norm > max_norm.
        clipped = g.astype(dtype) * (max_norm / jnp.maximum(g_norm, jnp.asarray(1e-6, dtype)))
        u = jnp.where(g_norm < max_norm, g.astype(dtype), clipped)
        return u.astype(g.dtype), {}


def adaptive_grad_clip(
    clipping: float, eps: float = 1e-3, *, axis: Any = None, stacked: Any = None
) -> AdaptiveGradClip:
    r"""Adaptive gradient clipping (AGC): clip each unit's gradient relative to its weights.

    For each unit $i$ (one output of a layer: a column of a `(in, out)` kernel), with
    $\lambda$ = `clipping`:

    $$u_i = \begin{cases} g_i & \lVert g_i\rVert < \lambda \max(\lVert\theta_i\rVert, \epsilon)
      \\ \lambda \max(\lVert\theta_i\rVert, \epsilon)\, g_i / \lVert g_i\rVert &
      \text{otherwise}\end{cases}$$

    Units, as in optax: an array that is a vector or scalar once size-1 axes are dropped is one
    unit; rank 2 and 3 arrays sum over axis 0; rank 4 over axes `(0, 1, 2)`; rank 5 over
    `(0, 1, 2, 3)`; other ranks need `axis`.

    Args:
        clipping: the largest ratio $\lambda$ of a unit's gradient norm to its weight norm.
        eps: the smallest weight norm used, so zero-initialised units still move.
        axis: the axes one unit spans, overriding the rules above (for the per-leaf shape,
            the stack axes excluded).
        stacked: `{selector: n}`: selected leaves are stacks of independent arrays along their
            first `n` axes, each clipped by its own units, exactly as separate leaves.

    State:
        None (`{}`); the update needs the params.

    Examples:
        >>> tx = gradtx.adaptive_grad_clip(0.1)
        >>> params = {"w": jnp.array([[3.0, 1.0], [4.0, 0.0]])}
        >>> u, _ = tx.update({"w": jnp.array([[0.0, 1.0], [1.0, 0.0]])}, {}, params)
        >>> u["w"]  # column norms: params (5, 1), grads (1, 1); limits (0.5, 0.1)
        Array([[0. , 0.1], [0.5, 0. ]], dtype=float32)

    References:
        Brock et al., "High-Performance Large-Scale Image Recognition Without Normalization",
        2021.
    """
    return AdaptiveGradClip(clipping, eps, axis, stacked)
