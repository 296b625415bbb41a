"""The transformation protocol: immutable pytree objects with `init` and `update`."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import numpy as np

from gradtx._core.boundary import (
    check_complete,
    check_leaves,
    check_shapes,
    check_stable_carry,
    declared,
    outermost,
)
from gradtx._core.dispatch import eager_dispatch
from gradtx._core.foreign import factory_name, injected_hyperparams, keyed, plain
from gradtx._core.module import Module, check_scalar_hyperparams, static
from gradtx._core.statistics import reading_replaced
from gradtx._core.update_layout import explicit, like_params, like_state
from gradtx._paths.paths import flatten
from gradtx._paths.subset import present_paths

__all__ = [
    "ForeignTransform",
    "Transformation",
    "add_init_finisher",
    "as_transformation",
    "check_state_keys",
    "merge_descriptions",
    "own_hyperparams",
]

State = Any
Updates = Any
Params = Any


# What runs on the state of the outermost `init` call (the user's own, not a combinator's
# call of its children's). The state tools register here, a layer below this one: placing
# the state where the params' Flax metadata says (`optimizer_sharding`) needs their layouts.
_init_finishers: list[Callable[[Any, Any, Any], Any]] = []
_init_depth = threading.local()


def add_init_finisher(finish: Callable[[Any, Any, Any], Any]) -> None:
    """Run `finish(tx, state, params) -> state` after each outermost `init` call."""
    _init_finishers.append(finish)


def _checked_init(init: Any) -> Any:
    """`init` that first checks what each schedule hyperparameter returns.

    The outermost call also hands its state to the registered finishers.
    """

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        check_schedules(self)
        depth = getattr(_init_depth, "value", 0)
        _init_depth.value = depth + 1
        try:
            state = init(self, *args, **kwargs)
        finally:
            _init_depth.value = depth
        params = args[0] if args else kwargs.get("params")
        if depth == 0 and params is not None:
            for finish in _init_finishers:
                state = finish(self, state, params)
        return state

    wrapper.__checked_init__ = True  # type: ignore[attr-defined]
    return wrapper


def check_schedules(tx: Any) -> None:
    """Raise if a hyperparameter given as a schedule does not return one number per step.

    Each schedule (or plain function of the step) is traced once, abstractly, at a scalar
    int32 step: it must return a real numeric scalar (shape `()`). The error names the
    transformation, the argument, and the shape or type it returned.
    """
    for f in dataclasses.fields(tx):
        if not f.metadata.get("hyperparam"):
            continue
        value = getattr(tx, f.name)
        if not (isinstance(value, Module) or callable(value)):
            continue
        returned: list[Any] = []

        def probe(step: Any, schedule: Any = value, returned: list = returned) -> Any:
            out = schedule(step)
            returned.append(out)
            return out if isinstance(out, (jax.Array, np.ndarray, np.generic)) else None

        try:
            out = jax.eval_shape(probe, jax.ShapeDtypeStruct((), np.int32))
        except Exception as e:  # noqa: BLE001 - any failure is the schedule's: say whose
            raise TypeError(
                f"{tx.name}: the schedule given as `{f.name}` fails when called with a step "
                f"count (an int32 scalar): {type(e).__name__}: {e}"
            ) from e
        if out is None:
            kind = type(returned[0]).__name__ if returned else "nothing"
            numeric = (
                returned
                and isinstance(returned[0], (int, float))
                and not isinstance(returned[0], bool)
            )
            if numeric:
                continue  # a constant Python number: fine
            problem = f"type {kind}"
        elif out.shape != () or not _is_real_number(out.dtype):
            problem = f"shape {out.shape}, dtype {out.dtype}"
        else:
            continue
        raise TypeError(
            f"{tx.name}: the schedule given as `{f.name}` must return a real number per step "
            f"(shape ()), got {problem}."
        )


def _is_real_number(dtype: Any) -> bool:
    return bool(
        jax.dtypes.issubdtype(dtype, np.integer) or jax.dtypes.issubdtype(dtype, np.floating)
    )


def _checking_paths(update: Any) -> Any:
    """`update` that first checks the hyperparameters' shapes and the gradients' paths.

    The hyperparameters must be scalars; the gradients must cover the params' paths and have
    their shapes (see `takes_param_shaped_gradients`).
    Only in the user's own call, not a combinator's (see gradtx/_core/boundary.py), and at
    trace time only, since it runs inside the eager dispatch.
    """

    @functools.wraps(update)
    def wrapper(
        self: Any, updates: Any, state: Any, params: Any = None, **extra: Any
    ) -> tuple[Any, Any]:
        if outermost():
            check_scalar_hyperparams(self, self.name)
            given, grads, _ = flatten(updates)
            check_leaves(self.name, "gradients", given, grads)
            if params is not None:
                wanted, leaves, _ = flatten(params)
                # A parameter without a gradient may be anything (an Equinox activation).
                with_grad = {p for p, g in zip(given, grads) if g is not None}
                chosen = [(p, x) for p, x in zip(wanted, leaves) if p in with_grad]
                check_leaves(self.name, "params", [p for p, _ in chosen], [x for _, x in chosen])
                if takes_param_shaped_gradients(self):
                    check_shapes(self.name, given, grads, dict(chosen))
                present = (p for p, x in zip(wanted, leaves) if x is not None)
                check_complete(self.name, given, present)
        return update(self, updates, state, params, **extra)

    return wrapper


def takes_param_shaped_gradients(tx: Any) -> bool:
    """Whether `tx` and every transformation inside it take gradients shaped like the params.

    Per-example clipping takes a batch of gradients per parameter, and a wrapped optax
    transformation may too (differential privacy), so with one of them inside, the user's
    own call leaves the gradients' shapes to the steps that read them.
    """
    if not getattr(tx, "gradients_like_params", True):
        return False
    inner = jax.tree_util.tree_leaves(
        tx, is_leaf=lambda x: x is not tx and isinstance(x, Transformation)
    )
    return all(takes_param_shaped_gradients(x) for x in inner if isinstance(x, Transformation))


def _laid_out_like_params(update: Any) -> Any:
    """`update` whose outermost call keeps the explicit layouts of params and state.

    Each update takes its parameter's layout, each state leaf its own from the step before.
    See gradtx/_core/update_layout.py; a combinator's inner calls leave them as the math
    made them. The outermost call also has each statistic read the value it replaces, so
    that a donated state keeps every buffer aliased to its own new value (`reading_replaced`),
    and, traced as a loop's body, checks that the state keeps its structure
    (`check_stable_carry`).
    """

    @functools.wraps(update)
    def wrapper(
        self: Any, updates: Any, state: Any, params: Any = None, **extra: Any
    ) -> tuple[Any, Any]:
        new_updates, new_state = update(self, updates, state, params, **extra)
        if not outermost():
            return new_updates, new_state
        check_stable_carry(self.name, updates, state, new_state)
        if explicit(updates):
            new_state = like_state(new_state, state)
            if params is not None:
                new_updates = like_params(new_updates, params)
        # and each statistic keeps its donated buffer (see gradtx/_core/statistics.py)
        return new_updates, reading_replaced(new_state, state)

    return wrapper


def _declaring_partial(update: Any) -> Any:
    """`update` taking the keyword `partial` (declare a partial update; see `Transformation`)."""

    @functools.wraps(update)
    def wrapper(self: Any, *args: Any, partial: bool = False, **kwargs: Any) -> Any:
        with declared(partial):
            return update(self, *args, **kwargs)

    wrapper.__wrapped_eager__ = update.__wrapped_eager__  # type: ignore[attr-defined]
    return wrapper


class Transformation(Module):
    """Base class of every gradtx transformation.

    A transformation is an immutable pytree: numeric hyperparameters are float32 array leaves
    and structure is static, so an equal transformation never recompiles and `jax.vmap` over a
    stacked one sweeps hyperparameters. The call shape is optax's, so gradtx transformations
    run inside optax combinators and optax transformations run inside gradtx ones.

    Subclasses implement:
        init(params) -> state
        update(updates, state, params=None, **extra) -> (updates, state)

    `update` acts on the paths present in `updates` (`None` leaves mean "no gradient": no update,
    and that path's state does not move). A gradient tree that lacks parameter paths is an
    error unless the call says `partial=True` (see gradtx/_core/boundary.py). Unknown `**extra`
    arguments are ignored. Under explicit mesh axes, the user's own call (given `params`)
    returns each update with its parameter's sharding (see gradtx/_core/update_layout.py).
    """

    name: ClassVar[str] = "transformation"
    # Whether `update` takes gradients shaped like their params: the user's own call then
    # checks their shapes. Per-example clipping takes a batch of them per parameter.
    gradients_like_params: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Eager `update` calls run one cached compiled program (see gradtx/_core/dispatch.py).
        update = cls.__dict__.get("update")
        if update is not None and not hasattr(update, "__wrapped_eager__"):
            cls.update = _declaring_partial(
                eager_dispatch(_checking_paths(_laid_out_like_params(update)))
            )
        init = getattr(cls, "init", None)  # a mixin's `init` too
        if init is not None and not hasattr(init, "__checked_init__"):
            cls.init = _checked_init(init)

    def init(self, params: Params) -> State:
        """Initial state for `params` (arrays or `jax.ShapeDtypeStruct` leaves)."""
        raise TypeError(f"{type(self).__name__} does not define init")

    def update(
        self, updates: Updates, state: State, params: Params | None = None, **extra: Any
    ) -> tuple[Updates, State]:
        """Transform `updates` and advance `state` for the paths present in `updates`."""
        raise TypeError(f"{type(self).__name__} does not define update")

    def frozen_paths(self, params: Params) -> frozenset[str]:
        """Paths whose update is zero whatever the gradient (frozen by `gradtx.freeze`).

        Wrappers such as `accumulate` keep no buffers for them. Combinators answer for their
        children; a plain transformation freezes nothing.
        """
        return frozenset()

    def eval_params(self, state: State, params: Params) -> Params:
        """The weights to evaluate and save, given this step's `state` and the `params`.

        Most transformations train the weights they evaluate, so this returns `params`.
        Averaging methods override it (`schedule_free`'s average $x$, `lookahead`'s slow
        weights, `ema_params`' moving average) and combinators answer for their children;
        `gradtx.eval_params(tx, state, params)` calls it.
        """
        return params

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """What this transformation does to each path at `step`, for `gradtx.explain`.

        Returns `{path: [(name, {hyperparameter: value}), ...]}` for the paths it acts on, in
        the order the steps run. A plain transformation acts on every present path with its own
        numeric hyperparameters (schedules evaluated at `step`); combinators override this.
        """
        entry = (self.name, own_hyperparams(self, step))
        return {path: [entry] for path in present_paths(params)}


class ForeignTransform(Transformation):
    """An optax-style `(init, update)` pair run inside gradtx combinators, kept static.

    `chain`, `masked`, `partition` and the other combinators wrap any object with `init` and
    `update` methods (an optax `GradientTransformation`) in this class, named after the optax
    factory that made it (`scale_by_adam`, `chain`, `inject_hyperparams`; see `name`). Its
    numerics are optax's own: `update` calls the wrapped `update` with the updates, state and
    params it is given, and passes `**extra` on only if the wrapped `update` accepts them.

    State keys: optax keeps a chain's states in a tuple; here every such tuple is kept as
    `NamedStates`, whose entries are named after the transformation that made them when it
    can be read (an optax factory's name, or a gradtx transformation's `name`), else after
    their state type (`ScaleByAdamState` gives `scale_by_adam`), else by position. So
    `state_dict` reads `chain/scale_by_adam/mu/w` rather than `chain/0/mu/w`, and
    `load_state_dict`, `reconcile`, `save` and `restore` use those keys. The wrapped
    transformation still receives and returns its own tuples.

    What a wrapped optax transformation does not get, compared with a gradtx one:

    - Path-keyed state. Its state is optax's: moments are pytrees shaped like the params
      (`mu/enc/w` inside it still reads by path, since optax mirrors the params), but there
      are no per-path slots, no packed or bucketed storage, and no `mu_dtype` beyond what the
      optax factory takes.
    - Per-path step counts for partial updates. Its step count (where it keeps one) is one
      scalar for the whole tree, and a `None` gradient at a path where its state holds arrays
      is left to optax, where most transformations fail with a tree-structure error. So two
      models cannot take turns in one wrapped optimizer: give each model its own wrapped
      transformation in a `partition` (a label without gradients keeps its state as it was),
      or use a gradtx transformation. `None` leaves that were `None` at `init` too (the
      fields `eqx.filter_grad` leaves out) are fine.
    - `describe` and `explain` details. `explain` lists it as one step named `name`; the only
      hyperparameters it shows are those of an `optax.inject_hyperparams` state at the top or
      in a chain entry (its `learning_rate`, `b1`, ... at the step asked for), so its learning
      rate column reads `-` otherwise. `gradtx.hyperparams`, `set_hyperparams` and `stats`
      do not read optax's injected hyperparameters.
    - `eval_params`. It returns the params unchanged, so the averaged weights of an optax
      schedule-free or lookahead transformation are not what `gradtx.eval_params` gives; use
      optax's own functions on the wrapped state.
    - `frozen_paths`. It freezes nothing as far as `accumulate` knows, even where its updates
      are zero (`optax.set_to_zero`).

    Attributes:
        inner: the wrapped `(init, update)` object, kept as static structure (the same object
            never recompiles a jitted step).
        label: the name of its state inside a chain.

    Examples:
        >>> import optax
        >>> tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), optax.adam(0.1))  # wrapped
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> [key for key in gradtx.state_dict(state) if key.startswith("chain/")]
        ['chain/scale_by_adam/count', 'chain/scale_by_adam/mu/w', 'chain/scale_by_adam/nu/w']
        >>> with jax.numpy_dtype_promotion("standard"):  # optax mixes int counts and floats
        ...     updates, state = tx.update({"w": jnp.ones(2)}, state)
        >>> round(float(updates["w"][0]), 4)  # Adam's first step: -learning_rate * sign
        -0.1
    """

    inner: Any = static()
    label: str = static("optax")
    # optax's own per-example transformations (differential privacy) take a batch axis.
    gradients_like_params: ClassVar[bool] = False

    @property
    def name(self) -> str:  # type: ignore[override]
        """The key of this step's state inside a chain."""
        return self.label

    def _maker(self) -> tuple[Any, Any]:
        return self.inner.init, self.inner.update

    def init(self, params: Params) -> State:
        """The wrapped `init(params)`, its tuples kept as `NamedStates`."""
        return keyed(self.inner.init(params), self._maker())

    def update(
        self, updates: Updates, state: State, params: Params | None = None, **extra: Any
    ) -> tuple[Updates, State]:
        """The wrapped `update` on optax's own state; the new state keyed as `init` keys it.

        `state` may be the keyed state `init` gives or the wrapped transformation's own.
        """
        own = plain(state)
        if _takes_extra(self.inner.update):
            updates, own = self.inner.update(updates, own, params, **extra)
        else:
            updates, own = self.inner.update(updates, own, params)
        return updates, keyed(own, self._maker())

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """One step, `name`, on every present path, with the optax injected hyperparameters.

        The hyperparameters are those of an `optax.inject_hyperparams` state that is the
        wrapped state or an entry of its chain, at `step` (see `injected_hyperparams`).
        """
        entry = (self.name, injected_hyperparams(self.inner, step))
        return {path: [entry] for path in present_paths(params)}


