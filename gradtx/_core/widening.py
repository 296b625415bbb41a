"""Low-precision updates carried in float32 between the steps of a chain.

Each step rounds its output to the updates' dtype; for bfloat16 that is a software rounding
per element and per step (on CPU it made a momentum step 1.2x slower than one rounding), and
every rounding loses precision. A chain therefore widens narrow updates to float32 once,
runs its steps, and rounds once at the end.

The widened arrays remember their narrow source while the chain runs, for one reason: XLA's
CPU backend hands large reductions to a library kernel that cannot fuse a conversion shared
with other consumers, so a global norm of widened updates first wrote a float32 copy of the
whole gradient (clipped bf16 Adam ran 2.4x slower than unclipped). Reducing the narrow
source instead gives the reduction a conversion of its own, which fuses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp

__all__ = ["is_narrow", "narrow_source", "widening"]

_SOURCES: dict[int, tuple[Any, Any]] = {}


def is_narrow(x: Any) -> bool:
    """Whether `x` is a floating-point array narrower than float32 (bfloat16, float16)."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4


def narrow_source(x: Any) -> Any:
    """The narrow array `x` was widened from inside the running chain, else `x` itself."""
    entry = _SOURCES.get(id(x))
    return entry[1] if entry is not None and entry[0] is x else x


@contextlib.contextmanager
def widening() -> Iterator[Any]:
    """Yield `widen(x)`: `x` in float32 if narrow, remembered until the block ends."""
    mine: list[int] = []

    def widen(x: Any) -> Any:
        if not is_narrow(x):
            return x
        wide = x.astype(jnp.float32)
        _SOURCES[id(wide)] = (wide, x)
        mine.append(id(wide))
        return wide

    try:
        yield widen
    finally:
        for key in mine:
            _SOURCES.pop(key, None)
