"""Contrib's shared step-size math: param copies, inner products, bias corrections."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import compute_dtype, init_slots, zeros_for
from gradtx._core.protocol import Params
from gradtx._paths.paths import flatten
from gradtx._tree.reductions import arrays_of


def copy_of(param: Any) -> jax.Array:
    """A copy of `param` (its own buffer, so params and state can both be donated).

    A `jax.ShapeDtypeStruct` has no values: it gives zeros of its shape and dtype, which is
    what restoring a checkpoint into `init(abstract_params)` needs.
    """
    if isinstance(param, jax.ShapeDtypeStruct):
        return zeros_for(param)
    return jnp.array(param, copy=True)


def copies_of(params: Params) -> Mapping[str, Any]:
    """`{path: copy_of(param)}` for every non-`None` leaf (a packed unit: a copy of each buffer)."""
    return init_slots(params, lambda p: {"copy": copy_of(p)}, ("copy",))["copy"]


def positive_int(owner: str) -> Callable[[Any, str], int]:
    """A field converter to an int of at least 1; anything else raises, naming `owner`."""

    def convert(value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            short = name.rsplit(".", 1)[-1]
            raise ValueError(f"{owner}: `{short}` must be an integer >= 1, got {value!r}")
        return int(value)

    return convert


def needs_params_error(owner: str) -> ValueError:
    """The error for a transformation called without the params it needs."""
    return ValueError(f"{owner} needs the params: call `tx.update(updates, state, params)`.")


def paired_arrays(tree: Any, by_path: dict[str, Any]) -> list[tuple[jax.Array, jax.Array]]:
    """`(leaf_array, by_path[path]_array)` for every non-`None` leaf of `tree`.

    Packed units give one pair per buffer. A path missing from `by_path` is an error that
    names it.
    """
    out = []
    paths, leaves, _ = flatten(tree)
    for path, leaf in zip(paths, leaves):
        if leaf is None:
            continue
        if path not in by_path:
            raise KeyError(
                f"the state has no entry for path {path!r} (state paths: "
                f"{list(by_path)[:6]}); call `gradtx.reconcile(tx, state, params)` after "
                "changing the params."
            )
        out.extend(zip(arrays_of(leaf), arrays_of(by_path[path])))
    return out


def scalar_copy(value: Any) -> jax.Array:
    """A float32 scalar in a buffer of its own.

    A hyperparameter leaf must not be aliased by the state, or donating the state would
    donate the transformation's leaf too.
    """
    return jnp.array(value, dtype=jnp.float32, copy=True)


def bias_correction(decay: jax.Array, t: jax.Array) -> jax.Array:
    """`1 - decay**t` to full float32 precision: `-expm1(t * log1p(decay - 1))`.

    Written as `1 - decay**t` it loses up to 5 digits in float32 for `decay` near 1 and small
    `t` (`1 - 0.999**2`), which D-Adaptation's global step-size estimate then amplifies.
    """
    return -jnp.expm1(t * jnp.log1p(decay - 1))


def flat_dot(pairs: list[tuple[jax.Array, jax.Array]]) -> jax.Array:
    """The inner product of two trees given as `(a, b)` pairs of arrays, in float32.

    Each pair's products are summed by one reduction, which XLA fuses with the product: a
    single read of both arrays. (A sum in a fixed pairwise order, halving the array with
    elementwise adds, wrote the products out and read them back, which made DoG's step far
    slower on large leaves (benchmarks/lab/kernels.py). The donated and plain compilations of a
    step still agree bit for bit.)
    """
    total = jnp.zeros((), jnp.float32)
    for a, b in pairs:
        dtype = compute_dtype(a, b)
        total = total + jnp.sum(a.astype(dtype) * b.astype(dtype)).astype(jnp.float32)
    return total
