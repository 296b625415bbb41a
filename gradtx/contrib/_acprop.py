"""ACProp: a centred second moment, read one step late (Zhuang et al.)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import as_stored
from gradtx._core.module import decay_rate, hyperparam, non_negative
from gradtx._core.per_array import Float16Check
from gradtx._optimizers.descent import descent
from gradtx._transforms.adam import AdamMoments
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.weight_decay import add_decayed_weights
from gradtx.contrib._reductions import bias_correction


class ScaleByAcprop(AdamMoments):
    """ACProp's rescaling (see `scale_by_acprop`): Adam's slots, both in the param's dtype."""

    name: ClassVar[str] = "scale_by_acprop"
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.999, check=decay_rate)
    eps: Any = hyperparam(1e-16, check=non_negative)
    eps_root: Any = hyperparam(1e-16, check=non_negative)

    float16_check: ClassVar[Float16Check] = Float16Check(("nu",), "the centred second moment", None)
    mu_dtype: ClassVar[Any] = None
    nu_dtype: ClassVar[Any] = None

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Divide by the previous second moment; then advance both moments."""
        dtype, grad, _, b2, mu, new, _ = self.moments(g, slots)
        count = new - 1  # the old count, read from the new one (see `next_count`)
        old_nu = slots["nu"].astype(dtype)
        residual = grad - mu
        nu = b2 * old_nu + (1 - b2) * residual * residual + self.eps_root.astype(dtype)
        nu = as_stored(nu, slots["nu"])
        # The denominator is the second moment of the earlier steps (1 at the first step).
        corrected = old_nu / bias_correction(b2, jnp.maximum(count, 1).astype(dtype))
        nu_hat = jnp.where(count == 0, jnp.ones_like(corrected), corrected)
        u = grad / (jnp.sqrt(nu_hat) + self.eps.astype(dtype))
        return u, {"mu": mu, "nu": nu, "count": new}


def scale_by_acprop(
    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-16, eps_root: float = 1e-16
) -> ScaleByAcprop:
    r"""Rescale updates by ACProp: AdaBelief's centred second moment, one step late.

    Per path, with $t$ the path's step (from 1):

    $$m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\qquad
      s_t = \beta_2 s_{t-1} + (1-\beta_2)(g_t - m_t)^2 + \bar\epsilon$$

    $$u_t = \frac{g_t}{\sqrt{\hat s_{t-1}} + \epsilon},\qquad
      \hat s_{t-1} = \frac{s_{t-1}}{1 - \beta_2^{t-1}}\ (t > 1),\qquad \hat s_0 = 1$$

    The denominator is asynchronous: it holds the gradients up to the previous step only, so
    it is independent of the current gradient, which the numerator uses. The first moment
    serves only to centre the second. (optax 0.2.8 centres with the previous first moment
    $m_{t-1}$, against its own formula; gradtx follows the formula, which is also
    AdaBelief's centring.)

    Args:
        b1: $\beta_1$, the decay of the first moment.
        b2: $\beta_2$, the decay of the centred second moment.
        eps: $\epsilon$, added to the denominator.
        eps_root: $\bar\epsilon$, added to the second moment at every step.

    State:
        `mu/<path>` and `nu/<path>` ($m$ and $s$) shaped like the parameter; `count/<path>`
        (int32).

    Examples:
        >>> tx = gradtx.contrib.scale_by_acprop()
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> u, state = tx.update({"w": jnp.array([2.0, -2.0])}, state)
        >>> u["w"]  # the first step divides by 1
        Array([ 2., -2.], dtype=float32)
        >>> u, state = tx.update({"w": jnp.array([2.0, -2.0])}, state)
        >>> u["w"]  # s_1 / (1 - b2) = (g - m_1)^2 = 1.8^2: g / 1.8
        Array([ 1.111111, -1.111111], dtype=float32)

    References:
        Zhuang et al., "Momentum Centering and Asynchronous Update for Adaptive Gradient
        Methods", NeurIPS 2021.
    """
    return ScaleByAcprop(b1, b2, eps, eps_root)


def acprop(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-16,
    eps_root: float = 1e-16,
    weight_decay: float = 0.0,
    mask: Any = None,
) -> Any:
    r"""ACProp with decoupled weight decay.

    `chain(scale_by_acprop(b1, b2, eps, eps_root), add_decayed_weights(weight_decay, mask),
    scale_by_learning_rate(learning_rate))`:

    $$x_{t+1} = x_t - \eta_t\left(\frac{g_t}{\sqrt{\hat s_{t-1}} + \epsilon}
      + \lambda\, x_t\right)$$

    with $\hat s$ as in `scale_by_acprop`. The decay is multiplied by the learning rate.

    Args:
        learning_rate: $\eta$, a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the centred second moment.
        eps: added to the denominator.
        eps_root: added to the second moment at every step.
        weight_decay: $\lambda$, the decoupled decay rate.
        mask: selector of the paths to decay (for example `"!**/bias"`); default: all.

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a
        learning-rate schedule.

    Examples:
        >>> tx = gradtx.contrib.acprop(1e-3)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'mu/w', 'nu/w']

    References:
        Zhuang et al., "Momentum Centering and Asynchronous Update for Adaptive Gradient
        Methods", NeurIPS 2021.
    """
    moments = scale_by_acprop(b1, b2, eps, eps_root)
    return descent("acprop", learning_rate, moments, add_decayed_weights(weight_decay, mask))
