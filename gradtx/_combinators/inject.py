"""`inject_hyperparams`: numeric hyperparameters in the state, readable and settable by name."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import re
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from gradtx._combinators.without_statistics import without_statistics
from gradtx._combinators.wrapper import Labelled
from gradtx._core.module import Module, as_float, field, static
from gradtx._core.protocol import Params, Transformation, Updates
from gradtx._core.static_value import StaticValue
from gradtx._core.statistics import KeepsStatistics
from gradtx._layouts.step_counts import next_count
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.selectors import Selector
from gradtx._schedules.base import FunctionSchedule, Schedule
from gradtx._schedules.stateful import (
    StatefulSchedule,
    advance,
    as_stateful_schedule,
    is_stateful_schedule,
    start,
    value_at,
)

# A function passed under one of these names is structure (a mask, a label function), never
# a schedule, whatever the factory's defaults say.
_STRUCTURAL_NAME = re.compile(r"mask|where|label|select|_fn$|^fn$|filter|partition")


@dataclasses.dataclass(frozen=True)
class HyperparamCheck:
    """The factory's own argument checks, for a value `gradtx.set_hyperparams` puts in a state.

    Static structure of `InjectState`: equal for equal transformations, so a state holding it
    compiles once.
    """

    factory: Callable
    static_kwargs: tuple
    label: str

    def __call__(self, name: str, value: Any, others: dict[str, Any]) -> None:
        """Build the factory with `name=value`; raise what its checks raise.

        The other hyperparameters are traced, so only `value` is checked; a factory that
        needs their values (a Python `if` on one) is built with `others` as they are.
        """
        static_kwargs = {n: s.value for n, s in self.static_kwargs}

        def build(rest: dict[str, Any]) -> None:
            self.factory(**rest, **{name: value}, **static_kwargs)

        try:  # on the shapes and dtypes of `others`, not their values
            jax.eval_shape(build, others)
        except jax.errors.JAXTypeError:  # the factory reads another value: give it
            build(others)

    def __reduce__(self) -> tuple:
        # A state pickles as it did before it held the check: with a factory that cannot be
        # pickled (a local function), the copy has no check, and set_hyperparams skips it.
        try:
            pickle.dumps((self.factory, self.static_kwargs))
        except (pickle.PicklingError, AttributeError, TypeError):
            return (_no_check, ())
        return (HyperparamCheck, (self.factory, self.static_kwargs, self.label))


def _no_check() -> None:
    return None


class InjectState(Module):
    """State of `inject_hyperparams`.

    Holds the step `count`, the `hyperparams` used at the last step (`{name: value}`, in the
    hyperparameter dtype), the `inner` state and, when some hyperparameters follow stateful
    schedules, their states (`schedule_states`, `{name: state}`; None otherwise). Its static
    `check` validates a value `gradtx.set_hyperparams` puts in.
    """

    count: Any = None
    hyperparams: dict = None  # type: ignore[assignment]
    inner: Any = None
    scheduled: tuple = static(())  # names that follow a schedule (set_hyperparams refuses them)
    schedule_states: dict | None = None
    check: HyperparamCheck | None = field(static=True, default=None, repr=False)


def _is_number(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (int, float, np.integer, np.floating)):
        return True
    if isinstance(value, (jax.Array, np.ndarray)):
        # jax's issubdtype knows ml_dtypes (bfloat16 is a number) and typed PRNG keys (not);
        # a uint32 array is a raw PRNG key (`jax.random.PRNGKey`): data, not a hyperparameter.
        dtype = value.dtype
        if jnp.issubdtype(dtype, np.unsignedinteger):
            return False
        return jnp.issubdtype(dtype, np.number) and not jnp.issubdtype(dtype, np.complexfloating)
    return False


def _is_plain_function(value: Any) -> bool:
    return callable(value) and not isinstance(value, (Module, type, Selector))


def _is_hyperparameter(name: str, value: Any, default: Any) -> bool:
    """Numbers and schedules are hyperparameters; masks, selectors, dtypes, flags are not.

    A plain function is a schedule only when passed for a numeric argument (one with a
    numeric default, or a required one) whose name is not that of a mask or label argument.
    A Python int given for an argument whose default is an int (a period, a count of steps)
    stays static.
    """
    if isinstance(value, Schedule) or is_stateful_schedule(value):
        return True
    numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
    if _is_number(value):
        return not (isinstance(value, (int, np.integer)) and isinstance(default, int) and numeric)
    if _is_plain_function(value):
        required = default is inspect.Parameter.empty
        return (required or numeric) and not _STRUCTURAL_NAME.search(name)
    return False


class InjectHyperparams(Labelled, Transformation, KeepsStatistics):
    """A transformation rebuilt every step from hyperparameters kept in its state.

    Without statistics (`keep_statistics=False`), the inner transformation is built without
    them (`gradtx.without_statistics`); the hyperparameters stay in the state.
    """

    factory: Callable = static(None)
    hparams: dict = None  # type: ignore[assignment]  # name -> float32 value or a schedule
    static_kwargs: tuple = static(())  # ((name, StaticValue), ...)
    dtype: Any = static(None)
    label: str = static("inject_hyperparams")
    keep_statistics: bool = static(True)

    def _owner(self) -> str:
        return f"inject_hyperparams({self.label})"

    def _stateful(self) -> dict[str, StatefulSchedule]:
        return {n: v for n, v in self.hparams.items() if isinstance(v, StatefulSchedule)}

    def _values(
        self,
        count: Any,
        stored: dict | None,
        states: dict | None = None,
        extra: Any = None,
        cast: bool = True,
    ) -> dict[str, Any]:
        """Each hyperparameter for a step at `count` (stateful schedules: in `states`).

        Each must be a scalar (checked on shapes, at trace time): an array would broadcast
        against the parameters' last axis. Under `jax.vmap` over stacked transformations,
        each is one. They are in the hyperparameter dtype, or with `cast=False` as given.
        """
        values = {}
        for name, value in self.hparams.items():
            what = f"the hyperparameter {name!r} has"
            if isinstance(value, Schedule):
                value = jnp.asarray(value(count))
                if value.shape != ():
                    raise TypeError(
                        f"{self._owner()}: the schedule given as `{name}` must return a real "
                        f"number per step (shape ()), got shape {value.shape}; an array would "
                        "broadcast against each parameter's last axis."
                    )
            elif isinstance(value, StatefulSchedule):
                own = states[name] if states is not None else start(self._owner(), name, value)
                value = value_at(self._owner(), name, value, own, extra or {})
            elif stored is not None:
                value, what = stored[name], f"the hyperparameter {name!r} in the state has"
            value = jnp.asarray(value)
            if value.shape != ():
                raise ValueError(
                    f"{self._owner()}: {what} shape {value.shape}; it must be a scalar (an "
                    "array would broadcast against each parameter's last axis). To sweep "
                    "values, `jax.vmap` over transformations built from each value; for a "
                    "value per group of parameters, use `gradtx.partition`."
                )
            values[name] = value.astype(self.dtype) if cast else value
        return values

    def _rounding(self, values: dict[str, Any], error: str) -> str:
        """A note naming the numbers the hyperparameter dtype changed (those `error` names)."""
        changed = {
            name: f"{name}={float(given):g} is stored as {float(values[name]):g}"
            for name, given in self.hparams.items()
            if isinstance(given, np.generic)
            and not isinstance(values[name], Tracer)
            and float(values[name]) != float(given)
        }
        named = [note for name, note in changed.items() if f"`{name}`" in error]
        notes = named or list(changed.values())
        if not notes:
            return ""
        return (
            f" In {jnp.dtype(self.dtype).name}, {', '.join(notes)}; keep the hyperparameters "
            "in float32 (the default `hyperparam_dtype`)."
        )

    def build(self, values: dict[str, Any]) -> Transformation:
        """The inner transformation for the given hyperparameter values."""
        kwargs = {name: s.value for name, s in self.static_kwargs}
        built = as_transformation(self.factory(**values, **kwargs), self._owner())
        return built if self.keep_statistics else without_statistics(built)

    def _build_known(self, values: dict[str, Any]) -> Transformation:
        """`build` with known values, whose refusal names what the dtype rounded."""
        try:
            return self.build(values)
        except ValueError as e:
            raise ValueError(f"{self._owner()}: {e}{self._rounding(values, str(e))}") from e

    def init_state(self, params: Params) -> InjectState:
        """Count 0, the hyperparameters at step 0, the inner state, the schedules' states."""
        count = jnp.zeros((), jnp.int32)
        states = {n: start(self._owner(), n, s) for n, s in self._stateful().items()} or None
        values = self._values(count, None, states)
        inner = self._build_known(values).init_state(params)
        check = HyperparamCheck(self.factory, self.static_kwargs, self.label)
        kinds = (Schedule, StatefulSchedule)
        scheduled = tuple(n for n, v in self.hparams.items() if isinstance(v, kinds))
        return InjectState(count, values, inner, scheduled, states, check)

    def step(
        self, updates: Updates, state: InjectState, params: Params = None, **extra: Any
    ) -> tuple[Any, InjectState]:
        """Run the inner update with the hyperparameters of this step.

        Schedules are evaluated at the count and stateful schedules in their states with
        this step's `**extra` (then their states advance with it); the other values are read
        from the state.
        """
        if not isinstance(state, InjectState):
            raise TypeError(
                f"{self._owner()}: expected the state made by its init (an InjectState), got "
                f"{type(state).__name__}."
            )
        have, want = sorted(state.schedule_states or ()), sorted(self._stateful())
        if have != want:
            raise TypeError(
                f"{self._owner()}: the state holds the states of the stateful schedules {have}, "
                f"but this transformation's stateful schedules are {want}; was the state made "
                "by another transformation's init?"
            )
        values = self._values(state.count, state.hyperparams, state.schedule_states, extra)
        updates, inner = self.build(values).step(updates, state.inner, params, **extra)
        states = state.schedule_states  # advanced with this step's extra arguments
        if states is not None:
            owner = self._owner()
            states = {n: advance(owner, n, self.hparams[n], s, extra) for n, s in states.items()}
        count = next_count(state.count)
        return updates, InjectState(count, values, inner, state.scheduled, states, state.check)

    def eval_params(self, state: InjectState, params: Params) -> Any:
        """The eval weights of the inner transformation built as at the last step."""
        # The stored values are those the last step used (schedules included), and those
        # define the weights it left behind (a schedule-free `b1`, say).
        return self.build(dict(state.hyperparams)).eval_params(state.inner, params)

    def frozen_paths(self, params: Params) -> frozenset[str]:
        """The inner transformation's frozen paths."""
        return self.build(self._values(jnp.zeros((), jnp.int32), None)).frozen_paths(params)

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """The inner description with the hyperparameters at `step`, as stored.

        Warns when a value is not representable in the hyperparameter dtype.
        """
        # A stateful schedule is shown as at init: no step's arguments here.
        given = self._values(np.int32(step), None, cast=False)
        values = {name: value.astype(self.dtype) for name, value in given.items()}
        for name, value in given.items():
            _warn_if_rounded(self.label, name, float(np.float32(value)), values[name], self.dtype)
        return self._build_known(values).describe(params, step)


