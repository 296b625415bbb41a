"""Bounded caches: what every trace would compute again, kept until a cache fills up."""

from __future__ import annotations

from typing import Any, TypeVar

V = TypeVar("V")


def remember(cache: dict, key: Any, value: V, limit: int) -> V:
    """Store `value` under `key` and return it.

    A cache holding `limit` entries is emptied first, so that a program that builds many
    distinct structures cannot grow it forever.
    """
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value
    return value
