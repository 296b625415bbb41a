"""Stateful schedules: a value that depends on a state kept in the optimizer state.

A plain schedule is a function of the step count. A stateful schedule also reads what the
training loop passes to `update` (`value=loss`, say) and keeps what it needs to remember (the
best loss so far, how long it has not improved) in a state of its own. It is an immutable
pytree like every schedule (its numbers are leaves, so a sweep never recompiles); its state
lives in the state of `gradtx.inject_hyperparams`, under the name of the hyperparameter it
drives, so `state_dict`, `save` and `restore` see it and a jitted step carries it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gradtx._core.module import Module, field, static
from gradtx._core.protocol import State
from gradtx._core.static_value import StaticValue
from gradtx._layouts.step_counts import next_count
from gradtx._schedules.base import as_f32, as_schedule


class StatefulSchedule(Module):
    """Base class: a schedule whose value depends on a state it keeps between steps.

    A subclass defines three methods (optax's `StatefulSchedule` protocol, with the value
    under a name of its own):

    - `init() -> state`: the initial state, a pytree of arrays;
    - `update(state, **extra) -> state`: the state after a step, given the extra arguments of
      that step's `update` call (`value=loss`, ...); same structure, shapes and dtypes;
    - `value(state, **extra) -> scalar`: the hyperparameter for a step taken in `state`.

    Give it to `gradtx.inject_hyperparams` in place of a number: each step evaluates
    `value(state, **extra)` with the step's extra arguments and runs the inner
    transformation with it, then advances the state with `update(state, **extra)`. The
    state is kept in the injected state under `schedule_states/<name>`, beside the
    hyperparameters, so `gradtx.state_dict`, `save` and `restore` carry it, `lax.scan` and
    `jit` carry it, and `gradtx.hyperparams` reads the value the last step used. At `init`
    (no step taken, no extra arguments) the stored value is `value(init())`.

    A stateful schedule is a pytree: declare its numbers as fields, and a jitted step taking
    the transformation as an argument does not recompile for new values. `update` and `value`
    must be traceable (`jnp.where`, not `if`). optax's own stateful schedules
    (`optax.schedules.StatefulSchedule` subclasses) work too, kept as static structure.

    Examples:
        >>> class HalveOnIncrease(gradtx.schedules.StatefulSchedule):
        ...     init_value: float
        ...     def init(self):
        ...         return {"scale": jnp.ones(()), "last": jnp.full((), jnp.inf)}
        ...     def update(self, state, *, value, **extra):  # value: this step's loss
        ...         up = value > state["last"]
        ...         scale = jnp.where(up, state["scale"] / 2, state["scale"])
        ...         return {"scale": scale, "last": jnp.asarray(value, jnp.float32)}
        ...     def value(self, state, **extra):
        ...         return self.init_value * state["scale"]
        >>> tx = gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=HalveOnIncrease(0.1))
        >>> params = {"w": jnp.ones(2)}
        >>> state = tx.init(params)
        >>> for loss in [3.0, 2.0, 2.5, 2.4]:  # the loss went up at the third step
        ...     _, state = tx.update({"w": jnp.ones(2)}, state, params, value=loss)
        >>> float(gradtx.hyperparams(state)["learning_rate"])  # the fourth step's
        0.05000000074505806
        >>> [key for key in gradtx.state_dict(state) if key.startswith("schedule_states/")]
        ['schedule_states/learning_rate/last', 'schedule_states/learning_rate/scale']
    """

    def init(self) -> Any:
        """The initial state: a pytree of arrays."""
        raise TypeError(f"{type(self).__name__} does not define init")

    def update(self, state: State, **extra: Any) -> Any:
        """The state after one step, given that step's extra arguments."""
        raise TypeError(f"{type(self).__name__} does not define update")

    def value(self, state: State, **extra: Any) -> jax.Array:
        """The value for a step taken in `state` (a real scalar)."""
        raise TypeError(f"{type(self).__name__} does not define value")

    def __call__(self, *args: Any, **kwargs: Any) -> jax.Array:
        """Refused: a stateful schedule is no function of the step alone."""
        raise TypeError(
            f"{type(self).__name__} is a stateful schedule: it keeps a state between steps, "
            "which only `gradtx.inject_hyperparams` holds. Inject the hyperparameter, for "
            "example `gradtx.inject_hyperparams(gradtx.adam)(learning_rate=schedule)`, or "
            "evaluate it as `schedule.value(state)`."
        )


class WrappedSchedule(StatefulSchedule):
    """A plain schedule as a stateful one whose state is its own step count.

    optax's `WrappedSchedule`. `gradtx.inject_hyperparams` takes plain schedules as they
    are, so this is needed only where a stateful schedule is expected: to combine a
    schedule of the step with a stateful one (a stateful schedule built on another one), or
    to keep a schedule's own count apart from the transformation's. The count starts at 0,
    advances by one per `update` (saturating at the int32 maximum) and the value is
    `schedule(count)`.

    Attributes:
        schedule: a gradtx schedule, a function of the step, or a number (a constant).

    State:
        `count`: an int32 scalar, the number of steps taken.

    Examples:
        >>> wrapped = gradtx.schedules.WrappedSchedule(gradtx.schedules.linear(1.0, 0.0, 10))
        >>> state = wrapped.update(wrapped.update(wrapped.init()))
        >>> state, wrapped.value(state)
        (Array(2, dtype=int32), Array(0.8, dtype=float32))
    """

    schedule: Any = field(converter=lambda value, name: as_schedule(value))

    def init(self) -> jax.Array:
        """Count 0."""
        return jnp.zeros((), jnp.int32)

    def update(self, state: jax.Array, **extra: Any) -> jax.Array:
        """One more step."""
        return next_count(jnp.asarray(state, jnp.int32))

    def value(self, state: jax.Array, **extra: Any) -> jax.Array:
        """`schedule(count)`, float32."""
        return as_f32(self.schedule(state))


