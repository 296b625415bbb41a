"""Schedules: small pytrees callable as `schedule(step)`.

Numeric arguments are leaves (values float32, step counts int32), so a sweep over peak
learning rates or warm-up lengths never recompiles. Any plain function `step -> value` works
wherever a schedule does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gradtx._module import Module, as_int, field, hyperparam, static

__all__ = [
    "Schedule",
    "constant",
    "cosine_decay",
    "exponential_decay",
    "join",
    "linear",
    "piecewise_constant",
    "polynomial",
    "warmup_cosine_decay",
]


def _steps(default: Any = dataclasses.MISSING) -> Any:
    return field(default=default, converter=as_int)


def _f32(x: Any) -> jax.Array:
    return jnp.asarray(x).astype(jnp.float32)


def _positive_steps(value: Any, name: str, fn: str) -> None:
    if value is not None and not isinstance(value, jax.core.Tracer) and int(value) <= 0:
        raise ValueError(f"{fn}: `{name}` must be a positive number of steps, got {int(value)}.")


class Schedule(Module):
    """Base class: a pytree with `__call__(step) -> float32 value`."""

    def __call__(self, step: Any) -> jax.Array:
        """The value at `step` (an int or int array)."""
        raise TypeError(f"{type(self).__name__} does not define __call__")


class FunctionSchedule(Schedule):
    """A plain function `step -> value`, kept static."""

    fn: Callable = static()

    def __call__(self, step: Any) -> jax.Array:
        """`fn(step)` as float32."""
        return _f32(self.fn(step))


def as_schedule(value: Any) -> Schedule:
    """A `Schedule` from a schedule, a function, or a constant."""
    if isinstance(value, Schedule):
        return value
    if callable(value):
        return FunctionSchedule(value)
    return Constant(value)


class Constant(Schedule):
    """`value` at every step."""

    value: Any = hyperparam()

    def __call__(self, step: Any) -> jax.Array:
        """The constant, broadcast like `step`."""
        return jnp.broadcast_to(self.value, jnp.shape(step))


class Polynomial(Schedule):
    """Polynomial interpolation from `init_value` to `end_value` (see `polynomial`)."""

    init_value: Any = hyperparam()
    end_value: Any = hyperparam()
    power: Any = hyperparam()
    transition_steps: Any = _steps()
    transition_begin: Any = _steps(0)

    def __check__(self) -> None:
        _positive_steps(self.transition_steps, "transition_steps", type(self).__name__.lower())

    def __call__(self, step: Any) -> jax.Array:
        """`(init - end) * (1 - t/T)**power + end`, `t` clipped to `[0, T]`."""
        t = jnp.clip(jnp.asarray(step) - self.transition_begin, 0, self.transition_steps)
        frac = 1 - _f32(t) / _f32(self.transition_steps)
        return (self.init_value - self.end_value) * frac**self.power + self.end_value


class CosineDecay(Schedule):
    """Cosine decay from `init_value` to `alpha * init_value` (see `cosine_decay`)."""

    init_value: Any = hyperparam()
    decay_steps: Any = _steps()
    alpha: Any = hyperparam(0.0)
    exponent: Any = hyperparam(1.0)

    def __check__(self) -> None:
        _positive_steps(self.decay_steps, "decay_steps", "cosine_decay")

    def __call__(self, step: Any) -> jax.Array:
        """`init * ((1 - alpha) * c**exponent + alpha)`, `c = (1 + cos(pi t / T)) / 2`."""
        t = _f32(jnp.clip(jnp.asarray(step), 0, self.decay_steps))
        cosine = 0.5 * (1 + jnp.cos(math.pi * t / _f32(self.decay_steps)))
        return self.init_value * ((1 - self.alpha) * cosine**self.exponent + self.alpha)


class ExponentialDecay(Schedule):
    """`init * rate**((t - begin) / T)` (see `exponential_decay`)."""

    init_value: Any = hyperparam()
    transition_steps: Any = _steps()
    decay_rate: Any = hyperparam()
    transition_begin: Any = _steps(0)
    staircase: bool = static(False)
    end_value: Any = hyperparam(None)

    def __check__(self) -> None:
        _positive_steps(self.transition_steps, "transition_steps", "exponential_decay")

    def __call__(self, step: Any) -> jax.Array:
        """The decayed value, held at `init_value` before `transition_begin`."""
        t = jnp.asarray(step) - self.transition_begin
        p = _f32(t) / _f32(self.transition_steps)
        if self.staircase:
            p = jnp.floor(p)
        value = jnp.where(t <= 0, self.init_value, self.init_value * self.decay_rate**p)
        if self.end_value is not None:
            bounded = jnp.where(
                self.decay_rate < 1,
                jnp.maximum(value, self.end_value),
                jnp.minimum(value, self.end_value),
            )
            value = bounded
        return value


class PiecewiseConstant(Schedule):
    """`init_value` times every scale whose boundary has been reached."""

    init_value: Any = hyperparam()
    boundaries: Any = _steps()
    scales: Any = hyperparam()

    def __call__(self, step: Any) -> jax.Array:
        """`init * prod(scales[b] for b in boundaries if step >= b)`."""
        step = jnp.asarray(step)
        boundaries = jnp.reshape(self.boundaries, (1,) * step.ndim + (-1,))
        reached = step[..., None] >= boundaries
        factors = jnp.where(reached, self.scales, jnp.float32(1))
        return self.init_value * jnp.prod(factors, axis=-1)


class WarmupCosineDecay(Schedule):
    """Linear warm-up to `peak_value`, then cosine decay to `end_value`."""

    init_value: Any = hyperparam()
    peak_value: Any = hyperparam()
    warmup_steps: Any = _steps()
    decay_steps: Any = _steps()
    end_value: Any = hyperparam(0.0)
    exponent: Any = hyperparam(1.0)

    def __check__(self) -> None:
        concrete = not any(
            isinstance(x, jax.core.Tracer) for x in (self.warmup_steps, self.decay_steps)
        )
        if concrete and not 0 <= int(self.warmup_steps) < int(self.decay_steps):
            raise ValueError(
                "warmup_cosine_decay: need 0 <= warmup_steps < decay_steps (decay_steps counts "
                f"the warm-up too), got warmup_steps={int(self.warmup_steps)}, "
                f"decay_steps={int(self.decay_steps)}."
            )

    def __call__(self, step: Any) -> jax.Array:
        """Warm-up value before `warmup_steps`, cosine-decayed value after."""
        step = jnp.asarray(step)
        warm = _f32(jnp.maximum(self.warmup_steps, 1))
        t_warm = _f32(jnp.clip(step, 0, self.warmup_steps))
        warmup = self.init_value + (self.peak_value - self.init_value) * (t_warm / warm)
        span = self.decay_steps - self.warmup_steps
        t = _f32(jnp.clip(step - self.warmup_steps, 0, span))
        cosine = 0.5 * (1 + jnp.cos(math.pi * t / _f32(span)))
        decay = self.end_value + (self.peak_value - self.end_value) * cosine**self.exponent
        return jnp.where(step < self.warmup_steps, warmup, decay)


class Join(Schedule):
    """Schedules run one after another; each restarts its step count at its boundary."""

    schedules: tuple
    boundaries: Any = _steps()

    def __call__(self, step: Any) -> jax.Array:
        """`schedules[i](step - boundaries[i-1])` for the last boundary reached."""
        step = jnp.asarray(step)
        value = self.schedules[0](step)
        for i, schedule in enumerate(self.schedules[1:]):
            boundary = self.boundaries[i]
            value = jnp.where(step < boundary, value, schedule(step - boundary))
        return value


def constant(value: float) -> Constant:
    """The same value at every step.

    Examples:
        >>> gradtx.schedules.constant(0.1)(100)
        Array(0.1, dtype=float32)
    """
    return Constant(value)


def polynomial(
    init_value: float,
    end_value: float,
    power: float,
    transition_steps: int,
    transition_begin: int = 0,
) -> Polynomial:
    r"""Polynomial decay from `init_value` to `end_value`.

    $v(t) = (v_0 - v_1)(1 - \tau/T)^p + v_1$ with $\tau = \mathrm{clip}(t - t_0, 0, T)$.

    Args:
        init_value: value before and at `transition_begin`.
        end_value: value from `transition_begin + transition_steps` on.
        power: the exponent $p$.
        transition_steps: length $T$ of the transition (positive).
        transition_begin: step $t_0$ at which the transition starts.

    Examples:
        >>> gradtx.schedules.polynomial(1.0, 0.0, 2.0, 10)(5)
        Array(0.25, dtype=float32)
    """
    return Polynomial(init_value, end_value, power, transition_steps, transition_begin)


def linear(
    init_value: float, end_value: float, transition_steps: int, transition_begin: int = 0
) -> Polynomial:
    """Linear interpolation from `init_value` to `end_value` over `transition_steps`.

    Args:
        init_value: value before and at `transition_begin`.
        end_value: value from `transition_begin + transition_steps` on.
        transition_steps: length of the transition (positive).
        transition_begin: step at which the transition starts.

    Examples:
        >>> gradtx.schedules.linear(0.0, 1.0, 4)(1)
        Array(0.25, dtype=float32)
    """
    return Polynomial(init_value, end_value, 1.0, transition_steps, transition_begin)


def cosine_decay(
    init_value: float, decay_steps: int, alpha: float = 0.0, exponent: float = 1.0
) -> CosineDecay:
    r"""Cosine decay from `init_value` to `alpha * init_value` (Loshchilov & Hutter, 2017).

    $v(t) = v_0\left((1-\alpha)\,c(t)^e + \alpha\right)$ with
    $c(t) = \tfrac12(1 + \cos(\pi \min(t, T)/T))$.

    Args:
        init_value: the value at step 0.
        decay_steps: steps $T$ to reach the final value (positive).
        alpha: the final value as a fraction of `init_value`.
        exponent: the exponent $e$ of the cosine factor.

    Examples:
        >>> sched = gradtx.schedules.cosine_decay(1.0, 10, alpha=0.1)
        >>> sched(0), sched(10)
        (Array(1., dtype=float32), Array(0.1, dtype=float32))
        >>> round(float(sched(5)), 4)  # halfway: (1 + alpha) / 2, up to float32 rounding
        0.55
    """
    return CosineDecay(init_value, decay_steps, alpha, exponent)


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


def exponential_decay(
    init_value: float,
    transition_steps: int,
    decay_rate: float,
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: float | None = None,
) -> ExponentialDecay:
    r"""Exponential decay: $v(t) = v_0\, r^{(t - t_0)/T}$ for $t > t_0$, else $v_0$.

    Args:
        init_value: the initial value.
        transition_steps: steps $T$ per factor of `decay_rate` (positive).
        decay_rate: the factor $r$ (below 1 decays, above 1 grows).
        transition_begin: step $t_0$ before which the value stays `init_value`.
        staircase: decay in whole steps of $T$ (floor the exponent).
        end_value: a bound the value never passes (a floor for decay, a ceiling for growth).

    Examples:
        >>> gradtx.schedules.exponential_decay(1.0, 10, 0.5)(20)
        Array(0.25, dtype=float32)
    """
    return ExponentialDecay(
        init_value, transition_steps, decay_rate, transition_begin, staircase, end_value
    )


def piecewise_constant(
    init_value: float, boundaries_and_scales: Mapping[int, float] | None = None
) -> PiecewiseConstant:
    """`init_value`, multiplied by each scale from its boundary step on.

    Args:
        init_value: the value before the first boundary.
        boundaries_and_scales: `{step: scale}`; from `step` on the value is multiplied by
            `scale` (scales accumulate).

    Examples:
        >>> sched = gradtx.schedules.piecewise_constant(1.0, {10: 0.1, 20: 0.5})
        >>> sched(9), sched(10), sched(25)
        (Array(1., dtype=float32), Array(0.1, dtype=float32), Array(0.05, dtype=float32))
    """
    items = sorted((boundaries_and_scales or {}).items())
    for boundary, _ in items:
        if int(boundary) < 0:
            raise ValueError(f"piecewise_constant: boundary {boundary} is negative.")
    boundaries = np.asarray([b for b, _ in items], np.int32)
    scales = np.asarray([s for _, s in items], np.float32)
    return PiecewiseConstant(init_value, boundaries, scales)


def join(schedules: Sequence[Any], boundaries: Sequence[int]) -> Join:
    """Run schedules one after another; each starts counting from 0 at its boundary.

    Args:
        schedules: `n` schedules (or functions of the step).
        boundaries: `n - 1` increasing steps at which the next schedule takes over.

    Examples:
        >>> warm = gradtx.schedules.linear(0.0, 1.0, 10)
        >>> sched = gradtx.schedules.join([warm, gradtx.schedules.constant(1.0)], [10])
        >>> sched(5), sched(50)
        (Array(0.5, dtype=float32), Array(1., dtype=float32))
    """
    if len(schedules) != len(boundaries) + 1:
        raise ValueError(
            f"join: {len(schedules)} schedules need {len(schedules) - 1} boundaries, "
            f"got {len(boundaries)}."
        )
    if list(boundaries) != sorted(boundaries):
        raise ValueError(f"join: boundaries must increase, got {list(boundaries)}.")
    return Join(tuple(as_schedule(s) for s in schedules), np.asarray(boundaries, np.int32))
