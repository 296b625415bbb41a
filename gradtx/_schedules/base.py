"""The schedule protocol, its argument checks, and the schedules others build on: constant, join.

Numeric arguments are leaves (values float32, step counts int32), so a sweep over peak
learning rates or warm-up lengths never recompiles. Any plain function `step -> value` works
wherever a schedule does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from gradtx._core.module import Module, as_int, as_ints, field, hyperparam, static


def steps_field(default: Any = dataclasses.MISSING, *, length: bool = False) -> Any:
    """A step-valued field (int32); a `length` of steps may exceed int32 (see `as_length`)."""
    return field(default=default, converter=as_length if length else as_int)


def as_length(value: Any, name: str = "value") -> Any:
    """A number of steps: int32, or float32 beyond int32's range.

    The step count is int32, so such a length is never reached, but the schedule is well
    defined: `cosine_decay(1000.0, decay_steps=1e10)` decays by a tiny amount per step, as the
    user asked. The schedule's arithmetic runs in float32 either way.
    """
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        if abs(float(value)) > np.iinfo(np.int32).max:
            return np.float32(value)
    return as_int(value, name)


def as_f32(x: Any) -> jax.Array:
    return jnp.asarray(x).astype(jnp.float32)


def check_concrete_steps(value: Any, name: str, fn: str, minimum: int) -> None:
    """Raise unless a known `value` is at least `minimum` steps (a traced one is not known)."""
    if value is not None and not isinstance(value, Tracer) and int(value) < minimum:
        what = "a positive" if minimum > 0 else "a non-negative"
        raise ValueError(f"{fn}: `{name}` must be {what} number of steps, got {int(value)}.")


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
        return as_f32(self.fn(step))


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


def steps_vector() -> Any:
    """Boundaries: int32 step counts, a tuple of NumPy scalars when given as numbers."""
    return field(converter=as_ints)


class Join(Schedule):
    """Schedules run one after another; each restarts its step count at its boundary."""

    schedules: tuple
    boundaries: Any = steps_vector()

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
