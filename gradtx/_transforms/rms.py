"""RMSProp's rescaling: by the root of a moving average of squared gradients, plain or centered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import jax
import jax.numpy as jnp

from gradtx._core.lift import compute_dtype, dtype_or_none, zeros_for
from gradtx._core.module import decay_rate, hyperparam, non_negative, static
from gradtx._core.per_array import Float16Check, PerArrayTransform
from gradtx._layouts.step_counts import next_count
from gradtx._transforms.adam import SECOND_MOMENT, moving_average
from gradtx._transforms.shared_args import with_shared_args


def filled_for(param: Any, value: Any, dtype: Any = None) -> Any:
    """An array shaped like `param` (with its sharding) filled with the float32 `value`."""
    zeros = zeros_for(param, dtype)
    return zeros + jnp.asarray(value).astype(zeros.dtype)


class _MovingSquares(PerArrayTransform):
    """Shared fields and slots of `ScaleByRms` and `ScaleByStddev`."""

    decay: Any = hyperparam(0.9, check=decay_rate)
    eps: Any = hyperparam(1e-8, check=non_negative)
    initial_scale: Any = hyperparam(0.0)
    eps_in_sqrt: bool = static(True)
    bias_correction: bool = static(False)
    centered: ClassVar[bool] = False
    float16_check: ClassVar[Float16Check] = SECOND_MOMENT
    if TYPE_CHECKING:  # each subclass's own fields (declared here, they would come first)
        nu_dtype: ClassVar[Any]
        mu_dtype: ClassVar[Any]  # when centered

    def state_keys(self) -> tuple[str, ...]:
        """`mu` when centered, `nu`, and the path's step `count` with bias correction."""
        keys = ("mu", "nu") if self.centered else ("nu",)
        return keys + ("count",) if self.bias_correction else keys

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """`nu` filled with `initial_scale`, `mu` zeros, count 0."""
        slots = {"nu": filled_for(param, self.initial_scale, self.nu_dtype)}
        if self.centered:
            slots["mu"] = zeros_for(param, self.mu_dtype)
        if self.bias_correction:
            slots["count"] = jnp.zeros((), jnp.int32)
        return slots

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One (centered) RMS step for one array, computed in at least float32."""
        dtype = compute_dtype(g, *(slots[k] for k in ("mu", "nu") if k in slots))
        decay, grad = self.decay.astype(dtype), g.astype(dtype)
        new: dict[str, Any] = {"nu": moving_average(decay, slots["nu"], grad * grad, dtype)}
        if self.centered:
            new["mu"] = moving_average(decay, slots["mu"], grad, dtype)
        nu, mu = new["nu"], new.get("mu")
        if self.bias_correction:
            new["count"] = next_count(slots["count"])
            correction = 1 - decay ** new["count"].astype(dtype)
            nu = nu / correction
            mu = None if mu is None else mu / correction
        second = nu if mu is None else nu - mu * mu
        eps = self.eps.astype(dtype)
        if self.eps_in_sqrt:
            scaling = jax.lax.rsqrt(second + eps)
        else:
            scaling = 1 / (jnp.sqrt(second) + eps)
        return scaling * grad, new


class ScaleByRms(_MovingSquares):
    """Rescale by the root of a moving average of squared gradients (see `scale_by_rms`)."""

    name: ClassVar[str] = "scale_by_rms"
    nu_dtype: Any = static(None, converter=dtype_or_none)


class ScaleByStddev(_MovingSquares):
    """Rescale by a moving estimate of the gradients' standard deviation (`scale_by_stddev`)."""

    name: ClassVar[str] = "scale_by_stddev"
    mu_dtype: Any = static(None, converter=dtype_or_none)
    nu_dtype: Any = static(None, converter=dtype_or_none)
    centered: ClassVar[bool] = True


