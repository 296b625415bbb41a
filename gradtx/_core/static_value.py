"""Arbitrary user values (label trees, masks, flags) kept in a transformation's static part."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _canonical(value: Any) -> Any:
    """A hashable stand-in equal for equal dicts, lists and tuples of hashable values."""
    if isinstance(value, Mapping):
        items = sorted(((repr(k), k, _canonical(v)) for k, v in value.items()), key=lambda t: t[0])
        return ("mapping", type(value).__name__, tuple((k, v) for _, k, v in items))
    if isinstance(value, (list, tuple)):
        return ("sequence", type(value).__name__, tuple(_canonical(v) for v in value))
    hash(value)  # raises TypeError for anything else that is unhashable
    return value


class StaticValue:
    """A value held in a treedef, comparable so that equal values never recompile.

    Equal dicts, lists or tuples of hashable leaves, and equal hashable objects, compare equal;
    anything else is equal only to itself.
    """

    def __init__(self, value: Any) -> None:
        self.value = value
        try:
            self._key: Any = ("value", _canonical(value))
        except TypeError:
            self._key = ("id", id(value))

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StaticValue):
            return False
        try:
            return bool(self._key == other._key)
        except Exception:  # values whose == is elementwise
            return self.value is other.value

    def __repr__(self) -> str:
        return repr(self.value)
