"""The transformation protocol: immutable pytree objects with `init` and `update`.

A transformation is a `Module` (a frozen dataclass registered as a pytree) with two entry
points each for making a state and for a step:

- `init(params)` and `update(updates, state, params=None, **extra)`, the user's calls, are
  templates: they do the outermost work (checks, eager dispatch, layouts; see
  gradtx/_core/outermost_call.py) around
- `init_state(params)` and `step(updates, state, params=None, **extra)`, the math, which each
  class writes and combinators call on their children.

A class that writes `init` or `update` itself, optax-style, keeps exactly that function.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import numpy as np

from gradtx._core.module import Module, is_schedule
from gradtx._core.outermost_call import outermost_init, outermost_update
from gradtx._paths.subset import present_paths

# Pytrees of arrays (or `None` leaves), keyed by path; see gradtx/_paths/paths.py.
Params = Any
Updates = Any
State = Any


class Transformation(Module):
    """Base class of every gradtx transformation.

    A transformation is an immutable pytree: numeric hyperparameters are float32 array leaves
    and structure is static, so an equal transformation never recompiles and `jax.vmap` over a
    stacked one sweeps hyperparameters. The call shape is optax's, so gradtx transformations
    run inside optax combinators and optax transformations run inside gradtx ones.

    Subclasses implement the math, called by combinators on their children:
        init_state(params) -> state
        step(updates, state, params=None, **extra) -> (updates, state)

    and users call the templates `init` and `update`, which do the outermost work around
    them. `step` acts on the paths present in `updates` (`None` leaves mean "no gradient": no
    update, and that path's state does not move). A gradient tree that lacks parameter paths
    is an error unless the call says `partial=True`. Unknown `**extra` arguments are ignored.
    Under explicit mesh axes, the user's own call (given `params`) returns each update with
    its parameter's sharding (see gradtx/_core/update_sharding.py).

    A class may instead write `init` and `update` itself, as an optax transformation does:
    they are kept as written, and called directly they skip the outermost work. Either way a
    class needs a state maker and a step, checked when it is instantiated.
    """

    name: ClassVar[str] = "transformation"
    # Whether `step` takes gradients shaped like their params: the user's own call then
    # checks their shapes. Per-example clipping takes a batch of them per parameter.
    gradients_like_params: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check_methods(type(self))
        super().__post_init__()

    def init(self, params: Params) -> State:
        """The initial state for `params` (arrays or `jax.ShapeDtypeStruct` leaves).

        The user's call: checks the schedules, then runs `init_state` and the registered
        finishers (see gradtx/_core/outermost_call.py).
        """
        return outermost_init(self, params)

    def update(
        self,
        updates: Updates,
        state: State,
        params: Params | None = None,
        *,
        partial: bool = False,
        **extra: Any,
    ) -> tuple[Updates, State]:
        """Transform `updates` and advance `state` for the paths present in `updates`.

        The user's call: checks the gradients against the params (all of their paths, unless
        `partial=True`), runs `step` (eagerly, as one cached compiled program) and lays the
        results out as the params and the state were (see gradtx/_core/outermost_call.py).
        """
        return outermost_update(self, updates, state, params, partial=partial, **extra)

    def init_state(self, params: Params) -> State:
        """The state for `params`; combinators call it on their children. Default: `init`."""
        return self.init(params)

    def step(
        self, updates: Updates, state: State, params: Params | None = None, **extra: Any
    ) -> tuple[Updates, State]:
        """One step on the paths present in `updates`; combinators call it on their children.

        Default: the class's own `update` (an optax-style class).
        """
        return self.update(updates, state, params, **extra)

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


def _check_methods(cls: type) -> None:
    """Raise unless `cls` writes `init_state` or `init`, and `step` or `update`."""
    for pair in (("init_state", "init"), ("step", "update")):
        if all(getattr(cls, m) is getattr(Transformation, m) for m in pair):
            raise TypeError(
                f"{cls.__name__} defines neither `{pair[0]}` nor `{pair[1]}`: a transformation "
                f"needs `init_state` (or its own `init`) and `step` (or its own `update`)."
            )


def _value(value: Any, step: Any) -> Any:
    if is_schedule(value):
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
