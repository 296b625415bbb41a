"""Decaying schedules: polynomial (linear), cosine, exponential and piecewise."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from gradtx._core.module import as_float, as_floats, field, hyperparam, static
from gradtx._schedules.base import Schedule, as_f32, check_concrete_steps, steps_field, steps_vector


class Polynomial(Schedule):
    """Polynomial interpolation from `init_value` to `end_value` (see `polynomial`)."""

    init_value: Any = hyperparam()
    end_value: Any = hyperparam()
    power: Any = hyperparam()
    transition_steps: Any = steps_field(length=True)
    transition_begin: Any = steps_field(0)

    def __check__(self) -> None:
        check_concrete_steps(self.transition_steps, "transition_steps", "polynomial", 1)

    def __call__(self, step: Any) -> jax.Array:
        """`(init - end) * (1 - t/T)**power + end`, `t` clipped to `[0, T]`."""
        length = as_f32(self.transition_steps)
        t = jnp.clip(as_f32(jnp.asarray(step) - self.transition_begin), 0, length)
        frac = 1 - t / length
        return (self.init_value - self.end_value) * frac**self.power + self.end_value


class CosineDecay(Schedule):
    """Cosine decay from `init_value` to `alpha * init_value` (see `cosine_decay`)."""

    init_value: Any = hyperparam()
    decay_steps: Any = steps_field(length=True)
    alpha: Any = hyperparam(0.0)
    exponent: Any = hyperparam(1.0)

    def __check__(self) -> None:
        check_concrete_steps(self.decay_steps, "decay_steps", "cosine_decay", 1)

    def __call__(self, step: Any) -> jax.Array:
        """`init * ((1 - alpha) * c**exponent + alpha)`, `c = (1 + cos(pi t / T)) / 2`."""
        length = as_f32(self.decay_steps)
        t = jnp.clip(as_f32(step), 0, length)
        cosine = 0.5 * (1 + jnp.cos(math.pi * t / length))
        return self.init_value * ((1 - self.alpha) * cosine**self.exponent + self.alpha)


def _decay_factor(value: float) -> str | None:
    """An exponential schedule's factor per `transition_steps`: positive."""
    if value > 0:
        return None
    if value < 0:
        return "must be > 0 (a negative factor to a fractional power is NaN)"
    return (
        "must be > 0: with 0 the value drops to 0 right after `transition_begin`. For a "
        "constant (what optax's exponential_decay gives for a zero rate) use "
        "`schedules.constant(init_value)`; for a drop to 0 at a step use "
        "`schedules.piecewise_constant(init_value, {step: 0.0})`"
    )


class ExponentialDecay(Schedule):
    """`init * rate**((t - begin) / T)` (see `exponential_decay`)."""

    init_value: Any = hyperparam()
    transition_steps: Any = steps_field(length=True)
    decay_rate: Any = hyperparam(check=_decay_factor)
    transition_begin: Any = steps_field(0)
    staircase: bool = static(False)
    end_value: Any = hyperparam(None)

    def __check__(self) -> None:
        check_concrete_steps(self.transition_steps, "transition_steps", "exponential_decay", 1)

    def __call__(self, step: Any) -> jax.Array:
        """The decayed value, held at `init_value` before `transition_begin`."""
        t = jnp.asarray(step) - self.transition_begin
        p = as_f32(t) / as_f32(self.transition_steps)
        if self.staircase:
            p = jnp.floor(p)
        value = jnp.where(t <= 0, self.init_value, self.init_value * self.decay_rate**p)
        end = self.end_value
        if end is not None:
            value = jnp.where(self.decay_rate < 1, jnp.maximum(value, end), jnp.minimum(value, end))
        return value


