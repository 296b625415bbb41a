"""Low-precision updates carried in float32 between the steps of a chain.

Each step rounds its output to the updates' dtype; for bfloat16 that is a software rounding
per element and per step (slower on the CPU than one rounding: benchmarks/lab/moments.py), and
every rounding loses precision. A chain therefore widens narrow updates to float32 once,
runs its steps, and rounds once at the end.

The widened arrays remember their narrow source while the chain runs, for one reason: XLA's
CPU backend hands large reductions to a library kernel that cannot fuse a conversion shared
with other consumers, so a global norm of widened updates first wrote a float32 copy of the
whole gradient (clipped bf16 Adam ran far slower than unclipped). Reducing the narrow
source instead gives the reduction a conversion of its own, which fuses.

A chain's result is not always rounded back, though: an update comes out in the promoted
dtype of its gradient and of the per-path state it read (bfloat16 params with float32 Adam
moments give a float32 update, which `apply_updates` adds in float32 and rounds once to the
parameter's dtype). The lifting helper notes, while a chain runs, the dtypes of the state each
path read (`note_state_read`), and the chain rounds each path back to the promoted dtype of its
gradient and that state (`update_dtype`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from gradtx._core.update_sharding import like
from gradtx._paths.cache import bounded_lru_cache

_SOURCES: dict[int, tuple[Any, Any]] = {}
# One record per running chain (innermost last): `{key: dtype}`, the promoted dtype of the
# floating state read for each path (a packed buffer's key is `(path, buffer index)`).
_READS: list[dict[Any, Any]] = []


def is_narrow(x: Any) -> bool:
    """Whether `x` is a floating-point array narrower than float32 (bfloat16, float16)."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize < 4


def narrow_source(x: Any) -> Any:
    """The narrow array `x` was widened from inside the running chain, else `x` itself."""
    entry = _SOURCES.get(id(x))
    return entry[1] if entry is not None and entry[0] is x else x


@bounded_lru_cache(1024)
def promoted(*dtypes: Any) -> Any:
    """The dtype that standard promotion gives `dtypes`, even under strict promotion.

    The dtypes are combined on purpose. Cached: entering the promotion context costs
    microseconds, and per-leaf math asks once per leaf on every trace.
    """
    with jax.numpy_dtype_promotion("standard"):
        return functools.reduce(jnp.promote_types, dtypes)


def note_state_read(key: Any, dtype: Any) -> None:
    """Note that the update at `key` read floating state of `dtype` (no-op outside a chain)."""
    for reads in _READS:
        held = reads.get(key)
        reads[key] = dtype if held is None else promoted(held, dtype)


class Widening:
    """What a running chain needs: `widen(x)` and the dtypes of the state read per path."""

    def __init__(self) -> None:
        self.reads: dict[Any, Any] = {}
        self._mine: list[int] = []

    def widen(self, x: Any) -> Any:
        """`x` in float32 if narrow (remembered until the block ends), else `x`."""
        if not is_narrow(x):
            return x
        wide = x.astype(jnp.float32)
        _SOURCES[id(wide)] = (wide, x)
        self._mine.append(id(wide))
        return wide

    def update_dtype(self, key: Any, given: Any) -> Any:
        """The dtype of the update at `key` whose gradient came in `given`'s dtype.

        It is the promoted dtype of the gradient and of the state read for it.
        """
        read = self.reads.get(key)
        return given.dtype if read is None else promoted(given.dtype, read)


@contextlib.contextmanager
def widening() -> Iterator[Widening]:
    """Yield a `Widening` that holds its widened arrays and state reads until the block ends."""
    block = Widening()
    _READS.append(block.reads)
    try:
        yield block
    finally:
        # By identity: an inner chain's record may equal (==) an outer one's.
        _READS[:] = [reads for reads in _READS if reads is not block.reads]
        for key in block._mine:
            _SOURCES.pop(key, None)


def shaped_like(tree: Any, shapes: Any) -> Any:
    """`tree` with each array in the dtype of the matching leaf of `shapes`.

    For the branch of a `lax.cond` that passes updates through (or zeroes them) next to one
    that runs a transformation: that one's updates may come out wider than the gradient
    (float32 from float32 state), and both branches must give the same types. Widening is
    exact, so the passed-through values are unchanged. Under explicit mesh axes the
    sharding is part of the type too, so each array also takes its leaf's sharding.
    """

    def shaped(x: Any, s: Any) -> Any:
        return like(x if x.dtype == s.dtype else x.astype(s.dtype), s)

    return jax.tree.map(shaped, tree, shapes)
