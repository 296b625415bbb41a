"""`tree_map_params`: apply a function to every part of an optimizer state shaped like a param."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from gradtx._core.protocol import Params, State
from gradtx._layouts.step_counts import StepCounts
from gradtx._paths.paths import flatten, is_unit, leaves, owning_path, path_of
from gradtx._state.state_dict import state_dict

_SHOWN = 6


def _by_path(tree: Any, is_leaf: Callable[[Any], bool] | None, name: str) -> dict[str, Any]:
    """`{path: leaf}` of a params-shaped tree (`is_leaf` stops the flattening early)."""
    if is_leaf is None:
        found = leaves(tree)
    else:
        pairs = jax.tree_util.tree_flatten_with_path(tree, lambda x: x is None or is_leaf(x))[0]
        found = {path_of(kp): x for kp, x in pairs}
    for path, leaf in found.items():
        if is_unit(leaf):
            raise TypeError(
                f"tree_map_params: `{name}` holds packed params (gradtx.pack) at {path!r}; "
                "pass the unpacked tree (`packed.unpack()`) or its `jax.ShapeDtypeStruct`s."
            )
    return found


def _check_state(tx: Any, state: State, params: Params) -> None:
    """Raise unless `state` has the keys `tx.init(params)` gives (traced abstractly)."""
    init = tx.init if callable(getattr(tx, "init", None)) else tx
    if not callable(init):
        raise TypeError(
            "tree_map_params: `tx` must be a transformation (or a function `params -> state`), "
            f"got {type(tx).__name__}: {tx!r}"
        )
    expected = set(state_dict(jax.eval_shape(init, params)))
    got = set(state_dict(state))
    if expected != got:
        missing, extra = sorted(expected - got), sorted(got - expected)
        detail = (
            f"it lacks {missing[0]!r}" if missing else f"it has the unexpected key {extra[0]!r}"
        )
        raise ValueError(
            f"tree_map_params: `state` was not made by `tx.init(params)`: {detail} "
            f"(expected keys: {sorted(expected)[:_SHOWN]}). Pass the transformation and the "
            "params the state belongs to."
        )


def tree_map_params(
    tx: Any,
    f: Callable[..., Any],
    state: State,
    /,
    *rest: Any,
    transform_non_params: Callable[[Any], Any] | None = None,
    is_leaf: Callable[[Any], bool] | None = None,
    params: Params = None,
) -> Any:
    """Apply `f` to every part of an optimizer state that is shaped like a parameter.

    gradtx keeps per-parameter state by path (`adam/mu/enc/w` is the first moment of
    `enc/w`), so the parameter-shaped parts are found by path, as `gradtx.explain` finds them:
    a state entry belongs to the parameter whose path ends its key (the longest such path), if
    it has that parameter's shape. `f(value, *rest_leaves)` is called on each of them, with the
    leaves of the `rest` trees at the parameter's path; every other entry (step counts, scalars,
    statistics, injected hyperparameters) is given to `transform_non_params` or kept as it is.
    This is optax's `tree_map_params`, typically used to build the state's shardings from the
    params' or to cast the moments.

    The parameter paths come from `params=` or, without it, from the first of `rest` (trees
    shaped like the params, as in optax). With `params`, `tx` checks that `state` has the keys
    `tx.init(params)` gives; the shapes are compared only where the reference tree's leaves
    have shapes (`PartitionSpec` leaves have none). Optimizer state for packed params
    (`gradtx.pack`, `gradtx.bucketed`) keeps flat buffers, not an array per parameter, and is
    refused.

    Args:
        tx: the transformation the state was made by (or a function `params -> state`).
        f: called as `f(value, *rest_leaves)` on every parameter-shaped state entry.
        state: the optimizer state.
        *rest: trees shaped like the params (matched by path), whose leaves `f` receives.
        transform_non_params: called as `transform_non_params(value)` on every other array of
            the state; `None` keeps them.
        is_leaf: stops the flattening of the `rest` trees (and of `params`) early, as in
            `jax.tree.map`.
        params: the params (arrays or `jax.ShapeDtypeStruct`s); needed when `rest` is empty.

    Returns:
        A tree shaped like `state`.

    Examples:
        >>> tx, params = gradtx.adam(1e-3), {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}
        >>> state = tx.init(params)
        >>> half = gradtx.tree_map_params(
        ...     tx, lambda x: x.astype(jnp.bfloat16), state, params=params
        ... )
        >>> half["mu"]["w"].dtype, half["count"]["w"].dtype
        (dtype(bfloat16), dtype('int32'))
        >>> names = {"w": "kernel", "b": "bias"}
        >>> gradtx.tree_map_params(
        ...     tx, lambda _, name: name, state, names, transform_non_params=lambda _: None
        ... )["nu"]
        {'b': 'bias', 'w': 'kernel'}
    """
    if params is not None:
        reference = _by_path(params, is_leaf, "params")
        _check_state(tx, state, params)
    elif rest:
        reference = _by_path(rest[0], is_leaf, "rest[0]")
    else:
        raise TypeError(
            "tree_map_params: give `params=` (or trees shaped like the params in `*rest`): "
            "gradtx finds a parameter's state by the parameter's path."
        )
    columns = [_by_path(tree, is_leaf, f"rest[{i}]") for i, tree in enumerate(rest)]
    known = {p for p, x in reference.items() if x is not None}

    def one(key: str, value: Any) -> Any:
        if value is None:
            return None
        if is_unit(value) and not isinstance(value, StepCounts):
            raise TypeError(
                f"tree_map_params: the state at key {key!r} keeps packed buffers (gradtx.pack "
                "or gradtx.bucketed), not one array per parameter; map over "
                "`gradtx.state_dict(state)` instead, whose keys end with the parameter paths."
            )
        owner = None if is_unit(value) else owning_path(key, known)
        if owner is not None:
            assert not isinstance(value, StepCounts)  # a unit owns no single path
            shape = getattr(reference[owner], "shape", None)
            if shape is not None and tuple(np.shape(value)) != tuple(shape):
                owner = None
        if owner is None and transform_non_params is not None:
            return jax.tree.map(transform_non_params, value)
        if owner is None:
            return value
        for i, column in enumerate(columns):
            if owner not in column:
                raise KeyError(
                    f"tree_map_params: `rest[{i}]` has no leaf at the parameter path {owner!r} "
                    f"(state key {key!r}); its paths are {list(column)[:_SHOWN]}."
                )
        return f(value, *(column[owner] for column in columns))

    keys, values, treedef = flatten(state)
    return treedef.unflatten([one(key, value) for key, value in zip(keys, values)])