def _takes_extra(fn: Any) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD for p in parameters)


def _foreign_name(tx: Any) -> str:
    """The name of a wrapped transformation: its factory's or class's name, else `transform`.

    `update` is read first, since optax's stateless transformations share one `init`
    (`init_empty_state`); see `factory_name`.
    """
    return factory_name(getattr(tx, "init", None), getattr(tx, "update", None)) or "transform"


def check_state_keys(owner: str, state: Any, keys: tuple[str, ...]) -> None:
    """Raise a clear error if `state` lacks the keys its transformation's `init` gives it."""
    missing = [k for k in keys if not isinstance(state, Mapping) or k not in state]
    if missing:
        found = list(state) if isinstance(state, Mapping) else type(state).__name__
        raise KeyError(
            f"{owner}: expected the state made by its init, with keys {list(keys)}, got "
            f"{found}; was it made by another transformation's init?"
        )


def as_transformation(tx: Any, argument: str = "transform") -> Transformation:
    """Return `tx` as a gradtx `Transformation`, wrapping optax-style `(init, update)` pairs."""
    if isinstance(tx, Transformation):
        return tx
    if callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None)):
        return ForeignTransform(tx, _foreign_name(tx))
    raise TypeError(
        f"`{argument}` must be a transformation (an object with init and update), "
        f"got {type(tx).__name__}: {tx!r}"
    )


