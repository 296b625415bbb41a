"""Bounded caches: what every trace would compute again, kept until a cache fills up."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

V = TypeVar("V")
F = TypeVar("F", bound=Callable[..., Any])

# Every cache below by `id`, so that `clear_all` can empty them (weakly held: a packed
# layout's cache goes with its layout; a dict cannot be in a `WeakSet`, it has no hash).
_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class BoundedCache(dict):
    """A dict of results kept between traces, emptied when it reaches `limit` entries.

    A program that builds many distinct structures (a notebook rebuilding its model, a sweep
    over architectures) therefore cannot grow it forever. Every cache gradtx fills while
    tracing or dispatching is one of these or a `bounded_lru_cache`
    (`tests/core/test_cache_bounds.py` checks it).
    """

    __slots__ = ("limit", "__weakref__")

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        _LIVE[id(self)] = self

    def remember(self, key: Any, value: V) -> V:
        """Store `value` under `key` (emptying the cache first if it is full); return it."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value


def bounded_lru_cache(maxsize: int) -> Callable[[F], F]:
    """`functools.lru_cache(maxsize)`, its cache also emptied by `clear_all`."""

    def decorate(fn: F) -> F:
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        _LIVE[id(cached)] = cached
        return cached  # type: ignore[return-value]

    return decorate


def clear_all() -> None:
    """Empty every cache gradtx keeps between traces, as in a fresh process.

    The benchmarks call it beside `jax.clear_caches()`, so that a timed compile pays what a
    program's first compile pays. What is cached is only ever recomputed, so this changes
    no result.
    """
    for cache in list(_LIVE.values()):
        if isinstance(cache, BoundedCache):
            cache.clear()
        else:
            cache.cache_clear()