class PiecewiseConstant(Schedule):
    """`init_value` times every scale whose boundary has been reached."""

    init_value: Any = hyperparam()
    boundaries: Any = steps_vector()
    scales: Any = field(converter=as_floats)

    def __call__(self, step: Any) -> jax.Array:
        """`init * prod(scales[b] for b in boundaries if step >= b)`."""
        step = jnp.asarray(step)
        bounds = jnp.asarray(self.boundaries, jnp.int32)
        boundaries = jnp.reshape(bounds, (1,) * step.ndim + (-1,))
        reached = step[..., None] >= boundaries
        factors = jnp.where(reached, jnp.asarray(self.scales, jnp.float32), jnp.float32(1))
        return self.init_value * jnp.prod(factors, axis=-1)


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
        decay_rate: the factor $r > 0$ (below 1 decays, above 1 grows). 0 is refused: it
            would drop to 0 after the first step; use `constant` or `piecewise_constant`.
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


class PiecewiseInterpolate(Schedule):
    """Interpolation between `values[i]` at `boundaries[i-1]` (see `piecewise_interpolate`).

    `values[0]` is the value at step 0, `values[i]` the value at `boundaries[i-1]`; the last
    value holds from the last boundary on.
    """

    boundaries: Any = steps_vector()
    values: Any = field(converter=as_floats)
    interpolate_type: str = static("linear")

    def __check__(self) -> None:
        if self.interpolate_type not in ("linear", "cosine"):
            raise ValueError(
                "piecewise_interpolate: `interpolate_type` must be 'linear' or 'cosine', got "
                f"{self.interpolate_type!r}."
            )
        n_bounds, n_values = np.shape(self.boundaries), np.shape(self.values)
        if len(n_bounds) != 1 or n_values != (n_bounds[0] + 1,):
            raise ValueError(
                "piecewise_interpolate: need one more value than boundaries (a 1-d array each), "
                f"got boundaries of shape {n_bounds} and values of shape {n_values}."
            )
        if not isinstance(self.boundaries, Tracer):
            b = np.asarray(self.boundaries)
            if b.size and (b[0] < 0 or np.any(np.diff(b) <= 0)):
                raise ValueError(
                    "piecewise_interpolate: `boundaries` must be non-negative and strictly "
                    f"increasing, got {b.tolist()}."
                )

    def __call__(self, step: Any) -> jax.Array:
        """The interpolated value in the segment holding `step`; negative steps count as 0."""
        step = jnp.maximum(jnp.asarray(step), 0)
        boundaries = jnp.asarray(self.boundaries, jnp.int32)
        values = jnp.asarray(self.values, jnp.float32)
        if jnp.shape(boundaries)[-1] == 0:
            return jnp.broadcast_to(values[..., 0], step.shape)
        bounds = jnp.concatenate([jnp.zeros((1,), boundaries.dtype), boundaries])
        # Each segment's first and last step and values, along a last axis after `step`'s.
        ends = (bounds[:-1], bounds[1:], values[:-1], values[1:])
        lo, hi, start, end = (jnp.reshape(x, (1,) * step.ndim + (-1,)) for x in ends)
        s = step[..., None]
        size = jnp.maximum(hi - lo, 1)
        pct = as_f32(jnp.clip(s - lo, 0, size)) / as_f32(size)
        if self.interpolate_type == "cosine":
            pct = 0.5 * (1 - jnp.cos(math.pi * pct))
        # `start + (end - start) * pct` gives `start` exactly at the segment's first step.
        inside = (lo <= s) & (s < hi)
        within = jnp.sum(jnp.where(inside, start + (end - start) * pct, 0), axis=-1)
        return jnp.where(step >= boundaries[-1], values[-1], within)


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
    fn = "piecewise_interpolate"  # `PiecewiseInterpolate` checks `interpolate_type`
    items = sorted((boundaries_and_scales or {}).items())
    for boundary, scale in items:
        if int(boundary) < 0:
            raise ValueError(f"{fn}: `boundaries_and_scales` has a negative boundary {boundary}.")
        if not isinstance(scale, Tracer) and float(scale) < 0:
            raise ValueError(
                f"{fn}: `boundaries_and_scales` has a negative scale {scale} at step {boundary}."
            )
    init = as_float(init_value, f"{fn}.init_value")
    factors = [as_float(s, f"{fn}.boundaries_and_scales") for _, s in items]
    values = itertools.accumulate(factors, lambda value, factor: value * factor, initial=init)
    boundaries = np.asarray([int(b) for b, _ in items], np.int32)
    return PiecewiseInterpolate(boundaries, tuple(values), interpolate_type)
