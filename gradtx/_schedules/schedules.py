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

from gradtx._core.module import Module, as_float, as_int, field, hyperparam, static

__all__ = [
    "Schedule",
    "constant",
    "cosine_decay",
    "cosine_onecycle",
    "exponential_decay",
    "join",
    "linear",
    "linear_onecycle",
    "piecewise_constant",
    "piecewise_interpolate",
    "polynomial",
    "sgdr",
    "warmup_constant",
    "warmup_cosine_decay",
    "warmup_exponential_decay",
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


# --- warm-up, piecewise interpolation, one-cycle and warm restarts ---------------------------


def _check_concrete_steps(value: Any, name: str, fn: str, minimum: int) -> None:
    if value is not None and not isinstance(value, jax.core.Tracer) and int(value) < minimum:
        what = "a positive" if minimum > 0 else "a non-negative"
        raise ValueError(f"{fn}: `{name}` must be {what} number of steps, got {int(value)}.")


class WarmupConstant(Schedule):
    """Linear warm-up from `init_value` to `peak_value`, then constant (see `warmup_constant`)."""

    init_value: Any = hyperparam()
    peak_value: Any = hyperparam()
    warmup_steps: Any = _steps()

    def __check__(self) -> None:
        _check_concrete_steps(self.warmup_steps, "warmup_steps", "warmup_constant", 0)

    def __call__(self, step: Any) -> jax.Array:
        """`init + (peak - init) * t / W` for `t < W`, `peak` from `W` on."""
        step = jnp.asarray(step)
        t = _f32(jnp.clip(step, 0, self.warmup_steps))
        warm = _f32(jnp.maximum(self.warmup_steps, 1))
        ramp = self.init_value + (self.peak_value - self.init_value) * (t / warm)
        return jnp.where(step < self.warmup_steps, ramp, self.peak_value)


_INTERPOLATIONS = ("linear", "cosine")


class PiecewiseInterpolate(Schedule):
    """Interpolation between `values[i]` at `boundaries[i-1]` (see `piecewise_interpolate`).

    `values[0]` is the value at step 0, `values[i]` the value at `boundaries[i-1]`; the last
    value holds from the last boundary on.
    """

    boundaries: Any = _steps()
    values: Any = hyperparam()
    interpolate_type: str = static("linear")

    def __check__(self) -> None:
        if self.interpolate_type not in _INTERPOLATIONS:
            raise ValueError(
                "piecewise_interpolate: `interpolate_type` must be 'linear' or 'cosine', got "
                f"{self.interpolate_type!r}."
            )
        n_bounds, n_values = jnp.shape(self.boundaries), jnp.shape(self.values)
        if len(n_bounds) != 1 or n_values != (n_bounds[0] + 1,):
            raise ValueError(
                "piecewise_interpolate: need one more value than boundaries (a 1-d array each), "
                f"got boundaries of shape {n_bounds} and values of shape {n_values}."
            )
        if not isinstance(self.boundaries, jax.core.Tracer):
            b = np.asarray(self.boundaries)
            if b.size and (b[0] < 0 or np.any(np.diff(b) <= 0)):
                raise ValueError(
                    "piecewise_interpolate: `boundaries` must be non-negative and strictly "
                    f"increasing, got {b.tolist()}."
                )

    def __call__(self, step: Any) -> jax.Array:
        """The interpolated value in the segment holding `step`; negative steps count as 0."""
        step = jnp.maximum(jnp.asarray(step), 0)
        if jnp.shape(self.boundaries)[-1] == 0:
            return jnp.broadcast_to(self.values[..., 0], step.shape)
        zero = jnp.zeros((1,), self.boundaries.dtype)
        bounds = jnp.concatenate([zero, self.boundaries])
        shape = (1,) * step.ndim + (-1,)
        lo = jnp.reshape(bounds[:-1], shape)
        hi = jnp.reshape(bounds[1:], shape)
        start = jnp.reshape(self.values[:-1], shape)
        end = jnp.reshape(self.values[1:], shape)
        s = step[..., None]
        size = jnp.maximum(hi - lo, 1)
        pct = _f32(jnp.clip(s - lo, 0, size)) / _f32(size)
        if self.interpolate_type == "cosine":
            pct = 0.5 * (1 - jnp.cos(math.pi * pct))
        # `start + (end - start) * pct` gives `start` exactly at the segment's first step.
        inside = (lo <= s) & (s < hi)
        within = jnp.sum(jnp.where(inside, start + (end - start) * pct, 0), axis=-1)
        return jnp.where(step >= self.boundaries[-1], self.values[-1], within)


def warmup_constant(init_value: float, peak_value: float, warmup_steps: int) -> WarmupConstant:
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
        decay_rate: the decay factor (below 1 decays, above 1 grows).
        transition_begin: steps after the warm-up before the decay starts.
        staircase: decay in whole steps of `transition_steps`.
        end_value: a bound the value never passes (a floor for decay, a ceiling for growth).

    Examples:
        >>> sched = gradtx.schedules.warmup_exponential_decay(0.0, 1.0, 10, 5, 0.5)
        >>> sched(5), sched(10), sched(20)
        (Array(0.5, dtype=float32), Array(1., dtype=float32), Array(0.25, dtype=float32))
    """
    fn = "warmup_exponential_decay"
    _check_concrete_steps(as_int(warmup_steps), "warmup_steps", fn, 0)
    _check_concrete_steps(as_int(transition_begin), "transition_begin", fn, 0)
    _check_concrete_steps(as_int(transition_steps), "transition_steps", fn, 1)
    decay = ExponentialDecay(
        peak_value, transition_steps, decay_rate, transition_begin, staircase, end_value
    )
    warmup = WarmupConstant(init_value, peak_value, warmup_steps)
    return Join((warmup, decay), jnp.reshape(as_int(warmup_steps), (1,)))


def piecewise_interpolate(
    interpolate_type: str,
    init_value: float,
    boundaries_and_scales: Mapping[int, float] | None = None,
) -> PiecewiseInterpolate:
    r"""Interpolate, linearly or along a half cosine, between accumulated scales.

    The value at step 0 is `init_value`; at each boundary $b_i$ it reaches
    $v_i = v_0 \prod_{j \le i} s_j$ and stays at the last $v_n$ after the last boundary. Between
    two boundaries the value moves from $v_{i-1}$ to $v_i$ linearly or as
    $v_{i-1} + (v_i - v_{i-1})\,\tfrac12(1 - \cos(\pi\tau))$, $\tau$ the fraction of the segment
    done (as optax's `piecewise_interpolate_schedule`).

    Args:
        interpolate_type: `"linear"` or `"cosine"`.
        init_value: the value at step 0.
        boundaries_and_scales: `{step: scale}` with non-negative steps and scales; the value
            reached at `step` is the previous one times `scale`.

    Examples:
        >>> sched = gradtx.schedules.piecewise_interpolate("linear", 1.0, {4: 0.5, 8: 0.0})
        >>> sched(0), sched(2), sched(4), sched(6), sched(100)
        (Array(1., dtype=float32), Array(0.75, dtype=float32), Array(0.5, dtype=float32), Array(0.25, dtype=float32), Array(0., dtype=float32))
    """  # noqa: E501
    fn = "piecewise_interpolate"
    if interpolate_type not in _INTERPOLATIONS:
        raise ValueError(
            f"{fn}: `interpolate_type` must be 'linear' or 'cosine', got {interpolate_type!r}."
        )
    items = sorted((boundaries_and_scales or {}).items())
    for boundary, scale in items:
        if int(boundary) < 0:
            raise ValueError(f"{fn}: `boundaries_and_scales` has a negative boundary {boundary}.")
        if not isinstance(scale, jax.core.Tracer) and float(scale) < 0:
            raise ValueError(
                f"{fn}: `boundaries_and_scales` has a negative scale {scale} at step {boundary}."
            )
    init = as_float(init_value, f"{fn}.init_value")
    factors = [as_float(s, f"{fn}.boundaries_and_scales") for _, s in items]
    values = [init]
    for factor in factors:
        values.append(values[-1] * factor)
    boundaries = np.asarray([int(b) for b, _ in items], np.int32)
    return PiecewiseInterpolate(boundaries, jnp.stack(values), interpolate_type)


def _onecycle_check(fn: str, transition_steps: int, **fractions: float) -> None:
    if isinstance(transition_steps, jax.core.Tracer) or int(transition_steps) <= 0:
        raise ValueError(
            f"{fn}: `transition_steps` must be a concrete positive number of steps, got "
            f"{transition_steps!r}."
        )
    for name, value in fractions.items():
        if not 0 <= float(value) < 1:
            raise ValueError(f"{fn}: `{name}` must be in [0, 1), got {value!r}.")


def linear_onecycle(
    transition_steps: int,
    peak_value: float,
    pct_start: float = 0.3,
    pct_final: float = 0.85,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> PiecewiseInterpolate:
    """The one-cycle schedule with three linear phases (Smith & Topin, 2017).

    With $v_0 = $ `peak_value / div_factor`: from step 0 to `int(pct_start * T)` the value rises
    linearly from $v_0$ to `peak_value`; until `int(pct_final * T)` it falls back to $v_0$;
    until `T` it falls to $v_0$ / `final_div_factor`, and stays there (as optax's
    `linear_onecycle_schedule`).

    Args:
        transition_steps: the length $T$ of the cycle (positive).
        peak_value: the value at the end of the rise.
        pct_start: fraction of $T$ spent rising, in `[0, 1)`.
        pct_final: fraction of $T$ at which the value is back at $v_0$, in
            `(pct_start, 1)`.
        div_factor: $v_0$ = `peak_value / div_factor`.
        final_div_factor: the final value is $v_0$ / `final_div_factor`.

    Examples:
        >>> sched = gradtx.schedules.linear_onecycle(100, 1.0, div_factor=10.0)
        >>> sched(0), sched(30), sched(85)
        (Array(0.1, dtype=float32), Array(1., dtype=float32), Array(0.1, dtype=float32))
    """
    fn = "linear_onecycle"
    _onecycle_check(fn, transition_steps, pct_start=pct_start, pct_final=pct_final)
    T = int(transition_steps)
    boundaries = (int(pct_start * T), int(pct_final * T), T)
    if not boundaries[0] < boundaries[1] < boundaries[2]:
        raise ValueError(
            f"{fn}: the phases end at steps {list(boundaries)}, which must strictly increase; "
            "need pct_start < pct_final and enough `transition_steps` to separate them."
        )
    peak = as_float(peak_value, f"{fn}.peak_value")
    low = peak / as_float(div_factor, f"{fn}.div_factor")
    final = low / as_float(final_div_factor, f"{fn}.final_div_factor")
    values = jnp.stack([low, peak, low, final])
    return PiecewiseInterpolate(np.asarray(boundaries, np.int32), values, "linear")


def cosine_onecycle(
    transition_steps: int,
    peak_value: float,
    pct_start: float = 0.3,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> PiecewiseInterpolate:
    """The one-cycle schedule with two cosine phases (Smith & Topin, 2017).

    With $v_0 = $ `peak_value / div_factor`: from step 0 to `int(pct_start * T)` the value rises
    along a half cosine from $v_0$ to `peak_value`, then falls along a half cosine to
    $v_0$ / `final_div_factor` at step `T` and stays there (as optax's
    `cosine_onecycle_schedule`).

    Args:
        transition_steps: the length $T$ of the cycle (positive).
        peak_value: the value at the end of the rise.
        pct_start: fraction of $T$ spent rising, in `[0, 1)`.
        div_factor: $v_0$ = `peak_value / div_factor`.
        final_div_factor: the final value is $v_0$ / `final_div_factor`.

    Examples:
        >>> sched = gradtx.schedules.cosine_onecycle(100, 1.0, div_factor=10.0)
        >>> sched(0), sched(30), sched(65)  # halfway down: (1 + 1e-5) / 2
        (Array(0.1, dtype=float32), Array(1., dtype=float32), Array(0.500005, dtype=float32))
    """
    fn = "cosine_onecycle"
    _onecycle_check(fn, transition_steps, pct_start=pct_start)
    T = int(transition_steps)
    boundaries = (int(pct_start * T), T)
    if not boundaries[0] < boundaries[1]:
        raise ValueError(
            f"{fn}: the rise ends at step {boundaries[0]}, not before `transition_steps`={T}."
        )
    peak = as_float(peak_value, f"{fn}.peak_value")
    low = peak / as_float(div_factor, f"{fn}.div_factor")
    final = low / as_float(final_div_factor, f"{fn}.final_div_factor")
    values = jnp.stack([low, peak, final])
    return PiecewiseInterpolate(np.asarray(boundaries, np.int32), values, "cosine")


_SGDR_KEYS = ("init_value", "peak_value", "warmup_steps", "decay_steps", "end_value", "exponent")


def sgdr(cosine_kwargs: Sequence[Mapping[str, Any]]) -> Join:
    """Stochastic gradient descent with warm restarts (Loshchilov & Hutter, 2017).

    Cycles of `warmup_cosine_decay(**kwargs)` run one after another; each lasts its
    `decay_steps` and restarts its step count at 0 (as optax's `sgdr_schedule`).

    Args:
        cosine_kwargs: one dict per cycle with the arguments of `warmup_cosine_decay`
            (`init_value`, `peak_value`, `warmup_steps`, `decay_steps`, and optionally
            `end_value`, `exponent`).

    Examples:
        >>> cycle = dict(init_value=0.0, peak_value=1.0, warmup_steps=2, decay_steps=10)
        >>> sched = gradtx.schedules.sgdr([cycle, cycle])
        >>> sched(2), sched(10), sched(12)
        (Array(1., dtype=float32), Array(0., dtype=float32), Array(1., dtype=float32))
    """
    cycles = list(cosine_kwargs)
    if not cycles:
        raise ValueError("sgdr: `cosine_kwargs` must hold at least one cycle.")
    parts, boundaries, total = [], [], 0
    for i, kwargs in enumerate(cycles):
        unknown = sorted(set(kwargs) - set(_SGDR_KEYS))
        missing = [k for k in _SGDR_KEYS[:4] if k not in kwargs]
        if unknown or missing:
            raise ValueError(
                f"sgdr: `cosine_kwargs[{i}]` must have the arguments of warmup_cosine_decay; "
                f"unknown: {unknown}, missing: {missing}."
            )
        parts.append(warmup_cosine_decay(**kwargs))
        total += int(kwargs["decay_steps"])
        boundaries.append(total)
    return Join(tuple(parts), np.asarray(boundaries[:-1], np.int32))