@with_shared_args
def scale_by_rms(
    decay: float = 0.9,
    eps: float = 1e-8,
    initial_scale: float = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
    *,
    nu_dtype: Any = None,
) -> ScaleByRms:
    r"""Rescale updates by the root of a moving average of squared gradients (RMSProp).

    Per path, $\nu_0$ filled with `initial_scale`:

    $$\nu_t = \rho\,\nu_{t-1} + (1-\rho)\,g_t^2,\qquad
      u_t = g_t / \sqrt{\hat\nu_t + \epsilon}\ \text{ or }\ g_t / (\sqrt{\hat\nu_t} + \epsilon)$$

    ($\epsilon$ inside the root with `eps_in_sqrt=True`, as optax; PyTorch adds it outside).
    $\hat\nu_t = \nu_t$, or $\nu_t/(1-\rho^t)$ with `bias_correction=True`, $t$ counted per
    path. `scale_by_rms(b2, eps_in_sqrt=False, bias_correction=True)` is Adam's rescaling
    with `b1=0`.

    Args:
        decay: the decay $\rho$ of the moving average.
        eps: the stabilising constant $\epsilon$.
        initial_scale: the initial value of $\nu$ (PyTorch uses 0, TensorFlow 1 uses 1).
        eps_in_sqrt: add `eps` inside the square root (else outside).
        bias_correction: divide $\nu_t$ by $1-\rho^t$.

    State:
        `nu/<path>` shaped like the parameter; with `bias_correction`, `count/<path>` an
        int32 scalar.

    Examples:
        >>> tx = gradtx.scale_by_rms(decay=0.75)
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> u, state = tx.update({"w": jnp.array([2.0, -2.0])}, state)
        >>> u["w"]
        Array([ 2., -2.], dtype=float32)

    References:
        Hinton, "Neural Networks for Machine Learning", lecture 6e, 2012.
    """
    return ScaleByRms(decay, eps, initial_scale, eps_in_sqrt, bias_correction, nu_dtype)


@with_shared_args
def scale_by_stddev(
    decay: float = 0.9,
    eps: float = 1e-8,
    initial_scale: float = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> ScaleByStddev:
    r"""Rescale updates by a moving estimate of the gradients' standard deviation.

    The centered RMSProp of Graves (2013). Per path, $\mu_0 = 0$, $\nu_0$ filled with
    `initial_scale`:

    $$\mu_t = \rho\,\mu_{t-1} + (1-\rho)\,g_t,\qquad \nu_t = \rho\,\nu_{t-1} + (1-\rho)\,g_t^2$$

    $$u_t = g_t / \sqrt{\hat\nu_t - \hat\mu_t^2 + \epsilon}\ \text{ or }\
      g_t / (\sqrt{\hat\nu_t - \hat\mu_t^2} + \epsilon)$$

    with $\hat\mu_t, \hat\nu_t$ the moments, or with `bias_correction=True` the moments
    divided by $1-\rho^t$ ($t$ counted per path). With bias correction the first step's
    variance estimate is exactly zero, so the first update is $g/\sqrt{\epsilon}$.

    Args:
        decay: the decay $\rho$ of both moving averages.
        eps: the stabilising constant $\epsilon$.
        initial_scale: the initial value of $\nu$.
        eps_in_sqrt: add `eps` inside the square root (else outside).
        bias_correction: divide both moments by $1-\rho^t$.

    State:
        `mu/<path>`, `nu/<path>` shaped like the parameter; with `bias_correction`,
        `count/<path>` an int32 scalar.

    Examples:
        >>> tx = gradtx.scale_by_stddev(decay=0.5)
        >>> state = tx.init({"w": jnp.zeros(1)})
        >>> u, state = tx.update({"w": jnp.array([2.0])}, state)
        >>> u["w"]  # 2 / sqrt(0.5 * 4 - (0.5 * 2) ** 2)
        Array([2.], dtype=float32)

    References:
        Graves, "Generating Sequences With Recurrent Neural Networks", 2013.
    """
    return ScaleByStddev(
        decay, eps, initial_scale, eps_in_sqrt, bias_correction, mu_dtype, nu_dtype
    )
