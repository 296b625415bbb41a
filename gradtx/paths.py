"""Paths and selectors: a parameter's identity is its path in the tree.

A leaf's path is its key path joined with `/` (`enc/layers/0/w`). Selectors pick leaves by
path; every `mask=`, `where=` and label argument of gradtx accepts the same forms (see
`select`).
"""

from gradtx._paths.paths import DuplicatePathError, flatten, leaves, paths, unflatten
from gradtx._paths.selectors import (
    LabelError,
    Selector,
    SelectorError,
    as_selector,
    resolve_labels,
    select,
)

__all__ = [
    "DuplicatePathError",
    "LabelError",
    "Selector",
    "SelectorError",
    "as_selector",
    "flatten",
    "leaves",
    "paths",
    "resolve_labels",
    "select",
    "unflatten",
]
