"""Target networks: a slow copy of the params, moved by Polyak averaging or copied periodically.

Both functions match the two trees by path (a dict of new values updates a dataclass
target) and return a tree shaped like the target, each leaf in the target's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gradtx._core.lift import compute_dtype
from gradtx._layouts.packed import check_same_layout
from gradtx._paths.paths import is_unit
from gradtx._tree.arithmetic import aligned


def _pairs(fn: str, new_tensors: Any, old_tensors: Any) -> tuple[Any, list[tuple[Any, Any]]]:
    """`(treedef of old_tensors, [(new leaf, old leaf) per path of old_tensors])`.

    Raises a `ValueError` naming the first path one tree has and the other lacks, or the
    first path whose shapes differ.
    """
    treedef, paths, (olds, news) = aligned(
        fn, ["old_tensors", "new_tensors"], [old_tensors, new_tensors]
    )
    pairs = []
    for path, old, new in zip(paths, olds, news):
        if new is not None and old is not None:
            if is_unit(new) or is_unit(old):
                unit, other = (old, new) if is_unit(old) else (new, old)
                check_same_layout(unit, other, fn, path)
            elif jnp.shape(new) != jnp.shape(old):
                raise ValueError(
                    f"{fn}: at path {path!r} `new_tensors` has shape {jnp.shape(new)} but "
                    f"`old_tensors` has shape {jnp.shape(old)}."
                )
        pairs.append((new, old))
    return treedef, pairs


def _each(f: Callable[[Any, Any], Any], new: Any, old: Any) -> Any:
    """`f(new, old)` on one pair of leaves, buffer by buffer for packed params."""
    if is_unit(old):
        return old.map(lambda o, n: f(n, o), new)
    return f(new, old)


def _scalar(value: Any, name: str, fn: str) -> jax.Array:
    array = jnp.asarray(value)
    if array.ndim != 0:
        raise ValueError(f"{fn}: `{name}` must be a scalar, got shape {array.shape}.")
    return array


def incremental_update(new_tensors: Any, old_tensors: Any, step_size: Any) -> Any:
    r"""Polyak averaging of a target network: $\theta' = \tau\,\theta + (1 - \tau)\,\bar\theta$.

    Moves the target $\bar\theta$ (`old_tensors`, for example a moving average of the
    params for evaluation, or the target network of temporal-difference learning) a fraction
    $\tau$ = `step_size` of the way towards the online values $\theta$ (`new_tensors`). The
    arithmetic runs in at least float32 and each result is rounded once to the target's
    dtype. A path where `new_tensors` is `None` keeps its target value (optax returns `None`
    there); a path where the target is `None` stays `None`.

    Args:
        new_tensors: the latest values (the online params).
        old_tensors: the target: a tree with the same paths and shapes (any container).
        step_size: $\tau$, a scalar, usually small (e.g. 0.005); 1 copies `new_tensors`.

    Returns:
        The new target, shaped like `old_tensors`.

    Examples:
        >>> online = {"w": jnp.array([1.0, 2.0])}
        >>> target = {"w": jnp.zeros(2)}
        >>> gradtx.incremental_update(online, target, step_size=0.25)
        {'w': Array([0.25, 0.5 ], dtype=float32)}

    References:
        Polyak and Juditsky, *Acceleration of stochastic approximation by averaging*, SIAM
        Journal on Control and Optimization, 1992; Lillicrap et al., *Continuous control with
        deep reinforcement learning*, 2016 (https://arxiv.org/abs/1509.02971).
    """
    fn = "incremental_update"
    tau = _scalar(step_size, "step_size", fn)
    treedef, pairs = _pairs(fn, new_tensors, old_tensors)

    def mix(new: Any, old: Any) -> Any:
        old = jnp.asarray(old)
        dtype = compute_dtype(jnp.asarray(new), old, tau)
        t = tau.astype(dtype)
        out = t * jnp.asarray(new).astype(dtype) + (1 - t) * old.astype(dtype)
        return out.astype(old.dtype)

    out = [old if new is None or old is None else _each(mix, new, old) for new, old in pairs]
    return treedef.unflatten(out)


def periodic_update(new_tensors: Any, old_tensors: Any, steps: Any, update_period: Any) -> Any:
    r"""A target network copied from the online params every `update_period` steps.

    Returns `new_tensors` (in the target's dtypes and container) when `steps` is a multiple
    of `update_period`, and `old_tensors` otherwise: $\bar\theta' = \theta$ if
    $t \bmod K = 0$, else $\bar\theta$. The choice is made with `jax.lax.cond`, so it runs
    under `jit` with a traced step count. A path where `new_tensors` is `None` keeps its
    target value.

    Args:
        new_tensors: the latest values (the online params).
        old_tensors: the target: a tree with the same paths and shapes (any container).
        steps: $t$, the number of update steps of the online params (an integer scalar).
        update_period: $K \ge 1$, the number of steps between two copies.

    Returns:
        The new target, shaped like `old_tensors`.

    Examples:
        >>> online, target = {"w": jnp.ones(2)}, {"w": jnp.zeros(2)}
        >>> gradtx.periodic_update(online, target, steps=3, update_period=2)["w"]
        Array([0., 0.], dtype=float32)
        >>> gradtx.periodic_update(online, target, steps=4, update_period=2)["w"]
        Array([1., 1.], dtype=float32)

    References:
        Mnih et al., *Human-level control through deep reinforcement learning*, Nature, 2015;
        Grill et al., *Bootstrap your own latent*, 2020 (https://arxiv.org/abs/2006.07733).
    """
    fn = "periodic_update"
    if isinstance(update_period, (int, np.integer)) and not isinstance(update_period, bool):
        if update_period < 1:
            raise ValueError(f"{fn}: `update_period` must be >= 1, got {update_period!r}.")
    for name, value in (("steps", steps), ("update_period", update_period)):
        array = _scalar(value, name, fn)
        if not jnp.issubdtype(array.dtype, jnp.integer):
            raise TypeError(f"{fn}: `{name}` must be an integer, got dtype {array.dtype}.")
    treedef, pairs = _pairs(fn, new_tensors, old_tensors)
    fresh = [
        old if new is None or old is None else _each(lambda n, o: n.astype(o.dtype), new, old)
        for new, old in pairs
    ]
    olds = [old for _, old in pairs]
    period = jnp.asarray(update_period).astype(jnp.int32)
    copy = jnp.mod(jnp.asarray(steps).astype(jnp.int32), period) == 0
    chosen = lax.cond(copy, lambda: fresh, lambda: olds)
    return treedef.unflatten(chosen)
