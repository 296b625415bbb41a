"""Block scales: scale updates by their parameter's RMS or norm, or clip each update's RMS."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import compute_dtype
from gradtx._core.module import hyperparam, static
from gradtx._core.stacked import StackedTransform, as_stacked
from gradtx._tree.reductions import sum_of_squares


def block_rms(x: Any, dtype: Any) -> Any:
    """`sqrt(mean(x^2))` over the whole array, in `dtype` (NaN for an empty array)."""
    return jnp.sqrt(sum_of_squares(x).astype(dtype) / jnp.asarray(x.size, dtype))


def block_norm(x: Any, dtype: Any) -> Any:
    """`sqrt(sum(x^2))` over the whole array, in `dtype` (0 for an empty array)."""
    return jnp.sqrt(sum_of_squares(x).astype(dtype))


class _ScaleByParamBlock(StackedTransform):
    """`u = g * max(size(param), min_scale)` per leaf, `size` the subclass's `statistic`."""

    needs_params: ClassVar[bool] = True
    statistic: ClassVar[Callable[[Any, Any], Any]]
    min_scale: Any = hyperparam(1e-3)
    stacked: Any = static((), converter=as_stacked)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Multiply the update by its parameter's statistic, at least `min_scale`."""
        dtype = compute_dtype(g, param)
        factor = jnp.maximum(type(self).statistic(param, dtype), self.min_scale.astype(dtype))
        return (g.astype(dtype) * factor).astype(g.dtype), {}


class ScaleByParamBlockRms(_ScaleByParamBlock):
    """`u = g * max(rms(param), min_scale)` per leaf (see `scale_by_param_block_rms`)."""

    name: ClassVar[str] = "scale_by_param_block_rms"
    statistic: ClassVar[Callable[[Any, Any], Any]] = staticmethod(block_rms)


class ScaleByParamBlockNorm(_ScaleByParamBlock):
    """`u = g * max(||param||, min_scale)` per leaf (see `scale_by_param_block_norm`)."""

    name: ClassVar[str] = "scale_by_param_block_norm"
    statistic: ClassVar[Callable[[Any, Any], Any]] = staticmethod(block_norm)


class ClipByBlockRms(StackedTransform):
    """`u = g * min(1, threshold / rms(g))` per leaf (see `clip_by_block_rms`)."""

    name: ClassVar[str] = "clip_by_block_rms"
    threshold: Any = hyperparam()
    stacked: Any = static((), converter=as_stacked)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Rescale the array so its RMS is at most `threshold`."""
        dtype = compute_dtype(g)
        rms = block_rms(g, dtype)
        threshold = self.threshold.astype(dtype)
        over = rms > threshold
        factor = jnp.where(over, threshold / jnp.where(over, rms, 1), 1)
        return (g.astype(dtype) * factor).astype(g.dtype), {}


def scale_by_param_block_rms(
    min_scale: float = 1e-3, *, stacked: Any = None
) -> ScaleByParamBlockRms:
    r"""Scale each array's update by the root mean square of its parameter.

    Per leaf ("block": a weight vector or matrix), $u = g\cdot\max(\mathrm{rms}(\theta),
    s_{min})$ with $\mathrm{rms}(\theta) = \sqrt{\operatorname{mean}\theta^2}$, so steps are
    relative to the parameter's scale (Adafactor's `multiply_by_parameter_scale`).

    Args:
        min_scale: the smallest factor $s_{min}$ (a zero-initialised parameter still moves).
        stacked: `{selector: n}`: selected leaves are stacks of independent arrays along their
            first `n` axes, each scaled by its own RMS, exactly as separate leaves.

    State:
        None (`{}`); the update needs the params.

    Examples:
        >>> tx = gradtx.scale_by_param_block_rms()
        >>> params = {"w": jnp.array([3.0, -3.0]), "b": jnp.zeros(2)}
        >>> u, _ = tx.update({"w": jnp.ones(2), "b": jnp.ones(2)}, {}, params)
        >>> u["w"], u["b"]
        (Array([3., 3.], dtype=float32), Array([0.001, 0.001], dtype=float32))

    References:
        Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018.
    """
    return ScaleByParamBlockRms(min_scale, stacked)


def scale_by_param_block_norm(
    min_scale: float = 1e-3, *, stacked: Any = None
) -> ScaleByParamBlockNorm:
    r"""Scale each array's update by the L2 norm of its parameter.

    Per leaf ("block": a weight vector or matrix), $u = g\cdot\max(\lVert\theta\rVert_2,
    s_{min})$, so a block's step is relative to the size of its weights. It is
    `scale_by_param_block_rms` with the norm in place of the root mean square: the two
    differ by $\sqrt{n}$ for a block of $n$ elements, so the norm also grows the steps of
    larger blocks.

    Args:
        min_scale: the smallest factor $s_{min}$ (a zero-initialised parameter still moves).
        stacked: `{selector: n}`: selected leaves are stacks of independent arrays along their
            first `n` axes, each scaled by its own norm, exactly as separate leaves.

    State:
        None (`{}`); the update needs the params.

    Examples:
        >>> tx = gradtx.scale_by_param_block_norm()
        >>> params = {"w": jnp.array([3.0, -4.0]), "b": jnp.zeros(2)}
        >>> u, _ = tx.update({"w": jnp.ones(2), "b": jnp.ones(2)}, {}, params)
        >>> u["w"], u["b"]
        (Array([5., 5.], dtype=float32), Array([0.001, 0.001], dtype=float32))
    """
    return ScaleByParamBlockNorm(min_scale, stacked)


def clip_by_block_rms(threshold: float, *, stacked: Any = None) -> ClipByBlockRms:
    r"""Clip each array's update so its root mean square is at most `threshold`.

    Per leaf, $u = g\cdot\min\!\left(1, \tau / \mathrm{rms}(g)\right)$ with
    $\mathrm{rms}(g) = \sqrt{\operatorname{mean} g^2}$ and $\tau$ the threshold (Adafactor's
    update clipping). A zero update stays zero, even with $\tau = 0$.

    Args:
        threshold: the largest RMS $\tau$ an array's update may have.
        stacked: `{selector: n}`: selected leaves are stacks of independent arrays along their
            first `n` axes, each clipped by its own RMS, exactly as separate leaves.

    State:
        None (`{}`).

    Examples:
        >>> tx = gradtx.clip_by_block_rms(1.0)
        >>> u, _ = tx.update({"w": jnp.array([3.0, -3.0]), "b": jnp.array([0.5, 0.0])}, {})
        >>> u["w"], u["b"]
        (Array([ 1., -1.], dtype=float32), Array([0.5, 0. ], dtype=float32))

    References:
        Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018.
    """
    return ClipByBlockRms(threshold, stacked)
