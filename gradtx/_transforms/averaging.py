"""Exponential moving averages of updates (Polyak-style averaging), with debiasing."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import as_stored, compute_dtype, dtype_or_none, zeros_for
from gradtx._core.module import decay_rate, hyperparam, static
from gradtx._core.per_array import PerArrayTransform
from gradtx._layouts.step_counts import next_count


class Ema(PerArrayTransform):
    """An exponential moving average of the updates (see `ema`)."""

    name: ClassVar[str] = "ema"
    decay: Any = hyperparam(check=decay_rate)
    debias: bool = static(True)
    accumulator_dtype: Any = static(None, converter=dtype_or_none)

    def state_keys(self) -> tuple[str, ...]:
        """The average `ema`, and the path's step `count` when debiasing."""
        return ("ema", "count") if self.debias else ("ema",)

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A zero average in `accumulator_dtype` (default: the param's dtype) and count 0."""
        slots = {"ema": zeros_for(param, self.accumulator_dtype)}
        if self.debias:
            slots["count"] = jnp.zeros((), jnp.int32)
        return slots

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`e = decay * e + (1 - decay) * g`; the update is `e`, or `e / (1 - decay^t)`."""
        dtype = compute_dtype(g, slots["ema"])
        decay = self.decay.astype(dtype)
        new = as_stored(
            decay * slots["ema"].astype(dtype) + (1 - decay) * g.astype(dtype), slots["ema"]
        )
        if not self.debias:
            return new, {"ema": new}
        # The count the lifting helper stores (one add for both: the donated count then has
        # one reader, and XLA writes it in place instead of copying it first).
        count = next_count(slots["count"])
        u = new / (1 - decay ** count.astype(dtype))
        return u, {"ema": new, "count": count}


def ema(decay: float, debias: bool = True, accumulator_dtype: Any = None) -> Ema:
    r"""An exponential moving average of the updates, optionally bias-corrected.

    Per path, with step $t$ counted per path:

    $$e_t = \delta\, e_{t-1} + (1-\delta)\, g_t,\qquad
      u_t = e_t \ \text{ or, with debias, }\ u_t = \frac{e_t}{1-\delta^t}$$

    Args:
        decay: the decay $\delta$ of the average.
        debias: divide by $1-\delta^t$, so early averages are not biased towards zero.
        accumulator_dtype: dtype of the average (default: the parameter's dtype).

    State:
        `ema/<path>` shaped like the parameter; `count/<path>` (int32) when `debias`.

    Examples:
        >>> tx = gradtx.ema(0.5)
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> u, state = tx.update({"w": jnp.ones(2)}, state)
        >>> u["w"], state["ema"]["w"]
        (Array([1., 1.], dtype=float32), Array([0.5, 0.5], dtype=float32))
    """
    return Ema(decay, debias, accumulator_dtype)
