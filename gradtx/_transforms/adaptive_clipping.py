"""Adaptive gradient clipping (AGC): each unit's update clipped relative to its parameter's norm."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import compute_dtype
from gradtx._core.module import hyperparam, non_negative, positive, static
from gradtx._core.stacked import StackedTransform, as_stacked


def _as_axis(axis: Any, name: str = "axis") -> tuple[int, ...] | None:
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if not all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in axes):
        raise TypeError(f"`{name}` must be an int, a tuple of ints or None, got {axis!r}")
    return tuple(int(a) for a in axes)


def unit_axes(
    shape: tuple[int, ...], axis: tuple[int, ...] | None, owner: str = "adaptive_grad_clip"
) -> tuple[int, ...]:
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
        f"{owner}: no default unit for an array of shape {shape} (rank "
        f"{len(shape)}); pass `axis=` to say which axes one unit spans."
    )


def unit_norms(x: Any, axes: tuple[int, ...], dtype: Any) -> Any:
    """Each unit's L2 norm in `dtype`, with `x`'s rank (the summed axes kept, of size 1)."""
    y = x.astype(dtype)
    return jnp.sqrt(jnp.sum(y * y, axis=axes, keepdims=True))


def clip_units(g_norm: Any, max_norm: Any, grad: Any, div_eps: Any) -> Any:
    """`grad` where `g_norm < max_norm`, else `grad * max_norm / max(g_norm, div_eps)`.

    The norms and `div_eps` share one real dtype and broadcast against `grad`; the factor is
    cast to `grad`'s dtype. `div_eps` only guards the division: the rescaled branch is taken
    only where `g_norm >= max_norm`.
    """
    factor = max_norm / jnp.maximum(g_norm, div_eps)
    return jnp.where(g_norm < max_norm, grad, grad * factor.astype(grad.dtype))


class AdaptiveGradClip(StackedTransform):
    """Unit-wise clipping of `g` to `clipping * max(||param||, eps)` (see `adaptive_grad_clip`)."""

    name: ClassVar[str] = "adaptive_grad_clip"
    needs_params: ClassVar[bool] = True
    clipping: Any = hyperparam(check=positive)
    eps: Any = hyperparam(1e-3, check=non_negative)
    axis: Any = static(None, converter=_as_axis)
    stacked: Any = static((), converter=as_stacked)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Rescale each unit whose gradient norm exceeds `clipping` times its param norm."""
        dtype = compute_dtype(g, param)
        axes = unit_axes(tuple(g.shape), self.axis)
        g_norm = unit_norms(g, axes, dtype)
        p_norm = unit_norms(param, axes, dtype)
        max_norm = self.clipping.astype(dtype) * jnp.maximum(p_norm, self.eps.astype(dtype))
        u = clip_units(g_norm, max_norm, g.astype(dtype), jnp.asarray(1e-6, dtype))
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


def unitwise_norm(x: Any, axis: int | tuple[int, ...] | None = None) -> jax.Array:
    r"""The L2 norm of each unit of `x`, broadcast back to `x`'s shape.

    A unit is a slice of `x` over the axes `axis`; by default, as for `adaptive_grad_clip`
    (and optax): the whole array for a vector or a scalar (once size-1 axes are dropped),
    axis 0 for rank 2 and 3 (a linear kernel `(in, out)`, or a multi-head one), axes
    `(0, 1, 2)` for rank 4 (a convolution kernel `HWIO`) and `(0, 1, 2, 3)` for rank 5.
    Other ranks need `axis`. A complex element counts as $|z|^2 = \mathrm{re}^2 +
    \mathrm{im}^2$.

    Args:
        x: an array.
        axis: the axes one unit spans (an int or a tuple of ints), or `None` for the rules
            above.

    Returns:
        An array shaped like `x`: each element is the norm of its unit, in at least float32.

    Examples:
        >>> gradtx.unitwise_norm(jnp.array([[3.0, 1.0], [4.0, 0.0]]))  # one unit per column
        Array([[5., 1.],
               [5., 1.]], dtype=float32)
        >>> gradtx.unitwise_norm(jnp.array([[3.0, 4.0], [0.0, 1.0]]), axis=1)
        Array([[5., 5.],
               [1., 1.]], dtype=float32)

    References:
        Brock et al., "High-Performance Large-Scale Image Recognition Without Normalization",
        2021.
    """
    x = jnp.asarray(x)
    axes = unit_axes(tuple(x.shape), _as_axis(axis), owner="unitwise_norm")
    real = jnp.abs(x) if jnp.iscomplexobj(x) else x
    return jnp.broadcast_to(unit_norms(real, axes, compute_dtype(real)), x.shape)


def unitwise_clip(g_norm: Any, max_norm: Any, grad: Any, div_eps: float = 1e-6) -> jax.Array:
    r"""Rescale each unit of `grad` whose norm reaches `max_norm` down to `max_norm`.

    Element by element, with the units' norms broadcast against `grad` (as `unitwise_norm`
    gives them):

    $$u = \begin{cases} g & \lVert g\rVert < M \\
      g\, M / \max(\lVert g\rVert, \delta) & \text{otherwise}\end{cases}$$

    with $M$ = `max_norm` and $\delta$ = `div_eps`, which only guards the division. This is
    the last step of adaptive gradient clipping (`adaptive_grad_clip`, which takes $M =
    \lambda \max(\lVert\theta\rVert, \epsilon)$ from the parameter's units).

    Args:
        g_norm: the units' gradient norms, shaped like `grad` (or with its rank and size-1
            axes where a unit is summed, as `keepdims` gives).
        max_norm: the largest norm each unit may keep, shaped like `g_norm`'s rule.
        grad: the gradient.
        div_eps: the smallest divisor used for the rescaling.

    Returns:
        The clipped gradient, in `grad`'s dtype.

    Examples:
        >>> g = jnp.array([[3.0, 0.1], [4.0, 0.0]])
        >>> gradtx.unitwise_clip(gradtx.unitwise_norm(g), jnp.full((2, 2), 1.0), g)
        Array([[0.6, 0.1],
               [0.8, 0. ]], dtype=float32)

    References:
        Brock et al., "High-Performance Large-Scale Image Recognition Without Normalization",
        2021.
    """
    grad = jnp.asarray(grad)
    g_norm, max_norm = jnp.asarray(g_norm), jnp.asarray(max_norm)
    for name, value in (("g_norm", g_norm), ("max_norm", max_norm)):
        # `grad`'s rank, each dim `grad`'s or 1.
        if value.ndim != grad.ndim or any(a not in (1, b) for a, b in zip(value.shape, grad.shape)):
            raise ValueError(
                f"unitwise_clip: `{name}` has shape {value.shape}, which does not match `grad`'s "
                f"shape {grad.shape}: pass one norm per element (as `unitwise_norm` gives) or "
                "keep `grad`'s rank with size-1 axes where a unit is summed."
            )
        if jnp.iscomplexobj(value):
            raise TypeError(f"unitwise_clip: `{name}` must be real, got dtype {value.dtype}.")
    dtype = compute_dtype(g_norm, max_norm)
    norms = g_norm.astype(dtype), max_norm.astype(dtype)
    clipped = clip_units(*norms, grad.astype(compute_dtype(grad)), jnp.asarray(div_eps, dtype))
    return clipped.astype(grad.dtype)
