"""Reading and setting injected hyperparameters by name, and resetting the state of paths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from gradtx._combinators.inject import InjectState
from gradtx._core.protocol import Params, State
from gradtx._layouts.packed import join_path
from gradtx._paths.paths import owning_path, path_of
from gradtx._paths.selectors import select
from gradtx._paths.subset import present_paths
from gradtx._state.state_dict import load_state_dict, state_dict


def _is_inject(x: Any) -> bool:
    return isinstance(x, InjectState)


def _walk(state: State, prefix: str, visit: Any) -> Any:
    """Rebuild `state`, calling `visit(prefix, node)` on every `InjectState`, outermost first.

    The group prefix of a node is its path in the state, less the `inner` fields.
    """
    key_leaves, treedef = jax.tree_util.tree_flatten_with_path(state, is_leaf=_is_inject)
    out = []
    for key_path, leaf in key_leaves:
        if _is_inject(leaf):
            here = join_path(prefix, path_of(key_path))
            leaf = visit(here, leaf)
            leaf = leaf.replace(inner=_walk(leaf.inner, here, visit))
        out.append(leaf)
    return treedef.unflatten(out)


def hyperparams(state: State) -> dict[str, jax.Array]:
    """The injected hyperparameters of a state, by name: `{group/name: value}`.

    A name is the hyperparameter's name prefixed with where it sits in the state: the label
    in a `partition`, the name of a `masked` or of a chain step (`encoder/learning_rate`).
    Scheduled values are those of the last step (at `init`: step 0).

    Args:
        state: the state of a transformation containing `inject_hyperparams`.

    Examples:
        >>> tx = gradtx.partition(
        ...     {"enc": gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=0.1),
        ...      "head": gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=0.5)},
        ...     {"enc": "enc", "head": "head"},
        ... )
        >>> state = tx.init({"enc": jnp.ones(2), "head": jnp.ones(2)})
        >>> {k: float(v) for k, v in gradtx.hyperparams(state).items()}
        {'enc/learning_rate': 0.10000000149011612, 'head/learning_rate': 0.5}
    """
    found: dict[str, jax.Array] = {}

    def visit(prefix: str, node: InjectState) -> InjectState:
        for name, value in node.hyperparams.items():
            key = join_path(prefix, name)
            if key in found:
                raise ValueError(
                    f"hyperparams: two injected hyperparameters are both named {key!r}; give "
                    "the groups distinct names (named_chain, masked(..., name=...))."
                )
            found[key] = value
        return node

    _walk(state, "", visit)
    return found


def set_hyperparams(state: State, values: Mapping[str, Any]) -> Any:
    """A new state with injected hyperparameters replaced by name (the input is unchanged).

    Values keep the stored dtype and shape, so a jitted step taking the state does not
    recompile. Scheduled hyperparameters cannot be set (the schedule overwrites them).

    A value known here (a number, a NumPy or JAX array) passes the checks the transformation's
    own constructor makes, on the value as stored: `float("nan")` as a learning rate or
    `b2=1.5` for Adam raise, naming the hyperparameter and the rule. A traced value (this
    function called inside `jax.jit` with a value computed there) cannot be checked without
    its value on the host, so it is not: check it before the jitted call.

    Args:
        state: the state of a transformation containing `inject_hyperparams`.
        values: `{name: value}` with names as `gradtx.hyperparams` gives them.

    Raises:
        KeyError: no injected hyperparameter has that name.
        ValueError: the hyperparameter follows a schedule, the value has another shape, or
            the transformation's checks refuse the value.

    Examples:
        >>> tx = gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=0.1)
        >>> state = gradtx.set_hyperparams(tx.init({"w": jnp.ones(2)}), {"learning_rate": 0.01})
        >>> u, _ = tx.update({"w": jnp.ones(2)}, state)
        >>> u["w"]
        Array([-0.01, -0.01], dtype=float32)
        >>> gradtx.set_hyperparams(state, {"learning_rate": float("nan")})
        Traceback (most recent call last):
        ...
        ValueError: set_hyperparams: 'learning_rate' = nan is refused by sgd: scale_by_learning_rate: `learning_rate` must be finite, got nan.
    """  # noqa: E501
    known = hyperparams(state)
    unknown = [k for k in values if k not in known]
    if unknown:
        raise KeyError(
            f"set_hyperparams: no injected hyperparameter named {unknown[0]!r}; the names are "
            f"{sorted(known)}."
        )

    def visit(prefix: str, node: InjectState) -> InjectState:
        new = dict(node.hyperparams)
        for name, old in node.hyperparams.items():
            key = join_path(prefix, name)
            if key not in values:
                continue
            if name in node.scheduled:
                raise ValueError(
                    f"set_hyperparams: {key!r} follows a schedule, which overwrites it every "
                    "step; inject it as a number to set it."
                )
            value = jnp.asarray(values[key])
            if value.shape != old.shape:
                raise ValueError(
                    f"set_hyperparams: {key!r} has shape {old.shape}, got a value of shape "
                    f"{value.shape}."
                )
            new[name] = value.astype(old.dtype)
            _check(node, key, name, new[name], values[key])
        return node.replace(hyperparams=new)

    return _walk(state, "", visit)


def _check(node: InjectState, key: str, name: str, value: jax.Array, given: Any) -> None:
    """Raise if the transformation's own checks refuse `value` (as stored) for `name`."""
    if node.check is None or isinstance(value, Tracer):
        return  # a traced value is not known here
    shown = np.asarray(value, np.float32)
    stored = float(shown) if shown.ndim == 0 else shown
    others = {n: v for n, v in node.hyperparams.items() if n != name}
    try:
        node.check(name, stored, others)
    except (ValueError, TypeError) as e:
        rounded = "" if _same(given, stored) else f" (stored as {stored!r})"
        raise ValueError(
            f"set_hyperparams: {key!r} = {given!r}{rounded} is refused by {node.check.label}: {e}"
        ) from e


def _same(given: Any, stored: Any) -> bool:
    try:
        return bool(np.array_equal(np.asarray(given, np.float32), stored, equal_nan=True))
    except (TypeError, ValueError):
        return False


def reset(tx: Any, state: State, params: Params, where: Any) -> Any:
    """Re-initialise the state of the selected paths; every other entry is kept bit-for-bit.

    Per-path entries (moments, accumulators, per-path step counts) of the selected paths take
    the values `tx.init(params)` gives them; everything else (other paths, injected
    hyperparameters, global counters) is unchanged.

    Args:
        tx: the transformation that made `state`.
        state: its state.
        params: the params (or `jax.ShapeDtypeStruct`s) the state belongs to.
        where: a selector of the paths to reset (see `gradtx.paths`).

    Examples:
        >>> tx = gradtx.adam(0.1)
        >>> params = {"a": jnp.ones(2), "b": jnp.ones(2)}
        >>> _, state = tx.update({"a": jnp.ones(2), "b": jnp.ones(2)}, tx.init(params))
        >>> state = gradtx.reset(tx, state, params, "a")
        >>> int(state["count"]["a"]), int(state["count"]["b"])
        (0, 1)
    """
    chosen = set(select(params, where, argument="reset(where=...)"))
    paths = set(present_paths(params))
    fresh = state_dict(tx.init(params))
    renewed = {key: value for key, value in fresh.items() if owning_path(key, paths) in chosen}
    new_state, _ = load_state_dict(tx, params, {**state_dict(state), **renewed})
    return new_state
