"""Clipping updates elementwise or by their global norm."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import cast, compute_dtype, map_updates
from gradtx._core.module import hyperparam, positive, static
from gradtx._core.per_array import PerArrayTransform
from gradtx._core.protocol import Params, Updates
from gradtx._core.statistics import KeepsStatistics, statistics
from gradtx._transforms.scale import scaled
from gradtx._tree.reductions import global_sum


def global_norm(updates: Updates) -> jnp.ndarray:
    """The L2 norm of all leaves of `updates` together, in float32 (`None` leaves skipped).

    Packed params count by their buffers, and a complex leaf as its pair of reals:
    `|z|^2 = re^2 + im^2`.

    Examples:
        >>> global_norm({"a": jnp.array([3.0]), "b": jnp.array([4.0]), "c": None})
        Array(5., dtype=float32)
    """
    return jnp.sqrt(global_sum(updates))


class Clip(PerArrayTransform):
    """Clip each element to `[-max_delta, max_delta]` (see `clip`)."""

    name: ClassVar[str] = "clip"
    max_delta: Any = hyperparam(check=positive)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = clip(g, -max_delta, max_delta)`."""
        limit = cast(self.max_delta, compute_dtype(g))
        return cast(jnp.clip(cast(g, limit.dtype), -limit, limit), g.dtype), {}


class ClipByGlobalNorm(PerArrayTransform, KeepsStatistics):
    """Rescale all updates together so their global norm is at most `max_norm`."""

    name: ClassVar[str] = "clip_by_global_norm"
    max_norm: Any = hyperparam(check=positive)
    keep_statistics: bool = static(True)

    def state_keys(self) -> tuple[str, ...]:
        """The statistics `global_norm` and `clipped` (none without statistics)."""
        return ("global_norm", "clipped") if self.keep_statistics else ()

    def init_state(self, params: Params) -> dict:
        """The last updates' norm before clipping, and whether that step clipped them."""
        if not self.keep_statistics:
            return {}
        return statistics(global_norm=jnp.zeros((), jnp.float32), clipped=jnp.zeros((), bool))

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Scale every present update by `min(1, max_norm / global_norm)`."""
        self.check_state(state)
        norm = global_norm(updates)
        # One scalar factor, computed once: the per-leaf work stays a single multiply.
        factor = jnp.where(norm < self.max_norm, jnp.float32(1), self.max_norm / norm)
        new_updates = map_updates(lambda g, _: scaled(g, factor), updates, owner=self.name)
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
