"""AdEMAMix: Adam with a mixture of a fast and a slow momentum (Pagliardini et al.)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import compute_dtype, dtype_or_none, zeros_for
from gradtx._core.module import decay_rate, hyperparam, non_negative, static
from gradtx._core.per_array import Float16Check, PerArrayTransform, hyperparam_at
from gradtx._layouts.step_counts import next_count
from gradtx._optimizers.descent import descent
from gradtx._transforms.adam import moving_average
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.weight_decay import add_decayed_weights


class ScaleByAdemamix(PerArrayTransform):
    """AdEMAMix's rescaling (see `scale_by_ademamix`)."""

    name: ClassVar[str] = "scale_by_ademamix"
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.999, check=decay_rate)
    b3: Any = hyperparam(0.9999, check=decay_rate)
    alpha: Any = hyperparam(6.0)
    eps: Any = hyperparam(1e-8, check=non_negative)
    eps_root: Any = hyperparam(0.0, check=non_negative)
    mu_dtype: Any = static(None, converter=dtype_or_none)

    float16_check: ClassVar[Float16Check] = Float16Check(("nu",), "the second moment", "mu_dtype")

    def state_keys(self) -> tuple[str, ...]:
        """The fast and slow momenta `m1`, `m2`, the second moment `nu` and the `count`."""
        return ("m1", "m2", "nu", "count")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Zero moments (in `mu_dtype`, default the param's dtype) and count 0."""
        return {
            "m1": zeros_for(param, self.mu_dtype),
            "m2": zeros_for(param, self.mu_dtype),
            "nu": zeros_for(param, self.mu_dtype),
            "count": jnp.zeros((), jnp.int32),
        }

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One AdEMAMix step for one array; `b3` and `alpha` may be schedules of the step."""
        dtype = compute_dtype(g, slots["m1"], slots["m2"], slots["nu"])
        grad = g.astype(dtype)
        new = next_count(slots["count"])
        count = new - 1  # the old count, read from the new one (see `next_count`)
        b1, b2 = self.b1.astype(dtype), self.b2.astype(dtype)
        b3 = hyperparam_at(self.b3, count).astype(dtype)
        alpha = hyperparam_at(self.alpha, count).astype(dtype)
        m1 = moving_average(b1, slots["m1"], grad, dtype)
        m2 = moving_average(b3, slots["m2"], grad, dtype)
        nu = moving_average(b2, slots["nu"], grad * grad, dtype)
        t = new.astype(dtype)
        m1_hat, nu_hat = m1 / (1 - b1**t), nu / (1 - b2**t)
        eps, eps_root = self.eps.astype(dtype), self.eps_root.astype(dtype)
        u = (m1_hat + alpha * m2) / (jnp.sqrt(nu_hat + eps_root) + eps)
        return u, {"m1": m1, "m2": m2, "nu": nu, "count": new}


def scale_by_ademamix(
    b1: float = 0.9,
    b2: float = 0.999,
    b3: ScalarOrSchedule = 0.9999,
    alpha: ScalarOrSchedule = 6.0,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any = None,
) -> ScaleByAdemamix:
    r"""Rescale updates by AdEMAMix: Adam's fast momentum plus a slow, undebiased one.

    Per path, with step $t$ counted per path:

    $$m^{(1)}_t = \beta_1 m^{(1)}_{t-1} + (1-\beta_1) g_t,\quad
      m^{(2)}_t = \beta_3 m^{(2)}_{t-1} + (1-\beta_3) g_t,\quad
      v_t = \beta_2 v_{t-1} + (1-\beta_2) g_t^2$$

    $$u_t = \frac{m^{(1)}_t / (1-\beta_1^t) + \alpha\, m^{(2)}_t}
      {\sqrt{v_t / (1-\beta_2^t) + \epsilon_{root}} + \epsilon}$$

    `b3` and `alpha` may be schedules (the paper warms both up), evaluated at the path's
    step count before the update.

    Args:
        b1: decay of the fast momentum.
        b2: decay of the second moment.
        b3: decay of the slow momentum (a number or a schedule).
        alpha: weight of the slow momentum (a number or a schedule).
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.
        mu_dtype: dtype of `m1`, `m2` and `nu` (default: the parameter's dtype).

    State:
        `m1/<path>`, `m2/<path>`, `nu/<path>` shaped like the parameter; `count/<path>` int32.

    Examples:
        >>> tx = gradtx.contrib.scale_by_ademamix(alpha=0.0)
        >>> u, _ = tx.update({"w": jnp.array([2.0, -2.0])}, tx.init({"w": jnp.zeros(2)}))
        >>> u["w"]  # with alpha = 0 the first step is Adam's, g / |g|
        Array([ 1., -1.], dtype=float32)

    References:
        Pagliardini et al., "The AdEMAMix Optimizer: Better, Faster, Older", 2024.
    """
    return ScaleByAdemamix(b1, b2, b3, alpha, eps, eps_root, mu_dtype)


def ademamix(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    b3: ScalarOrSchedule = 0.9999,
    alpha: ScalarOrSchedule = 5.0,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any = None,
    weight_decay: float = 0.0,
    mask: Any = None,
) -> Any:
    r"""AdEMAMix with decoupled weight decay.

    `chain(scale_by_ademamix(...), add_decayed_weights(weight_decay, mask),
    scale_by_learning_rate(learning_rate))`:

    $$\theta_t = \theta_{t-1} - \eta \left(\frac{\hat m^{(1)}_t + \alpha\, m^{(2)}_t}
      {\sqrt{\hat v_t + \epsilon_{root}} + \epsilon} + \lambda\, \theta_{t-1}\right)$$

    The slow momentum remembers gradients over about $1/(1-\beta_3)$ steps, so the method
    suits long runs (the paper suggests a smaller `b3` such as 0.999 for short ones).

    Args:
        learning_rate: a number or a schedule.
        b1: decay of the fast momentum.
        b2: decay of the second moment.
        b3: decay of the slow momentum (a number or a schedule).
        alpha: weight of the slow momentum (a number or a schedule).
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.
        mu_dtype: dtype of the moments (default: the parameter's dtype).
        weight_decay: the decoupled decay rate $\lambda$ (multiplied by the learning rate).
        mask: selector of the paths to decay (for example `"!**/bias"`); default: all.

    State:
        `m1/<path>`, `m2/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a
        learning-rate schedule.

    Examples:
        >>> tx = gradtx.contrib.ademamix(1e-3, b3=0.999)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'm1/w', 'm2/w', 'nu/w']

    References:
        Pagliardini et al., "The AdEMAMix Optimizer: Better, Faster, Older", 2024.
    """
    moments = scale_by_ademamix(b1, b2, b3, alpha, eps, eps_root, mu_dtype)
    return descent("ademamix", learning_rate, moments, add_decayed_weights(weight_decay, mask))
