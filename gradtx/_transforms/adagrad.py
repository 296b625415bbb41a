"""Adagrad's root of the sum of squares, and Adadelta's ratio of moving root mean squares."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from gradtx._core.lift import as_stored, compute_dtype, dtype_or_none, zeros_for
from gradtx._core.module import decay_rate, hyperparam, non_negative, static
from gradtx._core.per_array import Float16Check, PerArrayTransform
from gradtx._transforms.adam import moving_average
from gradtx._transforms.rms import filled_for


class ScaleByRss(PerArrayTransform):
    """Rescale by the root of the sum of squared gradients (see `scale_by_rss`)."""

    name: ClassVar[str] = "scale_by_rss"
    float16_check: ClassVar[Float16Check] = Float16Check(
        ("sum_of_squares",), "the sum of squares", "accumulator_dtype"
    )
    initial_accumulator_value: Any = hyperparam(0.1)
    eps: Any = hyperparam(1e-7, check=non_negative)
    accumulator_dtype: Any = static(None, converter=dtype_or_none)

    def state_keys(self) -> tuple[str, ...]:
        """The running `sum_of_squares`."""
        return ("sum_of_squares",)

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """The sum filled with `initial_accumulator_value`."""
        value = self.initial_accumulator_value
        return {"sum_of_squares": filled_for(param, value, self.accumulator_dtype)}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`s += g^2`; `u = g / sqrt(s + eps)`, 0 where `s` is 0."""
        old = slots["sum_of_squares"]
        dtype = compute_dtype(g, old)
        grad = g.astype(dtype)
        total = as_stored(old.astype(dtype) + grad * grad, old)
        scale = jnp.where(total > 0, jax.lax.rsqrt(total + self.eps.astype(dtype)), 0)
        return grad * scale, {"sum_of_squares": total}


class ScaleByAdadelta(PerArrayTransform):
    """Adadelta's rescaling (see `scale_by_adadelta`)."""

    name: ClassVar[str] = "scale_by_adadelta"
    float16_check: ClassVar[Float16Check] = Float16Check(
        ("mean_sq_grad", "mean_sq_update"), "the averages of squares", "accumulator_dtype"
    )
    rho: Any = hyperparam(0.9, check=decay_rate)
    eps: Any = hyperparam(1e-6, check=non_negative)
    accumulator_dtype: Any = static(None, converter=dtype_or_none)

    def state_keys(self) -> tuple[str, ...]:
        """Moving averages of squared gradients and of squared updates."""
        return ("mean_sq_grad", "mean_sq_update")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Both averages zero, in `accumulator_dtype` (default: the param's dtype)."""
        return {
            "mean_sq_grad": zeros_for(param, self.accumulator_dtype),
            "mean_sq_update": zeros_for(param, self.accumulator_dtype),
        }

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One Adadelta step for one array, computed in at least float32."""
        old_g2, old_u2 = slots["mean_sq_grad"], slots["mean_sq_update"]
        dtype = compute_dtype(g, old_g2, old_u2)
        rho, eps, grad = self.rho.astype(dtype), self.eps.astype(dtype), g.astype(dtype)
        mean_g2 = moving_average(rho, old_g2, grad * grad, dtype)
        prev_u2 = old_u2.astype(dtype)
        u = jnp.sqrt(prev_u2 + eps) / jnp.sqrt(mean_g2 + eps) * grad
        mean_u2 = (1 - rho) * (u * u) + rho * prev_u2
        return u, {"mean_sq_grad": mean_g2, "mean_sq_update": mean_u2}


def scale_by_rss(
    initial_accumulator_value: float = 0.1,
    eps: float = 1e-7,
    *,
    accumulator_dtype: Any = None,
) -> ScaleByRss:
    r"""Rescale updates by the root of the sum of all squared gradients so far (Adagrad).

    Per path, with $s_0$ filled with `initial_accumulator_value`:

    $$s_t = s_{t-1} + g_t^2,\qquad u_t = g_t / \sqrt{s_t + \epsilon}$$

    and $u_t = 0$ where $s_t = 0$ (a zero gradient with a zero start).

    Args:
        initial_accumulator_value: the initial sum, at least 0.
        eps: added inside the square root.
        accumulator_dtype: dtype of `sum_of_squares` (default: the parameter's dtype).

    State:
        `sum_of_squares/<path>` shaped like the parameter.

    Examples:
        >>> tx = gradtx.scale_by_rss(initial_accumulator_value=0.0, eps=0.0)
        >>> u, _ = tx.update({"w": jnp.array([3.0, 0.0])}, tx.init({"w": jnp.zeros(2)}))
        >>> u["w"]
        Array([1., 0.], dtype=float32)

    References:
        Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and
        Stochastic Optimization", JMLR 2011.
    """
    return ScaleByRss(initial_accumulator_value, eps, accumulator_dtype)


def scale_by_adadelta(
    rho: float = 0.9, eps: float = 1e-6, *, accumulator_dtype: Any = None
) -> ScaleByAdadelta:
    r"""Rescale updates by Adadelta: the ratio of the RMS of past updates to that of gradients.

    Per path, both averages starting at zero:

    $$E[g^2]_t = \rho E[g^2]_{t-1} + (1-\rho) g_t^2,\quad
      u_t = \frac{\sqrt{E[u^2]_{t-1} + \epsilon}}{\sqrt{E[g^2]_t + \epsilon}}\, g_t,\quad
      E[u^2]_t = \rho E[u^2]_{t-1} + (1-\rho) u_t^2$$

    Args:
        rho: decay of both moving averages.
        eps: added inside both square roots.
        accumulator_dtype: dtype of both averages (default: the parameter's dtype).

    State:
        `mean_sq_grad/<path>` ($E[g^2]$) and `mean_sq_update/<path>` ($E[u^2]$) shaped like
        the parameter.

    Examples:
        >>> tx = gradtx.scale_by_adadelta()
        >>> u, _ = tx.update({"w": jnp.array([5.0, -5.0])}, tx.init({"w": jnp.zeros(2)}))
        >>> jnp.round(u["w"] / jnp.sqrt(1e-6 / 0.1), 3)  # the first step: sqrt(eps / (1 - rho))
        Array([ 1., -1.], dtype=float32)

    References:
        Zeiler, "ADADELTA: An Adaptive Learning Rate Method", 2012.
    """
    return ScaleByAdadelta(rho, eps, accumulator_dtype)
