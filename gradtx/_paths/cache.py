"""Bounded caches: what every trace would compute again, kept until a cache fills up."""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["BoundedCache"]

V = TypeVar("V")


class BoundedCache(dict):
    """A dict of results kept between traces, emptied when it reaches `limit` entries.

    A program that builds many distinct structures (a notebook rebuilding its model, a sweep
    over architectures) therefore cannot grow it forever. Every cache gradtx fills while
    tracing or dispatching is one of these (`tests/core/test_cache_bounds.py` checks it).
    """

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def remember(self, key: Any, value: V) -> V:
        """Store `value` under `key` (emptying the cache first if it is full); return it."""
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value
