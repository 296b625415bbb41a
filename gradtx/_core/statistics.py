"""Statistics kept in a transformation's state, marked so that `gradtx.stats` can find them.

A statistics dict is a plain `dict`, and its keys carry the mark: each is a `StatisticName`,
a `str` in every respect but its type. JAX flattens and rebuilds a plain dict in C++ on
every jitted call and keeps its key objects in the tree structure, so the mark survives
`jit`, `tree_map`, checkpoints and every other rebuild from a structure. (A registered dict
subclass costs two Python calls per call instead, about 3 microseconds of a small step's
host time per statistics dict.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

import jax
from jax import lax

from gradtx._core.module import Module
from gradtx._paths.paths import map_with_old


class KeepsStatistics:
    """A transformation whose state keeps statistics that its step never reads.

    Each such class has a static field `keep_statistics` (default `True`); set to `False`,
    its state holds none of them and its step computes none (`gradtx.without_statistics`).
    """

    __slots__ = ()
    keep_statistics: bool  # each class's own static field

    def without_statistics(self) -> Any:
        """This transformation, its state without the statistics."""
        return cast(Module, self).replace(keep_statistics=False)  # a mixin of Module classes


class StatisticName(str):
    """A key of a statistics dict: a `str` to every reader, its type the mark."""

    __slots__ = ()


def statistics(
    entries: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), /, **named: Any
) -> dict:
    """A dict of named statistics, its keys marked (`StatisticName`).

    It is a plain dict to every reader: the same keys, `state["global_norm"]` indexing and
    `state_dict` keys. `gradtx.stats` reports the array entries of every statistics dict it
    finds. A nested one holds per-path values (`norm/enc/w`). Any other entry, such as a
    wrapper's `inner` state, is searched in turn. An empty one is an empty dict: it has no
    statistic to report.

    Args:
        entries: a mapping or `(name, value)` pairs.
        **named: more entries by name.

    Returns:
        A `dict` with the same entries, each key a `StatisticName`.

    Examples:
        >>> s = statistics(global_norm=jnp.float32(5.0))
        >>> is_statistics(s), s["global_norm"]
        (True, Array(5., dtype=float32))
    """
    return {StatisticName(k): v for k, v in dict(entries, **named).items()}


def is_statistics(x: Any) -> bool:
    """Whether `x` is a statistics dict (made by `statistics`, or rebuilt from its structure)."""
    return isinstance(x, dict) and any(type(k) is StatisticName for k in x)


def reading_replaced(new_state: Any, old_state: Any) -> Any:
    """`new_state` in which each scalar statistic reads the value it replaces.

    A statistic is written and never read, so a jitted step that donates the state leaves
    its old value unused. JAX drops unused inputs, and their donation with them, then gives
    the donated buffers left to the outputs of the same shape and dtype in order: behind a
    statistic, every later scalar goes to the buffer of the one before it, and XLA copies
    scalars to keep those aliases (4 copies in schedule-free AdamW's step, whose weight sum
    and largest rate follow the scheduled learning rate). Selecting the new value over the
    old keeps the old one an input; XLA then removes the select, and each donated buffer
    takes its own new value. A statistic is a leaf whose own key is a `StatisticName`.
    """

    def read(key_path: tuple, new: Any, old: Any) -> Any:
        statistic = bool(key_path) and type(getattr(key_path[-1], "key", None)) is StatisticName
        same = isinstance(new, jax.Array) and isinstance(old, jax.Array)
        if statistic and same and new.shape == old.shape == () and new.dtype == old.dtype:
            return lax.select(True, new, old)
        return new

    return map_with_old(read, new_state, old_state)
