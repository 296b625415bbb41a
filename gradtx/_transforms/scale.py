"""Scaling: identity, set_to_zero, scale, learning rates and schedules; `scale_gradient`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from gradtx._core.lift import cast, compute_dtype
from gradtx._core.module import Module, as_float, hyperparam, is_schedule, static
from gradtx._core.per_array import PerArrayTransform, hyperparam_at
from gradtx._core.protocol import Params, Updates
from gradtx._core.statistics import KeepsStatistics, statistics
from gradtx._layouts.step_counts import next_count

ScalarOrSchedule = float | jnp.ndarray | Module | Callable[[Any], Any]


def scaled(g: Any, factor: Any) -> Any:
    dtype = compute_dtype(g)
    g_, f = cast(g, dtype), cast(factor, dtype)
    # `lax.mul` binds what `*` would (a scalar needs no broadcast) without tracing a jitted
    # `jnp.multiply` for every leaf, which shortens tracing (benchmarks/compile_time.py).
    product = lax.mul(g_, f) if f.ndim == 0 or f.shape == g_.shape else g_ * f
    return cast(product, g.dtype)


class Identity(PerArrayTransform):
    """Returns the updates unchanged (see `identity`)."""

    name: ClassVar[str] = "identity"

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Return `updates` and `state` as they are."""
        return updates, state


class SetToZero(PerArrayTransform):
    """Replaces every present update by zeros (see `set_to_zero`)."""

    name: ClassVar[str] = "set_to_zero"

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Zeros of the update's shape and dtype."""
        return jnp.zeros_like(g), {}


class Scale(PerArrayTransform):
    """Multiplies updates by a constant (see `scale`)."""

    name: ClassVar[str] = "scale"
    step_size: Any = hyperparam()

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = step_size * g`."""
        return scaled(g, self.step_size), {}


def scheduled_value(value: Any, slots: dict) -> tuple[Any, dict]:
    """`value` at the path's step, and its advanced `schedule_count` slot if it is a schedule.

    The schedule reads the new count less one (the old count, short of saturation), so the
    donated count has one reader: XLA then writes it in place without copying it first.
    """
    if not is_schedule(value):
        return value, {}
    count = next_count(slots["schedule_count"])
    return hyperparam_at(value, count - 1), {"schedule_count": count}


class RecordsScheduledValue(PerArrayTransform, KeepsStatistics):
    """A scheduled factor that also keeps its value at the last step, for `gradtx.stats`.

    With a schedule, the state holds the per-path `schedule_count` slot and `scheduled`, a
    statistics dict with the schedule's value at the last step of the paths that have taken the
    most steps (all paths, unless updates were partial); before the first step, the value at
    step 0. `gradtx.stats` reads it as `scheduled/learning_rate`. Subclasses declare the
    static field `keep_statistics`; without statistics, `scheduled` is left out.
    """

    recorded: ClassVar[str]  # the statistic's name
    schedule_field: ClassVar[str]  # the field holding the schedule

    def _schedule(self) -> Any:
        return getattr(self, self.schedule_field)

    def slot_keys(self) -> tuple[str, ...]:
        """`schedule_count` when scheduled."""
        return ("schedule_count",) if is_schedule(self._schedule()) else ()

    def state_keys(self) -> tuple[str, ...]:
        """`schedule_count` and `scheduled` when scheduled, else nothing."""
        recorded = self.slot_keys() and self.keep_statistics
        return self.slot_keys() + (("scheduled",) if recorded else ())

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A zero step count when scheduled."""
        return {"schedule_count": jnp.zeros((), jnp.int32)} if self.slot_keys() else {}

    def init_state(self, params: Params) -> dict:
        """The count slots, and the schedule's value at step 0."""
        state = super().init_state(params)
        if "scheduled" not in self.state_keys():
            return state
        zero = jnp.zeros((), jnp.int32)
        return {**state, "scheduled": statistics({self.recorded: self._value_at(zero)})}

    def without_statistics(self) -> Any:
        """Without the recorded value; a constant factor records none and stays as it is."""
        return super().without_statistics() if self.slot_keys() else self

    def _value_at(self, step: Any) -> Any:
        return jnp.asarray(hyperparam_at(self._schedule(), step), jnp.float32)

    def step(
        self, updates: Updates, state: dict, params: Params = None, **extra: Any
    ) -> tuple[Any, dict]:
        """The scaled updates; the value is recorded from the counts just advanced."""
        self.check_state(state)
        slots = {k: state[k] for k in self.slot_keys()}
        new_updates, new = self.transform_slots(updates, slots, params)
        if "scheduled" not in self.state_keys():
            return new_updates, new
        counts = jax.tree.leaves(new["schedule_count"])
        recorded = state["scheduled"]
        if counts:  # the most advanced paths' last step (one count while all step together)
            last = counts[0] if len(counts) == 1 else jnp.max(jnp.stack(counts))
            recorded = statistics({self.recorded: self._value_at(last - 1)})
        return new_updates, {**new, "scheduled": recorded}


class ScaleBySchedule(RecordsScheduledValue):
    """Multiplies updates by `schedule(count)`, one count per path (see `scale_by_schedule`)."""

    recorded: ClassVar[str] = "step_size"
    schedule_field: ClassVar[str] = "step_size_fn"

    name: ClassVar[str] = "scale_by_schedule"
    step_size_fn: Any = hyperparam()
    keep_statistics: bool = static(True)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = schedule(count) * g`, then `count += 1`."""
        factor, changed = scheduled_value(self.step_size_fn, slots)
        return scaled(g, factor), changed


class ScaleByLearningRate(RecordsScheduledValue):
    """`-learning_rate * g`, the learning rate a constant or a schedule."""

    recorded: ClassVar[str] = "learning_rate"
    schedule_field: ClassVar[str] = "learning_rate"

    name: ClassVar[str] = "scale_by_learning_rate"
    learning_rate: Any = hyperparam(required=True)
    flip_sign: bool = static(True)
    keep_statistics: bool = static(True)

    def step(
        self, updates: Updates, state: dict, params: Params = None, **extra: Any
    ) -> tuple[Any, dict]:
        """`-lr * g` for every present path (`+lr * g` with `flip_sign=False`)."""
        if self.flip_sign and not self.state_keys():
            # A constant rate is negated once for the tree, not traced again for every leaf.
            unsigned = self.replace(learning_rate=-self.learning_rate, flip_sign=False)
            return unsigned.step(updates, state, params, **extra)
        return super().step(updates, state, params, **extra)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = -lr * g` (or `+lr * g` with `flip_sign=False`)."""
        rate, changed = scheduled_value(self.learning_rate, slots)
        return scaled(g, -rate if self.flip_sign else rate), changed


