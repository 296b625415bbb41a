"""Adam's moment estimates (Kingma & Ba, 2015), and the moments and slots its relatives share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import as_stored, compute_dtype, dtype_or_none, zeros_for
from gradtx._core.module import decay_rate, hyperparam, non_negative, static
from gradtx._core.per_array import Float16Check, PerArrayTransform
from gradtx._layouts.step_counts import next_count
from gradtx._transforms.shared_args import with_shared_args

# `nu`, set by `nu_dtype`: what `init` warns about for float16 params (Adam and its relatives).
SECOND_MOMENT = Float16Check(("nu",), "the second moment", "nu_dtype")


def moving_average(decay: Any, old: Any, value: Any, dtype: Any) -> Any:
    """`decay * old + (1 - decay) * value`, `old` a stored slot; the result rounded as stored."""
    return as_stored((1 - decay) * value + decay * old.astype(dtype), old)


def first_moment_hat(mu: Any, grad: Any, b1: Any, t: Any, nesterov: bool) -> Any:
    """The bias-corrected first moment at step `t`, or its Nesterov form (Dozat, 2016)."""
    if nesterov:
        return b1 * mu / (1 - b1 ** (t + 1)) + (1 - b1) * grad / (1 - b1**t)
    return mu / (1 - b1**t)


class AdamMoments(PerArrayTransform):
    """Adam's slots: first moment `mu`, second moment `nu` and the path's step `count`."""

    float16_check: ClassVar[Float16Check] = SECOND_MOMENT
    if TYPE_CHECKING:  # each subclass's own fields (declared here, they would come first)
        mu_dtype: ClassVar[Any]
        nu_dtype: ClassVar[Any]
        b1: ClassVar[Any]  # with `b2`, read by `moments`
        b2: ClassVar[Any]
        eps: ClassVar[Any]  # with `eps_root`, read by `adam_step`
        eps_root: ClassVar[Any]

    def state_keys(self) -> tuple[str, ...]:
        """First moment `mu`, second moment `nu`, and the path's step `count`."""
        return ("mu", "nu", "count")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Zero moments (in `mu_dtype`/`nu_dtype`, else the param's dtype) and count 0."""
        return {
            "mu": zeros_for(param, self.mu_dtype),
            "nu": zeros_for(param, self.nu_dtype),
            "count": jnp.zeros((), jnp.int32),
        }

    def moments(self, g: Any, slots: dict) -> tuple[Any, Any, Any, Any, Any, Any, Any]:
        """What every step starts with: `(dtype, grad, b1, b2, mu, count, t)`.

        The compute dtype of `g` and the float slots, the gradient, `b1` and `b2` in it, the
        new first moment, and the path's advanced step count (`t` the count as a float).
        """
        dtype = compute_dtype(g, *(v for k, v in slots.items() if k != "count"))
        b1, b2, grad = self.b1.astype(dtype), self.b2.astype(dtype), g.astype(dtype)
        mu = moving_average(b1, slots["mu"], grad, dtype)
        count = next_count(slots["count"])
        return dtype, grad, b1, b2, mu, count, count.astype(dtype)

    def adam_step(self, mu_hat: Any, nu_hat: Any, dtype: Any) -> Any:
        """`mu_hat / (sqrt(nu_hat + eps_root) + eps)`, Adam's step from corrected moments."""
        return mu_hat / (jnp.sqrt(nu_hat + self.eps_root.astype(dtype)) + self.eps.astype(dtype))


class AdamArgs(AdamMoments):
    """Adam's arguments, in its order, for the relatives that take them first."""

    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.999, check=decay_rate)
    eps: Any = hyperparam(1e-8, check=non_negative)
    eps_root: Any = hyperparam(0.0, check=non_negative)
    mu_dtype: Any = static(None, converter=dtype_or_none)
    nu_dtype: Any = static(None, converter=dtype_or_none)


class ScaleByAdam(AdamArgs):
    """Rescale updates by Adam's bias-corrected moments (see `scale_by_adam`)."""

    name: ClassVar[str] = "scale_by_adam"
    nesterov: bool = static(False)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One Adam step for one array, computed in at least float32."""
        dtype, grad, b1, b2, mu, count, t = self.moments(g, slots)
        nu = moving_average(b2, slots["nu"], grad * grad, dtype)
        mu_hat = first_moment_hat(mu, grad, b1, t, self.nesterov)
        u = self.adam_step(mu_hat, nu / (1 - b2**t), dtype)
        return u, {"mu": mu, "nu": nu, "count": count}


@with_shared_args
def scale_by_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    nesterov: bool = False,
) -> ScaleByAdam:
    r"""Rescale updates by Adam's bias-corrected moment estimates.

    Per path, with step $t$ counted per path:

    $$m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\quad v_t = \beta_2 v_{t-1} + (1-\beta_2) g_t^2$$

    $$u_t = \hat m_t / (\sqrt{\hat v_t + \epsilon_{root}} + \epsilon),\quad
      \hat m_t = m_t/(1-\beta_1^t),\ \hat v_t = v_t/(1-\beta_2^t)$$

    With `nesterov=True`, $\hat m_t = \beta_1 m_t/(1-\beta_1^{t+1}) + (1-\beta_1) g_t/(1-\beta_1^t)$
    (Dozat, 2016). The math runs in at least float32 whatever the params' dtype.

    Args:
        eps_root: added inside the square root (useful when differentiating through Adam).

    State:
        `mu/<path>`, `nu/<path>` shaped like the parameter; `count/<path>` an int32 scalar.

    Examples:
        >>> tx = gradtx.scale_by_adam(mu_dtype=jnp.float32)
        >>> params = {"w": jnp.ones(3, jnp.bfloat16)}
        >>> tx.init(params)["mu"]["w"].dtype
        dtype('float32')

    References:
        Kingma & Ba, "Adam: A Method for Stochastic Optimization", 2015.
    """
    return ScaleByAdam(b1, b2, eps, eps_root, mu_dtype, nu_dtype, nesterov)
