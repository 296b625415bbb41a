"""Schedules that warm up linearly, then stay constant or decay."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.core import Tracer

from gradtx._core.module import as_int, hyperparam
from gradtx._schedules.base import Join, Schedule, as_f32, check_concrete_steps, steps_field
from gradtx._schedules.decays import ExponentialDecay


def _ramp(init_value: Any, peak_value: Any, warmup_steps: Any, step: jax.Array) -> jax.Array:
    """`init + (peak - init) * t / W`, with `t` clipped to `[0, W]` (and `W = 0` read as 1)."""
    t = as_f32(jnp.clip(step, 0, warmup_steps))
    return init_value + (peak_value - init_value) * (t / as_f32(jnp.maximum(warmup_steps, 1)))


class WarmupCosineDecay(Schedule):
    """Linear warm-up to `peak_value`, then cosine decay to `end_value`."""

    init_value: Any = hyperparam()
    peak_value: Any = hyperparam()
    warmup_steps: Any = steps_field()
    decay_steps: Any = steps_field()
    end_value: Any = hyperparam(0.0)
    exponent: Any = hyperparam(1.0)

    def __check__(self) -> None:
        concrete = not any(isinstance(x, Tracer) for x in (self.warmup_steps, self.decay_steps))
        if concrete and not 0 <= int(self.warmup_steps) < int(self.decay_steps):
            raise ValueError(
                "warmup_cosine_decay: need 0 <= warmup_steps < decay_steps (decay_steps counts "
                f"the warm-up too), got warmup_steps={int(self.warmup_steps)}, "
                f"decay_steps={int(self.decay_steps)}."
            )

    def __call__(self, step: Any) -> jax.Array:
        """Warm-up value before `warmup_steps`, cosine-decayed value after."""
        step = jnp.asarray(step)
        warmup = _ramp(self.init_value, self.peak_value, self.warmup_steps, step)
        span = self.decay_steps - self.warmup_steps
        t = as_f32(jnp.clip(step - self.warmup_steps, 0, span))
        cosine = 0.5 * (1 + jnp.cos(math.pi * t / as_f32(span)))
        decay = self.end_value + (self.peak_value - self.end_value) * cosine**self.exponent
        return jnp.where(step < self.warmup_steps, warmup, decay)


def warmup_cosine_decay(
    init_value: float,
    peak_value: float,
    warmup_steps: int,
    decay_steps: int,
    end_value: float = 0.0,
    exponent: float = 1.0,
) -> WarmupCosineDecay:
    """Linear warm-up from `init_value` to `peak_value`, then cosine decay to `end_value`.

    The value is `peak_value` at step `warmup_steps` and `end_value` from step `decay_steps`
    on; `decay_steps` counts the warm-up too (as in optax).

    Args:
        init_value: value at step 0.
        peak_value: value at the end of the warm-up.
        warmup_steps: length of the warm-up (0 for none).
        decay_steps: total length of warm-up plus decay.
        end_value: final value.
        exponent: exponent of the cosine factor.

    Examples:
        >>> sched = gradtx.schedules.warmup_cosine_decay(0.0, 1.0, 10, 110)
        >>> sched(5), sched(10), sched(200)
        (Array(0.5, dtype=float32), Array(1., dtype=float32), Array(0., dtype=float32))
        >>> round(float(sched(60)), 4)  # halfway through the decay
        0.5
    """
    return WarmupCosineDecay(init_value, peak_value, warmup_steps, decay_steps, end_value, exponent)


class WarmupConstant(Schedule):
    """Linear warm-up from `init_value` to `peak_value`, then constant (see `warmup_constant`)."""

    init_value: Any = hyperparam()
    peak_value: Any = hyperparam()
    warmup_steps: Any = steps_field()

    def __check__(self) -> None:
        check_concrete_steps(self.warmup_steps, "warmup_steps", "warmup_constant", 0)

    def __call__(self, step: Any) -> jax.Array:
        """`init + (peak - init) * t / W` for `t < W`, `peak` from `W` on."""
        step = jnp.asarray(step)
        ramp = _ramp(self.init_value, self.peak_value, self.warmup_steps, step)
        return jnp.where(step < self.warmup_steps, ramp, self.peak_value)


def warmup_constant(
    init_value: float, peak_value: float, warmup_steps: int | jax.Array
) -> WarmupConstant:
    """Linear warm-up from `init_value` to `peak_value`, then constant at `peak_value`.

    As optax's `warmup_constant_schedule`, except that `warmup_steps=0` gives `peak_value`
    from step 0 on (optax then returns `init_value` at every step).

    Args:
        init_value: the value at step 0.
        peak_value: the value from step `warmup_steps` on.
        warmup_steps: length of the warm-up (non-negative).

    Examples:
        >>> sched = gradtx.schedules.warmup_constant(0.0, 1.0, 4)
        >>> sched(0), sched(2), sched(4), sched(100)
        (Array(0., dtype=float32), Array(0.5, dtype=float32), Array(1., dtype=float32), Array(1., dtype=float32))
    """  # noqa: E501
    return WarmupConstant(init_value, peak_value, warmup_steps)


def warmup_exponential_decay(
    init_value: float,
    peak_value: float,
    warmup_steps: int,
    transition_steps: int,
    decay_rate: float,
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: float | None = None,
) -> Join:
    """Linear warm-up from `init_value` to `peak_value`, then exponential decay.

    After the warm-up the step count restarts at 0 and the value follows
    `exponential_decay(peak_value, transition_steps, decay_rate, transition_begin, staircase,
    end_value)`, so it stays at `peak_value` for `transition_begin` more steps.

    Args:
        init_value: the value at step 0.
        peak_value: the value at the end of the warm-up.
        warmup_steps: length of the warm-up (non-negative).
        transition_steps: steps per factor of `decay_rate` (positive).
        decay_rate: the decay factor, positive (below 1 decays, above 1 grows).
        transition_begin: steps after the warm-up before the decay starts.
        staircase: decay in whole steps of `transition_steps`.
        end_value: a bound the value never passes (a floor for decay, a ceiling for growth).

    Examples:
        >>> sched = gradtx.schedules.warmup_exponential_decay(0.0, 1.0, 10, 5, 0.5)
        >>> sched(5), sched(10), sched(20)
        (Array(0.5, dtype=float32), Array(1., dtype=float32), Array(0.25, dtype=float32))
    """
    fn = "warmup_exponential_decay"
    check_concrete_steps(as_int(warmup_steps), "warmup_steps", fn, 0)
    check_concrete_steps(as_int(transition_begin), "transition_begin", fn, 0)
    check_concrete_steps(as_int(transition_steps), "transition_steps", fn, 1)
    decay = ExponentialDecay(
        peak_value, transition_steps, decay_rate, transition_begin, staircase, end_value
    )
    warmup = WarmupConstant(init_value, peak_value, warmup_steps)
    return Join((warmup, decay), (as_int(warmup_steps, "warmup_exponential_decay.warmup_steps"),))
