"""Complex parameters as two real parameters of their own (optax's `split_real_and_imaginary`)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from gradtx._core.call_checks import declared
from gradtx._core.lift import check_state_keys
from gradtx._core.module import field
from gradtx._core.protocol import Params, Transformation, Updates
from gradtx._layouts.complex import is_complex, real_dtype
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.paths import flatten, is_unit
from gradtx._paths.subset import present_paths

_PARTS = ("real", "imaginary")


def _is_split(x: Any) -> bool:
    return x is not None and not is_unit(x) and is_complex(x)


def _parts(x: Any) -> dict[str, Any]:
    """`{"real": x.real, "imaginary": x.imag}` (structs give structs of the real dtype)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        part = jax.ShapeDtypeStruct(x.shape, real_dtype(x.dtype), sharding=x.sharding)
        return {"real": part, "imaginary": part}
    return {"real": jnp.real(x), "imaginary": jnp.imag(x)}


def _split(tree: Any, like: Any = None) -> Any:
    """`tree` with each complex leaf replaced by its two parts.

    A `None` leaf is split into two `None` parts where the leaf of `like` (the params) is
    complex, so the inner transformation sees no gradient for either part.
    """
    if tree is None:
        return None
    paths, leaves, treedef = flatten(tree)
    kinds = dict(zip(*flatten(like)[:2])) if like is not None else {}
    out = []
    for path, x in zip(paths, leaves):
        if _is_split(x):
            out.append(_parts(x))
        elif x is None and _is_split(kinds.get(path)):
            out.append({"real": None, "imaginary": None})
        else:
            out.append(x)
    return treedef.unflatten(out)


def _merged(split: Any, like: Any) -> Any:
    """The inner's output on `_split(like)` with each pair of parts made complex again."""
    _, leaves, treedef = flatten(like)
    parts = treedef.flatten_up_to(split)
    out = []
    for x, y in zip(leaves, parts):
        if isinstance(y, dict) and (x is None or _is_split(x)):  # a pair this module split
            re, im = y["real"], y["imaginary"]
            if re is None or im is None:
                out.append(None)
                continue
            assert x is not None  # a `None` update was split into `None` parts, handled above
            part = real_dtype(x.dtype)
            out.append(lax.complex(re.astype(part), im.astype(part)))
        else:
            out.append(y)
    return treedef.unflatten(out)


class SplitRealAndImaginary(Transformation):
    """Run an inner transformation on real and imaginary parts (see `split_real_and_imaginary`)."""

    name: ClassVar[str] = "split_real_and_imaginary"
    inner: Any = field(converter=as_transformation)

    def state_keys(self) -> tuple[str, ...]:
        """The inner transformation's state, under `inner`."""
        return ("inner",)

    def init_state(self, params: Params) -> dict:
        """The inner state for the params with each complex leaf split in two."""
        return {"inner": self.inner.init_state(_split(params))}

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """The inner update on the split gradients and params, the pairs made complex again."""
        check_state_keys(self.name, state, self.state_keys())
        split_params = _split(params)
        split_updates = _split(updates, params)
        # Without params a `None` gradient at a complex parameter cannot be split: its parts'
        # state stays as it is, as for a declared partial update.
        absent = params is None and any(x is None for x in flatten(updates)[1])
        with declared(absent):
            new, inner = self.inner.step(split_updates, state["inner"], split_params, **extra)
        return _merged(new, updates), {"inner": inner}

    def eval_params(self, state: dict, params: Params) -> Any:
        """The inner transformation's eval weights, complex leaves made whole again."""
        check_state_keys(self.name, state, self.state_keys())
        return _merged(self.inner.eval_params(state["inner"], _split(params)), params)

    def frozen_paths(self, params: Params) -> frozenset[str]:
        """The paths the inner transformation freezes (a complex leaf: both of its parts)."""
        frozen = self.inner.frozen_paths(_split(params))
        paths, leaves, _ = flatten(params)
        out = set()
        for path, x in zip(paths, leaves):
            if _is_split(x):
                if all(f"{path}/{part}" in frozen for part in _PARTS):
                    out.add(path)
            elif path in frozen:
                out.add(path)
        return frozenset(out)

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """The inner steps of each path (of a complex leaf: those of its real part)."""
        inner = self.inner.describe(_split(params), step)
        paths, leaves, _ = flatten(params)
        complex_paths = {p for p, x in zip(paths, leaves) if _is_split(x)}
        out = {}
        for path in present_paths(params):
            key = f"{path}/real" if path in complex_paths else path
            out[path] = [(self.name, {}), *inner.get(key, [])]
        return out


def split_real_and_imaginary(inner: Any) -> SplitRealAndImaginary:
    r"""Run `inner` on the real and imaginary parts of complex leaves, as separate parameters.

    Each complex leaf $z$ at path `p` becomes two real leaves, `p/real` $= \Re z$ and
    `p/imaginary` $= \Im z$, in the params and gradients that `inner` sees; its two real
    updates come back as one complex update $u_{re} + i\, u_{im}$. Real leaves pass to
    `inner` unchanged, so on real params this is `inner` itself.

    How this relates to gradtx's own treatment of complex params: every gradtx
    transformation already treats a complex leaf as a pair of reals, as one path whose state
    is kept in the real layout `stack([re, im])` (see gradtx/_layouts/complex.py). For
    elementwise math (Adam, momentum, sign, clipping by value) the two agree exactly; the
    difference is what counts as one parameter. Here the parts are two paths, so per-path
    quantities are taken per part: a per-leaf norm (trust ratios, per-layer clipping,
    `scale_by_param_block_norm`), Muon's orthogonalisation (which treats a complex matrix as
    two real matrices here and leaves it alone natively) and the state's keys
    (`inner/mu/p/real` and `inner/mu/p/imaginary` instead of one `mu/p` of shape
    `(2, *shape)`). Global norms are the same either way. The gradient to pass for $z$ is, as
    everywhere in gradtx, `jnp.conj(jax.grad(loss)(z))`.

    Without `params`, a `None` gradient at a complex leaf cannot be split (it is not known to
    be complex), so `inner` runs as a declared partial update; with `params` it is split into
    two `None` parts.

    Args:
        inner: the transformation to run on the split tree (a gradtx or an optax one).

    State:
        `inner`: the inner transformation's state for the split params (its per-path entries
        read `.../p/real` and `.../p/imaginary` for a complex leaf `p`).

    Examples:
        >>> tx = gradtx.contrib.split_real_and_imaginary(gradtx.adam(0.1))
        >>> params = {"z": jnp.array([1.0 + 2.0j]), "b": jnp.zeros(1)}
        >>> state = tx.init(params)
        >>> sorted(k for k in gradtx.state_dict(state) if "/mu/" in k)
        ['inner/mu/b', 'inner/mu/z/imaginary', 'inner/mu/z/real']
        >>> grads = {"z": jnp.array([3.0 - 4.0j]), "b": jnp.ones(1)}
        >>> u, state = tx.update(grads, state, params)
        >>> u["z"]  # Adam's first step, -0.1 * sign, on each part
        Array([-0.1+0.1j], dtype=complex64)
    """
    return SplitRealAndImaginary(inner)
