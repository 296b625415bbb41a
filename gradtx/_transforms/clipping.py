"""Clipping updates elementwise or by their global norm."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np
from jax import lax

from gradtx._core.elementwise import ElementwiseTransform
from gradtx._core.lift import cast, compute_dtype, map_updates, split_explicitly
from gradtx._core.module import hyperparam, positive, static
from gradtx._core.statistics import KeepsStatistics, statistics
from gradtx._core.widening import narrow_source
from gradtx._layouts.complex import is_complex, to_real
from gradtx._layouts.packed import LARGE_LEAF, concatenate
from gradtx._paths.paths import flatten, is_unit

__all__ = ["clip", "clip_by_global_norm", "global_norm", "global_sum_of_squares"]


def global_norm(updates: Any) -> jnp.ndarray:
    """The L2 norm of all leaves of `updates` together, in float32 (`None` leaves skipped).

    Examples:
        >>> global_norm({"a": jnp.array([3.0]), "b": jnp.array([4.0]), "c": None})
        Array(5., dtype=float32)
    """
    return jnp.sqrt(global_sum_of_squares(updates))


def global_sum_of_squares(updates: Any) -> jnp.ndarray:
    """The sum of squares of all leaves (packed buffers included), in float32.

    A complex leaf counts as its pair of reals: `|z|^2 = re^2 + im^2`.
    """
    total = jnp.zeros((), jnp.float32)
    small = []
    for leaf in flatten(updates)[1]:
        for array in leaf.buffers if is_unit(leaf) else (leaf,):
            if array is None:
                continue
            array = narrow_source(array)
            if _joins_small(array):
                small.append(jnp.ravel(array).astype(jnp.float32))
            else:
                total = total + _sum_of_squares(array).astype(total.dtype)
    if small:
        # One reduction over the small leaves side by side rather than one per leaf, which
        # compiles far faster (benchmarks/compile_time.py): each reduction is a kernel and an
        # output of its own; the copy is small.
        joined = concatenate(small)
        total = total + jnp.sum(joined * joined)
    return total


def _joins_small(x: Any) -> bool:
    """Whether `x` joins the shared reduction of small leaves.

    That is a real float of at most 32 bits with fewer than `LARGE_LEAF` elements, not split
    over devices by an explicit sharding (which a flattening reshape may not cross).
    """
    dtype = getattr(x, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating) or dtype.itemsize > 4:
        return False
    if np.size(x) >= LARGE_LEAF:
        return False
    return not split_explicitly(x)


def _sum_of_squares(x: Any) -> jnp.ndarray:
    if is_complex(x):  # |z|^2 = re^2 + im^2: complex as pairs of reals
        x = to_real(x)
    dtype = compute_dtype(x)
    if x.dtype != dtype and jnp.issubdtype(x.dtype, jnp.floating):
        # XLA's CPU backend hands this reduction to a library kernel that cannot fuse a
        # conversion other consumers share (see gradtx/_core/widening.py); behind the barrier the
        # conversion is the reduction's own, which makes it much faster (benchmarks/moments.py).
        x = lax.optimization_barrier(x)
    y = x.astype(dtype)
    return jnp.sum(y * y)


class Clip(ElementwiseTransform):
    """Clip each element to `[-max_delta, max_delta]` (see `clip`)."""

    name: ClassVar[str] = "clip"
    max_delta: Any = hyperparam(check=positive)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = clip(g, -max_delta, max_delta)`."""
        limit = cast(self.max_delta, compute_dtype(g))
        return cast(jnp.clip(cast(g, limit.dtype), -limit, limit), g.dtype), {}


class ClipByGlobalNorm(ElementwiseTransform, KeepsStatistics):
    """Rescale all updates together so their global norm is at most `max_norm`."""

    name: ClassVar[str] = "clip_by_global_norm"
    max_norm: Any = hyperparam(check=positive)
    keep_statistics: bool = static(True)

    def state_keys(self) -> tuple[str, ...]:
        """The statistics `global_norm` and `clipped` (none without statistics)."""
        return ("global_norm", "clipped") if self.keep_statistics else ()

    def init(self, params: Any) -> dict:
        """The last updates' norm before clipping, and whether that step clipped them."""
        if not self.keep_statistics:
            return {}
        return statistics(global_norm=jnp.zeros((), jnp.float32), clipped=jnp.zeros((), bool))

    def update(self, updates: Any, state: dict, params: Any = None, **extra: Any) -> tuple:
        """Scale every present update by `min(1, max_norm / global_norm)`."""
        self.check_state(state)
        norm = global_norm(updates)
        # One scalar factor, computed once: the per-leaf work stays a single multiply.
        factor = jnp.where(norm < self.max_norm, jnp.float32(1), self.max_norm / norm)

        def clipped(g: Any, _: Any) -> Any:
            return cast(cast(g, compute_dtype(g)) * factor, g.dtype)

        new_updates = map_updates(clipped, updates, owner=self.name)
        if not self.keep_statistics:
            return new_updates, {}
        return new_updates, statistics(global_norm=norm, clipped=norm > self.max_norm)


def clip(max_delta: float) -> Clip:
    """Clip every element of the updates to `[-max_delta, max_delta]`.

    Args:
        max_delta: the largest absolute value an update element may have.

    Examples:
        >>> gradtx.clip(1.0).update({"w": jnp.array([-3.0, 0.5])}, {})[0]["w"]
        Array([-1. ,  0.5], dtype=float32)
    """
    return Clip(max_delta)


def clip_by_global_norm(max_norm: float) -> ClipByGlobalNorm:
    r"""Scale the updates so their global L2 norm is at most `max_norm`.

    $u = g \cdot \min(1, \mathrm{max\_norm} / \lVert g \rVert_2)$, the norm taken over every
    present leaf together. The pre-clip norm is kept in the state as the statistic
    `global_norm`, and whether the step clipped as `clipped`, so both can be logged after the
    step (`gradtx.stats`); `gradtx.without_statistics` leaves them out.

    Args:
        max_norm: the largest global norm the updates may have.

    Examples:
        >>> tx = gradtx.clip_by_global_norm(1.0)
        >>> u, state = tx.update({"w": jnp.array([3.0, 4.0])}, tx.init({"w": jnp.zeros(2)}))
        >>> u["w"], state["global_norm"]
        (Array([0.6, 0.8], dtype=float32), Array(5., dtype=float32))
    """
    return ClipByGlobalNorm(max_norm)
