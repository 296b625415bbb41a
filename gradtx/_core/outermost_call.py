"""The user's own `init` and `update` calls, read top to bottom.

`Transformation.init` and `Transformation.update` are templates that call the two functions
here; the math is in each class's `init_state` and `step`, which combinators call on their
children. So the work below runs once per call the user makes, whatever the nesting:

- `outermost_update`: the partial-update declaration, the checks of the hyperparameters and
  of the gradients against the params, the eager dispatch (one cached compiled program), the
  step itself, and the results laid out as the params and the state were.
- `outermost_init`: the schedules' check, the state itself, and the registered finishers
  (the state tools place the state as Flax's `optimizer_sharding` metadata says).

A class that defines its own `update` or `init` (optax-style) keeps exactly that function
and skips this work when called directly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from gradtx._core.call_checks import (
    check_complete,
    check_leaves,
    check_schedules,
    check_shapes,
    check_stable_carry,
    declared,
    partial_allowed,
)
from gradtx._core.dispatch import dispatchable
from gradtx._core.module import Module, check_scalar_hyperparams
from gradtx._core.statistics import reading_replaced
from gradtx._core.update_sharding import explicit, like_params, like_state
from gradtx._paths.paths import flatten

# What runs on the state of the user's own `init` call. The state tools register here, a
# layer below this one: placing the state where the params' Flax metadata says
# (`optimizer_sharding`) needs their slot layouts.
_init_finishers: list[Callable[[Any, Any, Any], Any]] = []


def add_init_finisher(finish: Callable[[Any, Any, Any], Any]) -> None:
    """Run `finish(tx, state, params) -> state` after each of the user's `init` calls."""
    _init_finishers.append(finish)


def outermost_init(tx: Any, params: Any) -> Any:
    """`tx.init(params)` as the user calls it: checked schedules, the state, the finishers."""
    for inner in _transformations(tx):
        check_schedules(inner)
    state = tx.init_state(params)
    for finish in _init_finishers:
        state = finish(tx, state, params)
    return state


def outermost_update(
    tx: Any, updates: Any, state: Any, params: Any = None, *, partial: bool = False, **extra: Any
) -> tuple[Any, Any]:
    """`tx.update(updates, state, params, partial=..., **extra)` as the user calls it.

    An enclosing call's declaration holds (a gradtx transformation inside an optax one inside
    a gradtx chain). Eagerly, with array arguments, the checked step runs as one compiled
    program cached by structure (see gradtx/_core/dispatch.py); inside `jit`, `vmap` or
    `grad`, or with a function among the arguments, it runs as written.
    """
    partial = bool(partial) or partial_allowed()
    if dispatchable((tx, updates, state, params, extra)):
        return _compiled(partial, tx, updates, state, params, **extra)
    return _checked_step(partial, tx, updates, state, params, **extra)


def _checked_step(
    partial: bool, tx: Any, updates: Any, state: Any, params: Any, **extra: Any
) -> tuple[Any, Any]:
    with declared(partial):
        _check_call(tx, updates, params)
        new_updates, new_state = tx.step(updates, state, params, **extra)
    check_stable_carry(tx.name, updates, state, new_state)
    # Under explicit mesh axes, each update takes its parameter's layout and each state leaf
    # its own from the step before (see gradtx/_core/update_sharding.py).
    if explicit(updates):
        new_state = like_state(new_state, state)
        if params is not None:
            new_updates = like_params(new_updates, params)
    # Each statistic reads the value it replaces, so that a donated state keeps every buffer
    # aliased to its own new value (see gradtx/_core/statistics.py).
    return new_updates, reading_replaced(new_state, state)


# `partial` is part of the cache key: the completeness check runs while tracing.
_compiled = functools.partial(jax.jit, static_argnums=0)(_checked_step)


def _check_call(tx: Any, updates: Any, params: Any) -> None:
    """Scalar hyperparameters; array gradients covering the params' paths, in their shapes."""
    check_scalar_hyperparams(tx, tx.name)
    given, grads, _ = flatten(updates)
    check_leaves(tx.name, "gradients", given, grads)
    if params is None:
        return
    wanted, leaves, _ = flatten(params)
    # A parameter without a gradient may be anything (an Equinox activation).
    with_grad = {p for p, g in zip(given, grads) if g is not None}
    chosen = [(p, x) for p, x in zip(wanted, leaves) if p in with_grad]
    check_leaves(tx.name, "params", [p for p, _ in chosen], [x for _, x in chosen])
    if takes_param_shaped_gradients(tx):
        check_shapes(tx.name, given, grads, dict(chosen))
    check_complete(tx.name, given, (p for p, x in zip(wanted, leaves) if x is not None))


def _transformations(tx: Any) -> list[Any]:
    """`tx` and every transformation held in its fields, at any depth."""
    inner = jax.tree_util.tree_leaves(tx, is_leaf=lambda x: x is not tx and _is_transform(x))
    return [tx] + [x for node in inner if _is_transform(node) for x in _transformations(node)]


def _is_transform(x: Any) -> bool:
    return isinstance(x, Module) and hasattr(x, "step")


def takes_param_shaped_gradients(tx: Any) -> bool:
    """Whether `tx` and every transformation inside it take gradients shaped like the params.

    Per-example clipping takes a batch of gradients per parameter, and a wrapped optax
    transformation may too (differential privacy), so with one of them inside, the user's
    own call leaves the gradients' shapes to the steps that read them.
    """
    return all(getattr(x, "gradients_like_params", True) for x in _transformations(tx))
