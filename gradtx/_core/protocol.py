"""The transformation protocol: immutable pytree objects with `init` and `update`."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import numpy as np

from gradtx._core.dispatch import eager_dispatch
from gradtx._core.module import Module, static
from gradtx._paths.subset import present_paths

__all__ = [
    "ForeignTransform",
    "Transformation",
    "as_transformation",
    "check_state_keys",
    "merge_descriptions",
    "own_hyperparams",
]

State = Any
Updates = Any
Params = Any


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
    and that path's state does not move). Unknown `**extra` arguments are ignored.
    """

    name: ClassVar[str] = "transformation"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Eager `update` calls run one cached compiled program (see gradtx/_core/dispatch.py).
        update = cls.__dict__.get("update")
        if update is not None and not hasattr(update, "__wrapped_eager__"):
            cls.update = eager_dispatch(update)

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

    Examples:
        >>> import optax
        >>> tx = gradtx.chain(optax.scale(0.5))  # wrapped automatically
    """

    inner: Any = static()
    label: str = static("optax")

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.label

    def init(self, params: Params) -> State:
        return self.inner.init(params)

    def update(
        self, updates: Updates, state: State, params: Params | None = None, **extra: Any
    ) -> tuple[Updates, State]:
        if _takes_extra(self.inner.update):
            return self.inner.update(updates, state, params, **extra)
        return self.inner.update(updates, state, params)


def _takes_extra(fn: Any) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD for p in parameters)


def _foreign_name(tx: Any) -> str:
    # update first: stateless optax transformations share one init (`init_empty_state`).
    for method in ("update", "init"):
        qualname = getattr(getattr(tx, method, None), "__qualname__", "")
        head = qualname.split(".")[0]
        if head and not qualname.endswith("<lambda>"):
            return head
    return "transform"


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
