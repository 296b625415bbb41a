"""The weights to evaluate and save: what averaging methods keep beside the params."""

from __future__ import annotations

from typing import Any

from gradtx._core.protocol import Params, State
from gradtx._optax.wrapped import as_transformation


def eval_params(tx: Any, state: State, params: Params) -> Any:
    """The weights to evaluate and checkpoint, given the state and params after a step.

    Some methods train at one point and should be evaluated at another: `schedule_free`
    takes gradients at its interpolation point and evaluates its average $x$, `lookahead`
    evaluates its slow weights, `ema_params` a moving average of the params. For every
    other transformation the eval weights are the params themselves. Combinators answer for
    their children, path by path: in a `partition` or under `masked`, the paths of a group
    get the eval weights of that group's transformation and the other paths keep their
    params; a `chain` applies its children's in order. Nothing is modified: the result is
    a new tree with the structure of `params`, each leaf in its parameter's dtype (leaves
    that need no change are the params' own arrays). It works under `jax.jit`.

    Args:
        tx: the transformation (gradtx or optax-style; optax ones evaluate their params).
        state: `tx`'s state after the last update (as returned by `tx.update`).
        params: the params after that update was applied (the params that `tx` trains,
            matched to the state by path).

    Returns:
        A tree shaped like `params`.

    Examples:
        >>> tx = gradtx.schedule_free_sgd(1.0, b1=0.5)
        >>> params = {"w": jnp.zeros(1), "b": jnp.zeros(1)}
        >>> state = tx.init(params)
        >>> for _ in range(2):
        ...     u, state = tx.update({"w": jnp.ones(1), "b": jnp.ones(1)}, state, params)
        ...     params = gradtx.apply_updates(params, u)
        >>> params["w"], gradtx.eval_params(tx, state, params)["w"]
        (Array([-1.75], dtype=float32), Array([-1.5], dtype=float32))
        >>> adam = gradtx.adam(0.1)
        >>> gradtx.eval_params(adam, adam.init(params), params) is params
        True
    """
    return as_transformation(tx, "eval_params(tx)").eval_params(state, params)
