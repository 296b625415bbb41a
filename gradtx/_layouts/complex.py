"""Complex parameters, treated as pairs of reals.

The convention: a complex leaf `z` behaves exactly like the real leaf
`jnp.stack([z.real, z.imag])` (shape `(2, *z.shape)`, float32 for complex64). The per-array
math runs on that real view, its update `u` comes back as `u[0] + 1j * u[1]`, and the leaf's
state is kept in the real layout. So every transformation gives, on a complex parameter,
exactly what it gives on the stacked real problem: Adam's second moment is per real
component, a norm sees both parts (`|z|^2 = re^2 + im^2`), a step count is one per path.

The gradient to pass for a complex parameter is `dL/dre + 1j * dL/dim`, the descent direction
of the pairs of reals. `jax.grad` of a real loss returns its conjugate, so pass
`jnp.conj(jax.grad(loss)(z))` (as optax asks too).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from gradtx._paths.paths import flatten


def is_complex(x: Any) -> bool:
    """True for a complex array, tracer or `jax.ShapeDtypeStruct`."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.complexfloating)


def real_dtype(dtype: Any) -> Any:
    """The dtype of the real and imaginary parts of `dtype` (float32 for complex64)."""
    return jnp.finfo(dtype).dtype


def to_real(x: Any) -> Any:
    """The real view `stack([x.real, x.imag])` of a complex array (shape `(2, *x.shape)`).

    A `jax.ShapeDtypeStruct` gives the struct of the view (without a sharding).
    """
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((2, *x.shape), real_dtype(x.dtype))
    return jnp.stack([jnp.real(x), jnp.imag(x)])


def from_real(u: Any, dtype: Any) -> Any:
    """The complex array `u[0] + 1j * u[1]` of `dtype`, from a real view `u`."""
    part = real_dtype(dtype)
    return lax.complex(u[0].astype(part), u[1].astype(part))


def check_same_kind(g: Any, param: Any, owner: str, path: str) -> None:
    """Raise if exactly one of the update and the parameter at `path` is complex."""
    if param is not None and is_complex(g) != is_complex(param):
        raise TypeError(
            f"{owner}: at path {path!r} the update has dtype {jnp.dtype(g.dtype)} but the "
            f"parameter has dtype {jnp.dtype(param.dtype)}; a complex parameter needs a complex "
            "update (and a real one a real update). Complex parameters are treated as pairs of "
            "reals: pass `jnp.conj(jax.grad(loss)(z))` for a complex `z`."
        )


def reject_complex(tree: Any, owner: str, why: str) -> None:
    """Raise a clear error naming the first complex leaf of `tree`.

    For a transformation whose math has no pairs-of-reals form; `why` says what it needs.
    """
    paths, leaves, _ = flatten(tree)
    for path, leaf in zip(paths, leaves):
        if leaf is not None and is_complex(leaf):
            raise TypeError(
                f"{owner}: the leaf at {path!r} is complex ({jnp.dtype(leaf.dtype)}), and "
                f"{owner} {why}, which has no pairs-of-reals form. Keep complex parameters out "
                "of it (for example with `gradtx.partition`)."
            )


def reject_complex_packed(buffers: Any, owner: str, path: str) -> None:
    """Raise a clear error for packed params holding a complex buffer."""
    if any(is_complex(b) for b in buffers):
        raise TypeError(
            f"{owner}: the packed params at {path!r} hold a complex buffer; complex parameters "
            "are not supported in packed params. Keep the complex leaves out of `gradtx.pack` "
            "(they work unpacked, treated as pairs of reals)."
        )
