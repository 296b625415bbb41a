"""Tree utilities: arithmetic, reductions and access, with trees matched by path.

Trees combine by path, not by position (a dict and a dataclass with the same paths combine);
`None` leaves stay `None` and reductions skip them; reductions accumulate in at least float32.
"""

from gradtx._tree.access import get, set
from gradtx._tree.arithmetic import (
    add,
    add_scale,
    cast,
    cast_like,
    clip,
    div,
    full_like,
    map_with_path,
    mul,
    ones_like,
    scale,
    sub,
    where,
    zeros_like,
)
from gradtx._tree.reductions import allclose, max, min, norm, size, sum, vdot

__all__ = [
    "add",
    "add_scale",
    "allclose",
    "cast",
    "cast_like",
    "clip",
    "div",
    "full_like",
    "get",
    "map_with_path",
    "max",
    "min",
    "mul",
    "norm",
    "ones_like",
    "scale",
    "set",
    "size",
    "sub",
    "sum",
    "vdot",
    "where",
    "zeros_like",
]
