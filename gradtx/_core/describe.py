"""Helpers for `Transformation.describe`: present paths and a transformation's hyperparameters."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from gradtx._core.module import Module
from gradtx._paths.subset import present_paths

__all__ = ["merge_descriptions", "own_hyperparams", "present_paths"]


def _value(value: Any, step: Any) -> Any:
    if isinstance(value, Module) or callable(value):
        value = value(np.int32(step))
    if isinstance(value, (jax.Array, np.ndarray, np.generic, float, int)):
        array = np.asarray(value)
        if array.shape == () and np.issubdtype(array.dtype, np.number):
            return float(array) if np.issubdtype(array.dtype, np.floating) else int(array)
    return None


def own_hyperparams(tx: Any, step: Any = 0) -> dict[str, Any]:
    """`{name: value}` of the scalar numeric fields of `tx`, schedules evaluated at `step`.

    Sub-transformations and non-scalar fields are left out.
    """
    from gradtx._core.protocol import Transformation

    out: dict[str, Any] = {}
    if not dataclasses.is_dataclass(tx):
        return out
    for name in getattr(type(tx), "_data_names", ()):
        value = getattr(tx, name)
        if isinstance(value, Transformation) or value is None:
            continue
        try:
            shown = _value(value, step)
        except Exception:  # a schedule that cannot run on a concrete step: not shown
            shown = None
        if shown is not None:
            out[name] = shown
    return out


def merge_descriptions(*parts: dict[str, list]) -> dict[str, list]:
    """Concatenate per-path step lists, in order (a chain's description)."""
    out: dict[str, list] = {}
    for part in parts:
        for path, steps in part.items():
            out.setdefault(path, []).extend(steps)
    return out
