"""Reduce on plateau: scale the updates down when the loss stops improving."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import check_state_keys, map_updates
from gradtx._core.module import as_int, field, hyperparam, non_negative
from gradtx._core.protocol import Params, Transformation, Updates
from gradtx._layouts.step_counts import next_count
from gradtx._transforms.scale import scaled

_STATE = ("scale", "best_value", "plateau_count", "cooldown_count", "count", "avg_value")


def _factor(value: float) -> str | None:
    return None if 0 < value < 1 else "must be in (0, 1) (the scale is multiplied by it)"


def _relative(value: float) -> str | None:
    return None if 0 <= value <= 1 else "must be in [0, 1] (a relative tolerance)"


def missing_value_error(owner: str) -> TypeError:
    """The error for a transformation called without the loss it needs as `value`."""
    return TypeError(
        f"{owner} needs the loss: pass it as the `value` argument, "
        "`tx.update(grads, state, params, value=loss)` (for example from "
        "`loss, grads = jax.value_and_grad(loss_fn)(params)`)."
    )


def _known(value: Any) -> int | float | None:
    """The value of a number given at construction (None for arrays and tracers)."""
    return value.item() if isinstance(value, np.generic) else None


class ReduceOnPlateau(Transformation):
    """Scale the updates, lowering the scale on a plateau of the loss (see `reduce_on_plateau`)."""

    name: ClassVar[str] = "reduce_on_plateau"
    factor: Any = hyperparam(0.1, check=_factor)
    patience: Any = field(default=10, converter=as_int)
    rtol: Any = hyperparam(1e-4, check=_relative)
    atol: Any = hyperparam(0.0, check=non_negative)
    cooldown: Any = field(default=0, converter=as_int)
    accumulation_size: Any = field(default=1, converter=as_int)
    min_scale: Any = hyperparam(0.0, check=non_negative)

    def __check__(self) -> None:
        for name, least in (("patience", 0), ("cooldown", 0), ("accumulation_size", 1)):
            value = _known(getattr(self, name))
            if value is not None and value < least:
                raise ValueError(f"{self.name}: `{name}` must be >= {least}, got {value}.")
        if _known(self.rtol) == 0.0 and _known(self.atol) == 0.0:
            raise ValueError(
                f"{self.name}: `rtol` and `atol` are both 0, so any tiny decrease of the loss "
                "counts as an improvement; make at least one of them positive."
            )

    def state_keys(self) -> tuple[str, ...]:
        """The scale, the best value, the plateau and cooldown counters and the running mean."""
        return _STATE

    def init_state(self, params: Params) -> dict:
        """Scale 1, best value `inf`, zero counters and an empty running mean."""
        return {
            "scale": jnp.ones((), jnp.float32),
            "best_value": jnp.full((), jnp.inf, jnp.float32),
            "plateau_count": jnp.zeros((), jnp.int32),
            "cooldown_count": jnp.zeros((), jnp.int32),
            "count": jnp.zeros((), jnp.int32),
            "avg_value": jnp.zeros((), jnp.float32),
        }

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Add `value` to the running mean; at the end of each window, judge it; scale."""
        check_state_keys(self.name, state, _STATE)
        value = extra.get("value")
        if value is None:
            raise missing_value_error(self.name)
        count = next_count(state["count"])
        avg = (state["count"].astype(jnp.float32) * state["avg_value"]) + jnp.asarray(
            value, jnp.float32
        )
        avg = avg / count.astype(jnp.float32)
        full = count == jnp.asarray(self.accumulation_size, jnp.int32)

        best, scale = state["best_value"], state["scale"]
        improved = avg < (1 - self.rtol) * best - self.atol
        plateau = jnp.where(improved, 0, state["plateau_count"] + 1)
        cooling = state["cooldown_count"] > 0
        hit = ~cooling & (plateau == jnp.asarray(self.patience, jnp.int32))
        judged = {
            "best_value": jnp.where(improved, avg, best),
            "plateau_count": jnp.where(cooling | hit, 0, plateau),
            "scale": jnp.where(
                cooling,
                scale,
                jnp.maximum(jnp.where(hit, scale * self.factor, scale), self.min_scale),
            ),
            "cooldown_count": jnp.where(
                cooling,
                state["cooldown_count"] - 1,
                jnp.where(hit, jnp.asarray(self.cooldown, jnp.int32), 0),
            ),
        }
        new_state = {k: jnp.where(full, v, state[k]) for k, v in judged.items()}
        new_state["count"] = jnp.where(full, 0, count)
        new_state["avg_value"] = jnp.where(full, jnp.zeros((), jnp.float32), avg)
        factor = new_state["scale"]
        return map_updates(lambda g, _: scaled(g, factor), updates, owner=self.name), new_state


