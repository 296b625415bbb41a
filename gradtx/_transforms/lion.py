"""Lion: the sign of an interpolated momentum (Chen et al., 2023)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import as_stored, compute_dtype, dtype_or_none, zeros_for
from gradtx._core.module import decay_rate, hyperparam, static
from gradtx._core.per_array import PerArrayTransform
from gradtx._transforms.shared_args import with_shared_args

_MODES = ("hard", "smooth", "refined")


def _as_mode(value: Any, name: str = "mode") -> str:
    if not isinstance(value, str) or value not in _MODES:
        raise ValueError(f"scale_by_lion: `mode` must be one of {list(_MODES)}, got {value!r}")
    return value


class ScaleByLion(PerArrayTransform):
    """The sign of an interpolation of momentum and gradient (see `scale_by_lion`)."""

    name: ClassVar[str] = "scale_by_lion"
    b1: Any = hyperparam(0.9)
    b2: Any = hyperparam(0.99, check=decay_rate)
    mu_dtype: Any = static(None, converter=dtype_or_none)
    mode: str = static("hard", converter=_as_mode)
    smooth_beta: Any = hyperparam(None)

    def state_keys(self) -> tuple[str, ...]:
        """The momentum `mu`."""
        return ("mu",)

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A zero momentum in `mu_dtype` (default: the parameter's dtype)."""
        return {"mu": zeros_for(param, self.mu_dtype)}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`m' = b2 m + (1 - b2) g`, then `u = sign(b1 m' + (b2 - b1) g)` from the new `m'`.

        `b1 m + (1 - b1) g` equals `(b1 m' + (b2 - b1) g) / b2`, so the update can be read off
        the new momentum: XLA then reads the old momentum once, and a donated `mu` is
        overwritten in place instead of being copied first (the old one is not needed after).
        """
        dtype = compute_dtype(g, slots["mu"])
        b1, b2 = self.b1.astype(dtype), self.b2.astype(dtype)
        grad = g.astype(dtype)
        old_mu = slots["mu"].astype(dtype)
        new_mu = as_stored(b2 * old_mu + (1 - b2) * grad, slots["mu"])
        # The soft modes need the interpolation's size, not only its sign: from the old `mu`.
        x = (1 - b1) * grad + b1 * old_mu
        if self.mode == "hard":
            # b2 = 0 makes the read-off form 0 * x: then the interpolation itself.
            read_off = b1 * new_mu + (b2 - b1) * grad
            return jnp.sign(jnp.where(b2 > 0, read_off, x)), {"mu": new_mu}
        if self.mode == "smooth":
            return jnp.tanh(self.smooth_beta.astype(dtype) * x), {"mu": new_mu}
        return jnp.where(jnp.abs(x) < 1, x, jnp.sign(x)), {"mu": new_mu}


@with_shared_args
def scale_by_lion(
    b1: float = 0.9,
    b2: float = 0.99,
    mu_dtype: Any = None,
    *,
    mode: str = "hard",
    smooth_beta: float = 1.0,
) -> ScaleByLion:
    r"""Rescale updates by the sign of Lion's interpolated momentum.

    Per path, from the momentum $m_{t-1}$ as stored:

    $$u_t = \operatorname{sign}\big(\beta_1 m_{t-1} + (1-\beta_1) g_t\big),\qquad
      m_t = \beta_2 m_{t-1} + (1-\beta_2) g_t$$

    Every element of the update is $-1$, $0$ or $1$, so the learning rate sets the step length
    directly (Lion's learning rates are typically 3-10x smaller than Adam's). The update and the
    new momentum are both computed from one read of the stored momentum, so a donated state
    buffer is overwritten in place.

    `mode` replaces the sign of $x_t = \beta_1 m_{t-1} + (1-\beta_1) g_t$ by a softer
    function, as in optax: `"smooth"` takes $\tanh(\beta_s x_t)$ ($\beta_s$ =
    `smooth_beta`; larger values approach the sign), `"refined"` keeps $x_t$ where
    $|x_t| < 1$ and its sign elsewhere. Small interpolations then give small steps.

    Args:
        b1: interpolation between momentum and gradient for the update.
        b2: decay of the momentum.
        mode: `"hard"` (the sign, Lion as published), `"smooth"` or `"refined"`.
        smooth_beta: the slope $\beta_s$ of the `"smooth"` mode (not kept by the others).

    State:
        `mu/<path>` shaped like the parameter.

    Examples:
        >>> tx = gradtx.scale_by_lion()
        >>> params = {"w": jnp.zeros(3)}
        >>> u, state = tx.update({"w": jnp.array([0.5, -2.0, 0.0])}, tx.init(params))
        >>> u["w"], state["mu"]["w"].round(4)
        (Array([ 1., -1.,  0.], dtype=float32), Array([ 0.005, -0.02 ,  0.   ], dtype=float32))

    References:
        Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023.
    """
    # Only the smooth mode reads `smooth_beta`: the others keep no leaf for it.
    return ScaleByLion(b1, b2, mu_dtype, mode, smooth_beta if mode == "smooth" else None)
