"""Clipping relative to the parameters (AGC) and per-example clipping (DP-SGD)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import compute_dtype
from gradtx._core.module import hyperparam, static
from gradtx._core.protocol import Transformation
from gradtx._core.stacked import StackedTransform, as_stacked
from gradtx._layouts.complex import reject_complex
from gradtx._layouts.packed import reject_packed
from gradtx._paths.paths import flatten

__all__ = ["adaptive_grad_clip", "per_example_global_norm_clip"]


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


class PerExampleGlobalNormClip(Transformation):
    """Clip each example's gradient, sum over the batch (see `per_example_global_norm_clip`)."""

    name: ClassVar[str] = "per_example_global_norm_clip"
    l2_norm_clip: Any = hyperparam()

    def state_keys(self) -> tuple[str, ...]:
        """The statistic `num_clipped`."""
        return ("num_clipped",)

    def init(self, params: Any) -> dict:
        """The statistic `num_clipped` (int32: how many examples the last update clipped)."""
        reject_packed(params, self.name, "takes per-example gradients with a leading batch axis")
        return {"num_clipped": jnp.zeros((), jnp.int32)}

    def update(self, updates: Any, state: dict, params: Any = None, **extra: Any) -> tuple:
        """Sum over the leading batch axis of the per-example gradients, each clipped."""
        if not isinstance(state, dict) or "num_clipped" not in state:
            raise KeyError(
                f"{self.name}: expected the state made by its init, with key 'num_clipped'."
            )
        reject_packed(updates, self.name, "takes per-example gradients with a leading batch axis")
        reject_complex(updates, self.name, "needs a leading batch axis on every leaf")
        paths, leaves, treedef = flatten(updates)
        present = [(p, g) for p, g in zip(paths, leaves) if g is not None]
        batch = _batch_size(present, self.name)
        if not present:
            return updates, state
        dtype = compute_dtype(*(g for _, g in present))
        total = jnp.zeros((batch,), dtype)
        for _, g in present:
            y = g.astype(dtype)
            total = total + jnp.sum(y * y, axis=tuple(range(1, y.ndim)))
        norms = jnp.sqrt(total)
        clip = self.l2_norm_clip.astype(dtype)
        over = norms > clip
        # Each example is scaled by min(1, clip / norm); a zero-norm example keeps factor 1.
        factors = jnp.where(over, clip / jnp.where(over, norms, 1), 1)
        out = []
        for g in leaves:
            u = None if g is None else jnp.tensordot(factors, g.astype(dtype), 1).astype(g.dtype)
            out.append(u)
        return treedef.unflatten(out), {**state, "num_clipped": jnp.sum(over, dtype=jnp.int32)}


def _batch_size(present: list[tuple[str, Any]], owner: str) -> int:
    sizes = {}
    for path, g in present:
        if np.ndim(g) == 0:
            raise ValueError(
                f"{owner}: the per-example gradient at {path!r} is a scalar; every leaf needs "
                "a leading batch axis (one gradient per example)."
            )
        sizes.setdefault(int(np.shape(g)[0]), path)
    if len(sizes) > 1:
        shown = ", ".join(f"{p!r}: {n}" for n, p in sizes.items())
        raise ValueError(
            f"{owner}: the per-example gradients disagree on the batch size (leading axis) "
            f"({shown})."
        )
    return next(iter(sizes), 0)


def per_example_global_norm_clip(l2_norm_clip: float) -> PerExampleGlobalNormClip:
    r"""Clip each example's gradient to a global L2 norm, then sum them (DP-SGD's clipping).

    The update takes **per-example gradients**: every leaf has a leading batch axis of size
    $B$ (for instance from `jax.vmap(jax.grad(loss), (None, 0))(params, batch)`), and returns
    the sum over the batch, shaped like the params:

    $$u = \sum_{i=1}^{B} g_i \cdot \min\!\left(1, \frac{C}{\lVert g_i\rVert}\right)$$

    with $\lVert g_i\rVert$ the global norm of example $i$'s gradient over every leaf and $C$ =
    `l2_norm_clip` (an example with zero gradient is left as it is). This bounds each
    example's contribution, as differentially private SGD needs; add noise and divide by the
    batch size after it (optax's `dpsgd`). It is optax's `per_example_global_norm_clip`
    function as a transformation. Packed params are refused (they hold no batch axis).

    Args:
        l2_norm_clip: the largest global norm $C$ of one example's gradient.

    State:
        `num_clipped`: an int32 statistic, the number of examples the last update clipped.

    Examples:
        >>> tx = gradtx.per_example_global_norm_clip(1.25)
        >>> grads = {"w": jnp.array([[0.0, 0.0, 0.0], [0.0, 3.0, 4.0], [4.0, 0.0, 3.0]])}
        >>> u, state = tx.update(grads, tx.init({"w": jnp.zeros(3)}))
        >>> u["w"], state["num_clipped"]
        (Array([1. , 0.75, 1.75], dtype=float32), Array(2, dtype=int32))

    References:
        Abadi et al., "Deep Learning with Differential Privacy", 2016.
    """
    return PerExampleGlobalNormClip(l2_norm_clip)