def _value(value: Any, step: Any) -> Any:
    if isinstance(value, Module) or callable(value):
        value = value(np.int32(step))
    if isinstance(value, (jax.Array, np.ndarray, np.generic, float, int)):
        array = np.asarray(value)
        if array.shape == () and np.issubdtype(array.dtype, np.number):
            return float(array) if np.issubdtype(array.dtype, np.floating) else int(array)
    return None


def own_hyperparams(tx: Any, step: Any = 0) -> dict[str, Any]:
    """`{name: value}` of the scalar numeric fields of `tx`, schedules evaluated at `step`.

    Sub-transformations and non-scalar fields are left out.
    """
    out: dict[str, Any] = {}
    if not dataclasses.is_dataclass(tx):
        return out
    for name in getattr(type(tx), "_data_names", ()):
        value = getattr(tx, name)
        if isinstance(value, Transformation) or value is None:
            continue
        try:
            shown = _value(value, step)
        except Exception:  # a schedule that cannot run on a concrete step: not shown
            shown = None
        if shown is not None:
            out[name] = shown
    return out


def merge_descriptions(*parts: dict[str, list]) -> dict[str, list]:
    """Concatenate per-path step lists, in order (a chain's description)."""
    out: dict[str, list] = {}
    for part in parts:
        for path, steps in part.items():
            out.setdefault(path, []).extend(steps)
    return out
