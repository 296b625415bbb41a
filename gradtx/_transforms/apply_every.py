"""`apply_every`: sum the updates of k steps and release the sum on the k-th."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import as_stored, compute_dtype, zeros_for
from gradtx._core.module import as_int, field
from gradtx._core.per_array import PerArrayTransform


class ApplyEvery(PerArrayTransform):
    """Accumulate updates, release their sum every `k` steps (see `apply_every`)."""

    name: ClassVar[str] = "apply_every"
    k: Any = field(default=1, converter=as_int)

    def __check__(self) -> None:
        if isinstance(self.k, (np.generic, np.ndarray)) and int(self.k) < 1:
            raise ValueError(f"apply_every: `k` must be a positive number of steps, got {self.k}")

    def state_keys(self) -> tuple[str, ...]:
        """The running sum `grad_acc` and the path's step `count`."""
        return ("grad_acc", "count")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A zero sum (the param's dtype) and count 0."""
        return {"grad_acc": zeros_for(param), "count": jnp.zeros((), jnp.int32)}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Add `g` to the sum (restarted after a release); the sum on the k-th step, else 0."""
        dtype = compute_dtype(g, slots["grad_acc"])
        phase = slots["count"] % jnp.asarray(self.k, jnp.int32)
        kept = slots["grad_acc"].astype(dtype) * (phase != 0).astype(dtype)
        total = as_stored(kept + g.astype(dtype), slots["grad_acc"])
        release = phase == jnp.asarray(self.k, jnp.int32) - 1
        u = total * release.astype(dtype)
        return u, {"grad_acc": total, "count": slots["count"] + 1}


def apply_every(k: int = 1) -> ApplyEvery:
    r"""Accumulate updates and release their sum every `k` steps; zeros in between.

    Per path, with $n$ the path's earlier updates, $c = n \bmod k$:

    $$A_n = [c \ne 0]\, A_{n-1} + g_n,\qquad u_n = [c = k - 1]\, A_n$$

    so steps $1, \dots, k-1$ of each cycle give zero updates and step $k$ gives the sum of
    the cycle's $k$ updates. Unlike `accumulate` (optax's `MultiSteps`), whose inner
    optimizer runs once per cycle, the transformations chained before `apply_every` run at
    every step: `chain(adam(...), apply_every(k))` sums $k$ Adam steps, and Adam's state moves
    $k$ times. As in optax, it is placed last, after the learning rate. `k` is an int32 leaf,
    so a new `k` does not recompile a jitted step.

    Args:
        k: the number of updates summed per release (1: every update passes unchanged).

    State:
        `grad_acc/<path>` shaped like the parameter; `count/<path>` (int32).

    Examples:
        >>> tx = gradtx.apply_every(2)
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> u, state = tx.update({"w": jnp.array([1.0, 2.0])}, state)
        >>> u["w"]
        Array([0., 0.], dtype=float32)
        >>> u, state = tx.update({"w": jnp.array([3.0, 4.0])}, state)
        >>> u["w"]
        Array([4., 6.], dtype=float32)
    """
    return ApplyEvery(k)
