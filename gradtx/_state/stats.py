"""`stats`: every statistic an optimizer state holds, as one flat dict of scalars."""

from __future__ import annotations

from typing import Any

import jax

from gradtx._combinators.inject import InjectState
from gradtx._core.protocol import State
from gradtx._core.statistics import is_statistics
from gradtx._layouts.packed import join_path
from gradtx._paths.paths import path_of


def _is_marked(x: Any) -> bool:
    return isinstance(x, InjectState) or is_statistics(x)


def _collect(tree: Any, prefix: str, out: dict[str, Any], hyperparams: bool = True) -> None:
    found, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_marked)
    for key_path, node in found:
        where = join_path(prefix, path_of(key_path))
        if isinstance(node, InjectState):
            if hyperparams:
                for name, value in node.hyperparams.items():
                    out[join_path(where, f"hyperparams/{name}")] = value
            _collect(node.inner, join_path(where, "inner"), out, hyperparams)
        elif is_statistics(node):
            for name in sorted(node):
                value = node[name]
                if is_statistics(value):  # per-path values: every leaf is one
                    per_path, _ = jax.tree_util.tree_flatten_with_path(value)
                    for kp, leaf in per_path:
                        out[join_path(where, f"{name}/{path_of(kp)}")] = leaf
                elif getattr(value, "shape", None) == ():  # a scalar (also traced)
                    out[join_path(where, name)] = value
                else:  # a wrapper's inner state: its statistics are found in turn
                    _collect(value, join_path(where, name), out, hyperparams)


def statistics_in(state: State) -> dict[str, jax.Array]:
    """The statistics of `state` alone, by `state_dict` key.

    That is `stats` less the injected hyperparameters: the readings of the last step, which
    a state converted from optax starts anew.
    """
    out: dict[str, jax.Array] = {}
    _collect(state, "", out, hyperparams=False)
    return out


def stats(state: State) -> dict[str, jax.Array]:
    """Every statistic in an optimizer state: `{key: scalar array}`, flat and readable.

    It collects the statistics of every `gradtx.monitor` (`grad/global_norm`,
    `grad/norm/enc/w`, ...) and those that transformations keep anyway: the pre-clip norm of
    `clip_by_global_norm` and whether it clipped, the skipped-step counts of `apply_if_finite`
    (`notfinite_count`, consecutive; `total_notfinite`) and whether its last step was finite,
    the number of examples the per-example clipping transformations clipped (`num_clipped`),
    the hyperparameters of `inject_hyperparams` as used at the last step (a scheduled
    learning rate's current value), and the value a plain schedule gave the last step
    (`scheduled/learning_rate` for `adamw(schedule)`, `scheduled/step_size` for
    `scale_by_schedule`). Keys are the same as `state_dict`'s: the names of the
    enclosing steps and groups, then the statistic (`encoder/grad/global_norm` for a monitor
    named `grad` in a `partition` group `encoder`).

    The arrays are returned as they are in the state: no copy, no computation and no host
    synchronisation, so it is cheap to call every step, also inside `jit`. Converting a value
    to a Python number (`float(...)`, printing, logging) waits for the step that made it.

    Args:
        state: the state of any gradtx transformation.

    Returns:
        `{key: scalar array}`, in the state's tree order.

    Examples:
        >>> tx = gradtx.chain(gradtx.monitor("grad"), gradtx.clip_by_global_norm(1.0))
        >>> _, state = tx.update({"w": jnp.array([3.0, 4.0])}, tx.init({"w": jnp.zeros(2)}))
        >>> for key, value in gradtx.stats(state).items():
        ...     print(key, value)
        clip_by_global_norm/clipped True
        clip_by_global_norm/global_norm 5.0
        grad/global_norm 5.0
    """
    out: dict[str, jax.Array] = {}
    _collect(state, "", out)
    return out