def reduce_on_plateau(
    factor: float = 0.1,
    patience: int = 10,
    rtol: float = 1e-4,
    atol: float = 0.0,
    cooldown: int = 0,
    accumulation_size: int = 1,
    min_scale: float = 0.0,
) -> ReduceOnPlateau:
    r"""Scale the updates by a factor that drops when the loss stops improving.

    Call `update` with the loss as `value`. The values of `accumulation_size` calls are
    averaged; at the end of each such window the mean $\bar f$ is judged against the best
    mean so far $f^\star$ (starting at $+\infty$):

    $$\text{improved} \iff \bar f < (1 - r)\, f^\star - a$$

    An improvement sets $f^\star = \bar f$ and the plateau count to 0; a window without one
    adds 1 to the count. When the count reaches `patience`, the scale $s$ (starting at 1)
    becomes $\max(\phi s, s_{min})$, the count restarts and a cooldown of `cooldown` windows
    begins, during which the scale stays and the count stays at 0. Every call returns

    $$u_t = s_t\, g_t$$

    with the scale after this call's judgement. Chain it after an optimizer to lower its
    learning rate on a plateau: `gradtx.chain(gradtx.adam(1e-3), reduce_on_plateau())`,
    called as `tx.update(grads, state, params, value=loss)` (a chain passes `value` on to
    every step). Without `value` it raises a `TypeError` that says so.

    Args:
        factor: $\phi$ in (0, 1), the factor the scale is multiplied by on a plateau.
        patience: the number of windows without improvement that make a plateau (an int32
            leaf).
        rtol: $r$, the relative decrease that counts as an improvement, in [0, 1].
        atol: $a$, the absolute decrease that counts as an improvement (`rtol` and `atol`
            may not both be 0).
        cooldown: the number of windows after a reduction during which nothing changes
            (an int32 leaf).
        accumulation_size: the number of calls whose values are averaged into one window
            (an int32 leaf, at least 1).
        min_scale: $s_{min}$, the smallest scale.

    State:
        Global, by name: `scale` and `best_value` (float32), `plateau_count`,
        `cooldown_count` and `count` (int32; `count` is the number of values in the current
        window) and `avg_value` (float32, their mean). No per-path state.

    Examples:
        >>> tx = gradtx.contrib.reduce_on_plateau(factor=0.5, patience=1)
        >>> grads = {"w": jnp.ones(2)}
        >>> state = tx.init(grads)
        >>> for loss in [3.0, 2.0, 2.0, 2.0]:  # the last two calls find no improvement
        ...     updates, state = tx.update(grads, state, value=loss)
        >>> updates["w"], float(state["best_value"])
        (Array([0.25, 0.25], dtype=float32), 2.0)

    References:
        The `ReduceLROnPlateau` learning-rate scheduler of PyTorch and Keras (Paszke et al.,
        "PyTorch: An Imperative Style, High-Performance Deep Learning Library", NeurIPS
        2019), as optax.contrib has it.
    """
    return ReduceOnPlateau(factor, patience, rtol, atol, cooldown, accumulation_size, min_scale)