def _warn_if_rounded(owner: str, name: str, wanted: float, stored: Any, dtype: Any) -> None:
    """Warn when storing `wanted` in `dtype` changes it (or `1 - wanted`) by over 0.1%."""
    got = float(np.float32(stored))
    if got == wanted:
        return
    scale = max(abs(wanted), 1e-30)
    off = abs(got - wanted) / scale
    if 0.0 < wanted < 1.0:  # decay rates: what matters is 1 - value (b2 = 0.999 -> 1.0)
        off = max(off, abs((1.0 - got) - (1.0 - wanted)) / (1.0 - wanted))
    if off > 1e-3:
        warnings.warn(
            f"inject_hyperparams({owner}): {name}={wanted:g} is not representable in "
            f"{jnp.dtype(dtype).name}; it is stored as {got:g} ({off:.1%} off).",
            stacklevel=2,
        )


def inject_hyperparams(
    factory: Callable[..., Any],
    static_args: tuple[str, ...] | str = (),
    hyperparam_dtype: Any = None,
) -> Callable[..., InjectHyperparams]:
    """Keep a transformation's numeric hyperparameters in its state, by name.

    `inject_hyperparams(gradtx.adam)(learning_rate=schedule, b1=0.9)` returns a
    transformation whose state holds `learning_rate` and `b1` (float32 by default); each step
    it evaluates the schedules at its step count, reads the other values from the state, and
    runs `adam` built with them. Values can be read with `gradtx.hyperparams(state)` and set
    with `gradtx.set_hyperparams(state, {...})` between steps without recompiling; a value
    set there is checked as the factory checks its arguments. Each value, and each
    schedule's value, must be a scalar (an array would broadcast against the parameters);
    `jax.vmap` over stacked transformations sweeps values. Wrapping does not change the
    numerics: `inject_hyperparams(adam)(learning_rate=x)` gives exactly what
    `adam(learning_rate=x)` gives.

    Which arguments are hyperparameters is decided by kind, never guessed from a value alone:
    numbers and numeric arrays are hyperparameters; gradtx schedules (stateful ones too) and
    optax's stateful schedules are schedules; a plain function is a schedule only for a
    numeric argument (one with a numeric default, or a required one) not named like a mask
    (`mask`, `where`, `labels`, ...), so a function passed as `mask=` stays a mask; a Python
    int for an argument whose default is an int stays static; selectors, dtypes, bools,
    `None` and everything else are static. Name an argument in `static_args` to force it
    static.

    Args:
        factory: a function returning a transformation (`gradtx.adam`, `gradtx.sgd`, a
            `chain` builder, or an optax factory).
        static_args: names of arguments to keep static whatever their kind.
        hyperparam_dtype: the dtype hyperparameters are kept in (default float32).
            `gradtx.explain` warns when a value is not representable in it.

    A `gradtx.schedules.StatefulSchedule` (a plateau schedule, say) is evaluated in a state
    of its own with the extra arguments of each `update` call (`value=loss`), and its state
    is kept in the injected state under `schedule_states/<name>`, where `state_dict`, `save`
    and `restore` see it; this is what optax's `inject_stateful_hyperparams` does.

    Returns:
        A function taking the factory's arguments and returning the transformation. Its state
        is an `InjectState(count, hyperparams, inner, scheduled, schedule_states)`.

    Examples:
        >>> tx = gradtx.inject_hyperparams(gradtx.adamw)(
        ...     learning_rate=gradtx.schedules.linear(0.1, 0.0, 10), mask="**/w"
        ... )
        >>> state = tx.init({"w": jnp.ones(2)})
        >>> sorted(gradtx.hyperparams(state))
        ['b1', 'b2', 'eps', 'eps_root', 'learning_rate', 'weight_decay']
    """
    if not callable(factory):
        raise TypeError(f"inject_hyperparams: `factory` must be callable, got {factory!r}")
    forced = (static_args,) if isinstance(static_args, str) else tuple(static_args)
    dtype = jnp.dtype(jnp.float32 if hyperparam_dtype is None else hyperparam_dtype)
    label = getattr(factory, "__name__", "inject_hyperparams")
    try:
        signature: inspect.Signature | None = inspect.signature(factory)
    except (TypeError, ValueError):
        signature = None

    def build(*args: Any, **kwargs: Any) -> InjectHyperparams:
        if signature is not None:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as e:
                raise TypeError(f"inject_hyperparams({label}): {e}") from None
            bound.apply_defaults()  # defaults are hyperparameters too: readable and settable
            given = dict(bound.arguments)
            defaults = {n: p.default for n, p in signature.parameters.items()}
            for name, param in signature.parameters.items():  # each one in `given` now
                if param.kind is param.VAR_KEYWORD:
                    given.update(given.pop(name))
                elif param.kind is param.VAR_POSITIONAL and given.pop(name):
                    raise TypeError(
                        f"inject_hyperparams({label}): pass the arguments by name, not *{name}."
                    )
        else:
            if args:
                raise TypeError(f"inject_hyperparams({label}): pass the arguments by name.")
            given, defaults = dict(kwargs), {}
        unknown = [n for n in forced if n not in given and n not in defaults]
        if unknown:
            raise TypeError(f"inject_hyperparams({label}): static_args {unknown} are not arguments")
        hparams, statics = {}, []
        for name, value in given.items():
            default = defaults.get(name, inspect.Parameter.empty)
            if name not in forced and _is_hyperparameter(name, value, default):
                if is_stateful_schedule(value):
                    value = as_stateful_schedule(value)
                elif _is_plain_function(value):
                    value = FunctionSchedule(value)
                elif not isinstance(value, Schedule):
                    # A number is kept as a NumPy float32 scalar, which Flax NNX counts as
                    # static structure (see `Module`); an array as a JAX float32 array.
                    value = as_float(value, f"inject_hyperparams({label}).{name}")
                    if value.shape != ():
                        raise ValueError(
                            f"inject_hyperparams({label}): hyperparameter {name!r} must be a "
                            f"scalar, got shape {value.shape}"
                        )
                hparams[name] = value
            else:
                statics.append((name, StaticValue(value)))
        return InjectHyperparams(factory, hparams, tuple(statics), dtype, label)

    build.__name__ = f"inject_hyperparams({label})"
    build.__doc__ = f"Build `{label}` with its numeric hyperparameters kept in the state."
    return build
