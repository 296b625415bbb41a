"""SM3: adaptive steps from one accumulator per row, column, ... of each array (Anil et al.)."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import jax.numpy as jnp
from jax import lax

from gradtx._core.lift import as_stored, compute_dtype, dtype_or_none, zeros_for
from gradtx._core.module import decay_rate, hyperparam, non_negative, static
from gradtx._core.per_array import Float16Check, PerArrayTransform
from gradtx._core.update_sharding import whole


def accumulator_size(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of one array's SM3 accumulators: `(sum(shape),)`, or `()` for a scalar.

    An array of rank `k >= 1` keeps one accumulator per index of each axis (one per row and
    one per column of a matrix), stored end to end: axis 0's first, then axis 1's, ...
    """
    return (sum(shape),) if shape else ()


def _per_axis(v: Any, shape: tuple[int, ...]) -> list[Any]:
    """The accumulators of each axis, shaped to broadcast against the array (`[n, 1]`, ...)."""
    out, start = [], 0
    for axis, size in enumerate(shape):
        along = [1] * len(shape)
        along[axis] = size
        out.append(lax.slice_in_dim(v, start, start + size).reshape(along))
        start += size
    return out


def _cover_maxima(acc: Any) -> Any:
    """Each accumulator's new value: the largest `acc` over its cover set, end to end."""
    if acc.ndim == 0:
        return acc
    axes = range(acc.ndim)
    # A cover set of an empty array is empty; accumulators are never negative, so 0 is the
    # identity of the maximum there.
    # Under explicit axes each maximum keeps the split of its own dim: gather them to join.
    return jnp.concatenate(
        [whole(jnp.max(acc, axis=tuple(a for a in axes if a != i), initial=0)) for i in axes]
    )


class ScaleBySm3(PerArrayTransform):
    """SM3's per-cover-set second moments and momentum (see `scale_by_sm3`)."""

    name: ClassVar[str] = "scale_by_sm3"
    unpackable: ClassVar[str] = "keeps accumulators shaped by each array's axes"
    per_leaf_structure: ClassVar[bool] = True
    float16_check: ClassVar[Float16Check] = Float16Check(
        ("v",), "the accumulators of squared gradients", "v_dtype"
    )
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(1.0)  # 1.0: a running maximum with no decay (the paper's SM3)
    eps: Any = hyperparam(1e-8, check=non_negative)
    v_dtype: Any = static(None, converter=dtype_or_none)

    def state_keys(self) -> tuple[str, ...]:
        """The momentum `mu` and the cover-set accumulators `v`."""
        return ("mu", "v")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A zero momentum like the param and zero accumulators (in `v_dtype`)."""
        v_dtype = param.dtype if self.v_dtype is None else self.v_dtype
        return {"mu": zeros_for(param), "v": jnp.zeros(accumulator_size(param.shape), v_dtype)}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One SM3-II step for one array, then the momentum of the scaled gradient."""
        dtype = compute_dtype(g, slots["mu"], slots["v"])
        b1, b2, eps = (x.astype(dtype) for x in (self.b1, self.b2, self.eps))
        grad = g.astype(dtype)
        v = slots["v"].astype(dtype)
        shape = tuple(g.shape)
        # nu(i) = min over the cover sets holding i of their accumulators (a scalar: its own).
        nu = functools.reduce(jnp.minimum, _per_axis(v, shape)) if shape else v
        weight = jnp.where(b2 == 1, jnp.ones((), dtype), 1 - b2)
        acc = weight * (grad * grad) + b2 * nu
        if len(shape) <= 1:
            # Each element is a cover set of its own: the new accumulators are `acc` (never
            # negative), as stored. The step reads them there, so the kernel that writes them
            # in place is the only one to read the old ones; reading the old ones in the
            # momentum's kernel as well, XLA copied them (a pass over a vector's accumulators).
            new_v = as_stored(acc, slots["v"])
            acc = new_v.astype(dtype)
        else:
            new_v = as_stored(_cover_maxima(acc), slots["v"])
        scaled = grad * jnp.where(acc > 0, lax.rsqrt(acc + eps), 0)
        mu = as_stored(b1 * slots["mu"].astype(dtype) + (1 - b1) * scaled, slots["mu"])
        return mu, {"mu": mu, "v": new_v}


def scale_by_sm3(
    b1: float = 0.9, b2: float = 1.0, eps: float = 1e-8, *, v_dtype: Any = None
) -> ScaleBySm3:
    r"""Rescale updates by SM3's memory-efficient second moments, then take their momentum.

    SM3 (Anil et al., 2019) keeps one accumulator per *cover set* instead of one per element:
    here the cover sets of an array of rank $k$ are its slices along each axis (the rows and
    the columns of a matrix), so an $n\times m$ matrix keeps $n + m$ numbers. A vector's cover
    sets are its elements (diagonal AdaGrad) and a scalar keeps one accumulator. Per path, for
    element $i$ of the gradient $g_t$ (SM3-II):

    $$\nu_t(i) = \min_{r \ni i} \mu_{t-1}(r),\qquad
      a_t(i) = c\, g_t(i)^2 + \beta_2 \nu_t(i),\qquad
      \mu_t(r) = \max_{j \in r} a_t(j)$$

    with $c = 1$ when $\beta_2 = 1$ (sums of squares, as in the paper) and $c = 1 - \beta_2$
    otherwise (exponential averages). The update is the momentum of the scaled gradient,

    $$s_t = g_t / \sqrt{a_t + \epsilon}\ \ (0 \text{ where } a_t = 0),\qquad
      m_t = \beta_1 m_{t-1} + (1 - \beta_1)\, s_t,\qquad u_t = m_t.$$

    As in optax, $\epsilon$ is added under the square root. Packed params are refused (the
    accumulators are shaped by each array's axes).

    Args:
        b1: decay of the momentum $m$.
        b2: decay of the accumulators (1: plain sums, SM3 as published).
        eps: added to $a_t$ under the square root.
        v_dtype: dtype of the accumulators `v` (default: the parameter's dtype; float16
            params need float32 here, since squared gradients underflow in float16).

    State:
        `mu/<path>` shaped like the parameter, in the parameter's dtype; `v/<path>` the
        accumulators, shape `(sum(param.shape),)` (axis 0's first, then axis 1's, ...; shape
        `()` for a scalar), in `v_dtype`.

    Examples:
        >>> tx = gradtx.scale_by_sm3(b1=0.0)
        >>> params = {"w": jnp.zeros((2, 3))}
        >>> state = tx.init(params)
        >>> state["v"]["w"].shape  # 2 rows + 3 columns
        (5,)
        >>> u, state = tx.update({"w": jnp.array([[3.0, 0.0, 0.0], [0.0, 4.0, 0.0]])}, state)
        >>> u["w"].round(4)
        Array([[1., 0., 0.],
               [0., 1., 0.]], dtype=float32)
        >>> state["v"]["w"]  # row maxima, then column maxima, of g^2
        Array([ 9., 16.,  9., 16.,  0.], dtype=float32)

    References:
        Anil et al., "Memory-Efficient Adaptive Optimization", NeurIPS 2019.
    """
    return ScaleBySm3(b1, b2, eps, v_dtype)