class ForeignStatefulSchedule(StatefulSchedule):
    """An optax stateful schedule (`init`, `update`, `__call__(state)`), kept static."""

    wrapped: StaticValue = static()

    def init(self) -> Any:
        """The wrapped `init()`."""
        return self.wrapped.value.init()

    def update(self, state: State, **extra: Any) -> Any:
        """The wrapped `update(state, **extra)`."""
        return self.wrapped.value.update(state, **extra)

    def value(self, state: State, **extra: Any) -> jax.Array:
        """The wrapped `__call__(state, **extra)`."""
        return self.wrapped.value(state, **extra)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.wrapped!r})"


def _is_optax_stateful(value: Any) -> bool:
    # optax's base class, recognised by name so that gradtx need not import optax.
    return (
        not isinstance(value, Module)
        and any(c.__name__ == "StatefulSchedule" for c in type(value).__mro__)
        and callable(getattr(value, "init", None))
        and callable(getattr(value, "update", None))
    )


def is_stateful_schedule(value: Any) -> bool:
    """True for a gradtx `StatefulSchedule` or an optax `StatefulSchedule`."""
    return isinstance(value, StatefulSchedule) or _is_optax_stateful(value)


def as_stateful_schedule(value: Any) -> StatefulSchedule:
    """A gradtx `StatefulSchedule` from one, or from an optax stateful schedule."""
    if isinstance(value, StatefulSchedule):
        return value
    return ForeignStatefulSchedule(StaticValue(value))


def _kind(schedule: StatefulSchedule) -> str:
    """The schedule's class name for messages (an optax schedule's own, not its wrapper's)."""
    if isinstance(schedule, ForeignStatefulSchedule):
        return type(schedule.wrapped.value).__name__
    return type(schedule).__name__


def _signature(x: Any) -> tuple[tuple[int, ...], Any]:
    return tuple(np.shape(x)), jnp.result_type(x)


def _describe(tree: Any) -> str:
    return str(jax.tree.map(lambda x: f"{jnp.result_type(x)}{list(np.shape(x))}", tree))


def _own_arrays(tree: Any, template: Any = None) -> Any:
    """`tree`'s leaves as arrays (in `template`'s dtypes), without weak types."""
    if template is None:
        return jax.tree.map(lambda x: jnp.asarray(x, jnp.result_type(x)), tree)
    return jax.tree.map(lambda x, t: jnp.asarray(x, jnp.result_type(t)), tree, template)


def value_at(
    owner: str, name: str, schedule: StatefulSchedule, state: State, extra: dict[str, Any]
) -> jax.Array:
    """`schedule.value(state, **extra)`, checked to be a real scalar."""
    out = jnp.asarray(schedule.value(state, **extra))
    real = jnp.issubdtype(out.dtype, np.floating) or jnp.issubdtype(out.dtype, np.integer)
    if out.shape != () or not real:
        raise TypeError(
            f"{owner}: the stateful schedule given as `{name}` ({_kind(schedule)}) must "
            f"return a real number from `value` (shape ()), got shape {out.shape}, dtype "
            f"{out.dtype}."
        )
    return out


def start(owner: str, name: str, schedule: StatefulSchedule) -> Any:
    """`schedule.init()` as arrays, checked: `value` of it must be a real scalar."""
    try:
        state = _own_arrays(schedule.init())
    except TypeError as e:
        raise TypeError(
            f"{owner}: the stateful schedule given as `{name}` ({_kind(schedule)}) "
            f"failed in `init()`: {e}"
        ) from e
    value_at(owner, name, schedule, state, {})
    return state


def advance(
    owner: str, name: str, schedule: StatefulSchedule, state: State, extra: dict[str, Any]
) -> Any:
    """`schedule.update(state, **extra)`, checked to keep the state's structure and dtypes."""
    new = schedule.update(state, **extra)
    old_def, new_def = jax.tree.structure(state), jax.tree.structure(new)
    same = old_def == new_def and all(
        _signature(a) == _signature(b) for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(new))
    )
    if not same:
        raise TypeError(
            f"{owner}: the stateful schedule given as `{name}` ({_kind(schedule)}) "
            f"returned from `update` a state unlike the one it was given: {_describe(state)} "
            f"became {_describe(new)}. `update` must keep the structure, shapes and dtypes of "
            "`init()`'s state (cast with `.astype`), so that the step compiles once and runs "
            "under `lax.scan`."
        )
    return _own_arrays(new, state)
