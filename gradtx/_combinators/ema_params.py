"""Polyak averaging of the params: an exponential moving average to evaluate with."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._combinators.schedule_free import check_number, own_copy
from gradtx._combinators.wrapper import Wrapper
from gradtx._core.apply import apply_updates
from gradtx._core.lift import (
    check_state_keys,
    compute_dtype,
    dtype_or_none,
    init_slots,
    update_slots,
    zeros_for,
)
from gradtx._core.module import decay_rate, hyperparam, static
from gradtx._core.protocol import Params, Updates, own_hyperparams
from gradtx._layouts.step_counts import next_count
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.subset import present_paths


class EmaParams(Wrapper):
    """An inner transformation, with a moving average of the params (see `ema_params`)."""

    name: ClassVar[str] = "ema_params"
    decay: Any = hyperparam(0.999, check=decay_rate)
    debias: bool = static(True)
    accumulator_dtype: Any = static(None, converter=dtype_or_none)

    def __check__(self) -> None:
        check_number(self.decay, "decay", self.name)

    def state_keys(self) -> tuple[str, ...]:
        """The inner state, the average `ema` and, when debiasing, the path's step `count`."""
        return ("inner", "ema", "count") if self.debias else ("inner", "ema")

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """The inner steps, then this one with its `decay`."""
        entry = (self.name, own_hyperparams(self, step))
        inner = self.inner.describe(params, step)
        return {path: [*inner.get(path, []), entry] for path in present_paths(params)}

    def init_state(self, params: Params) -> dict:
        """The inner state; a zero average (a copy of the params without `debias`)."""

        def leaf_init(param: Any) -> dict[str, Any]:
            if self.debias:
                return {"ema": zeros_for(param, self.accumulator_dtype), "count": jnp.int32(0)}
            return {"ema": own_copy(param, self.accumulator_dtype)}

        keys = self.state_keys()[1:]
        slots = init_slots(params, leaf_init, keys, step_counts=("count",) if self.debias else ())
        return {"inner": self.inner.init_state(params), **slots}

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """The inner update; then fold the inner's eval weights after it into the average."""
        check_state_keys(self.name, state, self.state_keys())
        if params is None:
            raise ValueError(
                f"{self.name} needs the params: call `tx.update(updates, state, params)`, the "
                "average follows the params after each step."
            )
        new_updates, inner = self.inner.step(updates, state["inner"], params, **extra)
        # The weights after this step, as `apply_updates` gives them to the caller (under jit
        # XLA computes them once for both), seen through the inner's own eval weights.
        target = self.inner.eval_params(inner, apply_updates(params, new_updates))
        decay = self.decay

        def average(u: Any, slots: dict, theta: Any) -> tuple[Any, dict]:
            dtype = compute_dtype(theta, slots["ema"])
            d = decay.astype(dtype)
            new = {"ema": d * slots["ema"].astype(dtype) + (1 - d) * theta.astype(dtype)}
            if "count" in slots:  # packed params count here; the helper counts other paths
                new["count"] = next_count(slots["count"])
            return u, new

        slots = {k: state[k] for k in self.state_keys()[1:]}
        _, slots = update_slots(
            average, new_updates, slots, target, owner=self.name, needs_params=True
        )
        return new_updates, {"inner": inner, **slots}

    def eval_params(self, state: dict, params: Params) -> Any:
        """The moving average (debiased), shaped like `params`; `params` before any step.

        Args:
            state: this transformation's state after the last update.
            params: the params after that update was applied.
        """
        check_state_keys(self.name, state, self.state_keys())
        decay = self.decay

        def average(y: Any, slots: dict, _: Any) -> tuple[Any, dict]:
            dtype = compute_dtype(y, slots["ema"])
            ema = slots["ema"].astype(dtype)
            if not self.debias:
                return ema.astype(y.dtype), {}
            t = slots["count"].astype(dtype)
            # 1 - decay**t to full precision for a decay near 1: -expm1(t log1p(decay - 1)).
            correction = -jnp.expm1(t * jnp.log1p(decay.astype(dtype) - 1))
            safe = jnp.where(t > 0, correction, jnp.ones_like(correction))
            return jnp.where(t > 0, ema / safe, y.astype(dtype)).astype(y.dtype), {}

        slots = {k: state[k] for k in self.state_keys()[1:]}
        owner = f"{self.name}.eval_params"
        averaged, _ = update_slots(average, params, slots, owner=owner, element_slots=())
        return averaged  # in the params' own dtypes


def ema_params(
    tx: Any, decay: float = 0.999, debias: bool = True, *, accumulator_dtype: Any = None
) -> EmaParams:
    r"""Keep an exponential moving average of the params to evaluate with (Polyak averaging).

    `tx` trains as usual (the updates are its own); after each step the average takes in
    the weights $\theta_t$ the step leads to (`tx`'s own evaluation weights of the new
    params, so `ema_params(schedule_free_sgd(...))` averages the schedule-free $x$), per
    path with its own step count $t$:

    $$e_t = \delta\,e_{t-1} + (1 - \delta)\,\theta_t,\qquad
      \bar\theta_t = e_t / (1 - \delta^t)\ \text{ with `debias`, else } e_t$$

    `gradtx.eval_params(tx, state, params)` returns $\bar\theta_t$ (the params themselves
    before the first step). With `debias`, $e_0 = 0$; without, $e_0$ is a copy of the
    params at `init`. `gradtx.ema` is another thing: an average of the *updates*. A path
    without a gradient at a step (`None`) keeps its average and count.

    Args:
        tx: the transformation that trains the params.
        decay: the decay $\delta$ of the average.
        debias: divide by $1 - \delta^t$, so early averages are not pulled towards $e_0$.
        accumulator_dtype: dtype of the average (default: the parameter's dtype; float32
            keeps a bfloat16 model's average from rounding its small increments away).

    State:
        `inner/...` (the state of `tx`), `ema/<path>` and, with `debias`, `count/<path>`
        (int32).

    Examples:
        >>> tx = gradtx.ema_params(gradtx.sgd(1.0), decay=0.5)
        >>> params = {"w": jnp.zeros(1)}
        >>> state = tx.init(params)
        >>> for _ in range(2):
        ...     u, state = tx.update({"w": jnp.array([-1.0])}, state, params)
        ...     params = gradtx.apply_updates(params, u)
        ...     print(params["w"], gradtx.eval_params(tx, state, params)["w"])
        [1.] [1.]
        [2.] [1.6666666]

    References:
        Polyak & Juditsky, "Acceleration of Stochastic Approximation by Averaging", 1992.
    """
    return EmaParams(as_transformation(tx, "ema_params(tx)"), decay, debias, accumulator_dtype)
