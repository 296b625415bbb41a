"""Momentum: an exponentially decaying trace of past updates."""

from __future__ import annotations

from typing import Any, ClassVar

from gradtx._core.lift import as_stored, cast, compute_dtype, dtype_or_none, zeros_for
from gradtx._core.module import hyperparam, momentum_rate, static
from gradtx._core.per_array import PerArrayTransform
from gradtx._transforms.shared_args import with_shared_args


class Trace(PerArrayTransform):
    """Heavy-ball or Nesterov momentum (see `trace`)."""

    name: ClassVar[str] = "trace"
    decay: Any = hyperparam(check=momentum_rate)
    nesterov: bool = static(False)
    accumulator_dtype: Any = static(None, converter=dtype_or_none)

    def state_keys(self) -> tuple[str, ...]:
        """The momentum buffer `trace`."""
        return ("trace",)

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A zero trace in `accumulator_dtype` (default: the param's dtype)."""
        return {"trace": zeros_for(param, self.accumulator_dtype)}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`t = g + decay * t`; the update is `t`, or `g + decay * t` for Nesterov."""
        dtype = compute_dtype(g, slots["trace"])
        grad, decay = cast(g, dtype), cast(self.decay, dtype)
        new_trace = as_stored(grad + decay * cast(slots["trace"], dtype), slots["trace"])
        u = grad + decay * new_trace if self.nesterov else new_trace
        return cast(u, g.dtype), {"trace": new_trace}


@with_shared_args
def trace(decay: float, nesterov: bool = False, *, accumulator_dtype: Any = None) -> Trace:
    r"""Momentum: keep a decaying sum of past updates.

    $t_k = g_k + \mathrm{decay}\cdot t_{k-1}$; the update is $t_k$, or with Nesterov momentum
    $g_k + \mathrm{decay}\cdot t_k$.

    Args:
        decay: the momentum coefficient.
        accumulator_dtype: dtype of the trace (default: the parameter's dtype).

    State:
        `trace/<path>` shaped like the parameter.

    Examples:
        >>> tx = gradtx.trace(0.9)
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> u, state = tx.update({"w": jnp.ones(2)}, state)
        >>> u, state = tx.update({"w": jnp.ones(2)}, state)
        >>> u["w"]
        Array([1.9, 1.9], dtype=float32)
    """
    return Trace(decay, nesterov, accumulator_dtype)
