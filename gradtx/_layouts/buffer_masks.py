"""The selection of a packed buffer's elements as a bool array a step can use.

A selection (a mask, a partition) that covers some leaves of a packed buffer is a bool array
shaped like the buffer. Small ones are constants of the step; large ones are built in the step
from a constant a 32nd of their size or smaller.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gradtx._layouts.packed import LARGE_LEAF
from gradtx._paths.cache import BoundedCache


def mask_array(mask: np.ndarray) -> Any:
    """The selection of a packed buffer as a bool array for the step."""
    # Below LARGE_LEAF elements a constant costs nothing measurable to compile, and it keeps
    # small buffers' results bit-for-bit those of the per-leaf layout.
    return _selection(mask) if mask.size >= LARGE_LEAF else jnp.asarray(mask)


# Each mask's coarse form, by the mask's identity (a layout keeps its masks, read-only, so a
# trace of the same step finds them here instead of packing a large mask again).
_COARSE: BoundedCache = BoundedCache(16)


def _coarse_mask(mask: np.ndarray) -> tuple[np.ndarray, int, np.ndarray | None]:
    """`mask` with an element per run of `2**shift` elements, `shift`, and the bits.

    The bits are the coarse mask's in little-endian 32-bit words, for a `shift` under 5
    (else `None`). `shift` is the largest (at most 16) for which every run of equal
    elements starts at a multiple of `2**shift`: leaves whose sizes are multiples of 32 or
    more (most kernels and biases) need one element per 32 or more, and the mask shrinks
    as much.
    """
    held = _COARSE.get(id(mask))
    if held is not None and held[0] is mask:
        return held[1]
    starts = np.flatnonzero(mask[1:] != mask[:-1]) + 1
    shift = 16
    if starts.size:
        lowest = int(np.bitwise_or.reduce(starts))
        shift = min(shift, (lowest & -lowest).bit_length() - 1)
    coarse = np.ascontiguousarray(mask[:: 1 << shift])
    words = None
    if shift < 5:
        words = np.packbits(coarse, bitorder="little")
        words = np.pad(words, (0, -words.size % 4)).view("<u4")
    return _COARSE.remember(id(mask), (mask, (coarse, shift, words)))[1]


def _selection(mask: np.ndarray) -> jax.Array:
    """The 1-D bool `mask` of a large buffer, built in the step from a small constant.

    As a bool constant, XLA embeds a byte per element in the program: on 2000 leaves packed
    in millions of elements that doubled the compile time of masked weight decay
    (benchmarks/compile_time.py). A mask whose runs start at multiples of 32 or more elements
    is its coarse form (a byte per run of `2**shift`) broadcast over each run; any other is
    read from its bits packed in 32-bit words, a bit per element. Both constants are at
    most a 32nd of the bool mask. Small masks stay constants, which cost nothing.
    """
    coarse, shift, words = _coarse_mask(mask)
    if words is None:
        # Broadcast, not a gather of bits: XLA's kernel reads it with plain index arithmetic,
        # a little faster to run and to compile (benchmarks/lab/layouts.py, packed workloads).
        runs = lax.broadcast_in_dim(jnp.asarray(coarse), (coarse.size, 1 << shift), (0,))
        return lax.slice(runs.reshape(-1), (0,), (mask.size,))
    i = lax.iota(jnp.uint32, mask.size) >> shift
    word = jnp.asarray(words).at[i >> 5].get(mode="promise_in_bounds")
    return ((word >> (i & 31)) & 1).astype(jnp.bool_)
