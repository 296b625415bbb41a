"""Statistics kept in a transformation's state, marked so that `gradtx.stats` can find them."""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["Statistics"]


class Statistics(dict):
    """A dict of named statistics inside a transformation's state.

    It is a plain dict to every reader, with the same keys, the same `state["global_norm"]`
    indexing and the same `state_dict` keys, and it flattens like a dict. Its type is the
    marker: `gradtx.stats` reports the array entries of every `Statistics` it finds. A nested
    `Statistics` holds per-path values (`norm/enc/w`). Any other entry, such as a wrapper's
    `inner` state, is searched in turn.
    """

    __slots__ = ()


def _flatten_with_keys(stats: Statistics) -> tuple[tuple, tuple]:
    keys = tuple(sorted(stats))  # the order JAX gives a plain dict
    return tuple((jax.tree_util.DictKey(k), stats[k]) for k in keys), keys


def _flatten(stats: Statistics) -> tuple[list, tuple]:
    # Called on every jitted call that passes the state in or out: a list comprehension
    # over sorted keys costs a third less than a generator over a tuple of them.
    keys = sorted(stats)
    return [stats[k] for k in keys], tuple(keys)


def _unflatten(keys: tuple, children: Any) -> Statistics:
    return Statistics(zip(keys, children))


jax.tree_util.register_pytree_with_keys(Statistics, _flatten_with_keys, _unflatten, _flatten)