def identity() -> Identity:
    """A transformation that returns the updates unchanged and keeps no state.

    Returns:
        A stateless transformation; `update` returns its input `updates` as is.

    Examples:
        >>> tx = gradtx.identity()
        >>> tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))[0]["w"]
        Array([1., 1.], dtype=float32)
    """
    return Identity()


def set_to_zero() -> SetToZero:
    """Replace every update by zeros (used to freeze parameters inside `partition`).

    `None` leaves stay `None`; each zero array has the update's shape and dtype.

    Examples:
        >>> tx = gradtx.set_to_zero()
        >>> tx.update({"w": jnp.ones(2)}, {})[0]["w"]
        Array([0., 0.], dtype=float32)
    """
    return SetToZero()


def scale(step_size: float | jnp.ndarray) -> Scale:
    """Multiply every update by `step_size`: `u = step_size * g`.

    Args:
        step_size: a number (stored as a float32 leaf, so a new value never recompiles).

    Examples:
        >>> tx = gradtx.scale(0.5)
        >>> tx.update({"w": jnp.ones(2)}, {})[0]["w"]
        Array([0.5, 0.5], dtype=float32)
    """
    return Scale(step_size)


def scale_by_schedule(step_size_fn: Module | Callable[[Any], Any]) -> ScaleBySchedule:
    """Multiply updates by `step_size_fn(count)`, where `count` is the path's update count.

    Each path keeps its own `schedule_count` slot, so a path that receives no gradient at a step
    does not advance its schedule.

    Args:
        step_size_fn: a `gradtx.schedules` schedule or any function `step -> value`.

    Examples:
        >>> tx = gradtx.scale_by_schedule(gradtx.schedules.linear(1.0, 0.0, 10))
        >>> state = tx.init({"w": jnp.ones(2)})
        >>> state["schedule_count"]["w"]
        Array(0, dtype=int32)
    """
    if not is_schedule(step_size_fn):
        raise TypeError(
            "scale_by_schedule: `step_size_fn` must be a schedule or a function of the step, "
            f"got {step_size_fn!r}; for a constant, use gradtx.scale."
        )
    return ScaleBySchedule(step_size_fn)


def scale_by_learning_rate(
    learning_rate: ScalarOrSchedule, *, flip_sign: bool = True
) -> ScaleByLearningRate:
    """Scale updates by the learning rate, negated for descent: `u = -learning_rate * g`.

    Args:
        learning_rate: a number or a schedule (then each path counts its own steps in a
            `schedule_count` slot).
        flip_sign: negate (gradient descent). `False` gives `u = learning_rate * g`.

    Examples:
        >>> tx = gradtx.scale_by_learning_rate(0.1)
        >>> tx.update({"w": jnp.ones(2)}, {})[0]["w"]
        Array([-0.1, -0.1], dtype=float32)
    """
    return ScaleByLearningRate(learning_rate, flip_sign)


@jax.custom_vjp
def _scale_in_backward(x: Any, factor: Any) -> Any:
    return x


def _forward(x: Any, factor: Any) -> tuple[Any, Any]:
    return x, factor


def _backward(factor: Any, cotangent: Any) -> tuple[Any, Any]:
    scaled = cotangent.astype(compute_dtype(cotangent)) * factor
    return scaled.astype(cotangent.dtype), jnp.zeros_like(factor)


_scale_in_backward.defvjp(_forward, _backward)


def scale_gradient(inputs: Any, scale: float | jax.Array) -> Any:
    r"""Return `inputs` unchanged, but scale the gradient that flows back through them.

    The forward value is exactly `inputs`; in the backward pass the cotangent of every
    floating-point leaf is multiplied by `scale`: $\partial L/\partial x \to s\,\partial
    L/\partial x$. `scale=0` acts like `jax.lax.stop_gradient`. This is a function applied
    inside the model or loss, not a transformation.

    Args:
        inputs: an array or a pytree of arrays.
        scale: the factor (a number or a float32 scalar array; no gradient flows into it).

    Examples:
        >>> f = lambda x: jnp.sum(gradtx.scale_gradient(x, 0.5) ** 2)
        >>> jax.grad(f)(jnp.array([1.0, 2.0]))
        Array([1., 2.], dtype=float32)
    """
    factor = as_float(scale, "scale")

    def leaf(x: Any) -> Any:
        if x is None or not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
            return x
        return _scale_in_backward(x, factor)

    return jax.tree.map(leaf, inputs)
