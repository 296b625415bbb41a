"""Guards: NaN updates replaced by zeros, params kept non-negative."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import compute_dtype
from gradtx._core.per_array import PerArrayTransform


class ZeroNans(PerArrayTransform):
    """Replace NaNs by zeros and record which paths had any (see `zero_nans`)."""

    name: ClassVar[str] = "zero_nans"
    per_leaf_structure: ClassVar[bool] = True

    def state_keys(self) -> tuple[str, ...]:
        """`found_nan`: whether the path's last update held a NaN."""
        return ("found_nan",)

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """`found_nan = False`."""
        return {"found_nan": jnp.zeros((), jnp.bool_)}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = where(isnan(g), 0, g)`; `found_nan = any(isnan(g))`."""
        nan = jnp.isnan(g)
        return jnp.where(nan, jnp.zeros_like(g), g), {"found_nan": jnp.any(nan)}


def zero_nans() -> ZeroNans:
    r"""Replace NaN elements of the updates by zero: $u = g$ where $g$ is a number, else $0$.

    Infinities are kept. The state records, per path, whether the last update of that path
    held a NaN, so it can be logged; a path without an update keeps its flag.

    State:
        `found_nan/<path>`, a bool scalar.

    Examples:
        >>> tx = gradtx.zero_nans()
        >>> g = {"w": jnp.array([1.0, jnp.nan])}
        >>> u, state = tx.update(g, tx.init(g))
        >>> u["w"], state["found_nan"]["w"]
        (Array([1., 0.], dtype=float32), Array(True, dtype=bool))
    """
    return ZeroNans()


class KeepParamsNonnegative(PerArrayTransform):
    """Stop updates at zero so parameters stay non-negative (see `keep_params_nonnegative`)."""

    name: ClassVar[str] = "keep_params_nonnegative"
    needs_params: ClassVar[bool] = True

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = -param` where `param + g < 0`, else `u = g`."""
        dtype = compute_dtype(g, param)
        x, p = g.astype(dtype), param.astype(dtype)
        return jnp.where(p + x < 0, -p, x).astype(g.dtype), {}


def keep_params_nonnegative() -> KeepParamsNonnegative:
    r"""Change the updates so that the parameters stay $\ge 0$ after they are applied.

    $u = -\theta$ where $\theta + g < 0$, else $u = g$: an element that would cross zero lands
    on zero. Put it last in a chain, after the learning rate. A parameter that is already
    negative is moved to zero.

    Examples:
        >>> tx = gradtx.keep_params_nonnegative()
        >>> params = {"w": jnp.array([1.0, 0.5])}
        >>> tx.update({"w": jnp.array([-0.5, -2.0])}, {}, params)[0]["w"]
        Array([-0.5, -0.5], dtype=float32)
    """
    return KeepParamsNonnegative()
