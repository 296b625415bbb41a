"""Simplified AdEMAMix: one undamped momentum plus the current gradient (Morwani et al.)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import as_stored, compute_dtype, zeros_for
from gradtx._core.module import decay_rate, hyperparam, non_negative
from gradtx._core.per_array import Float16Check, PerArrayTransform, hyperparam_at
from gradtx._layouts.step_counts import next_count
from gradtx._optimizers.descent import descent
from gradtx._transforms.adam import moving_average
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.weight_decay import add_decayed_weights


class ScaleBySimplifiedAdemamix(PerArrayTransform):
    """Simplified AdEMAMix's rescaling (see `scale_by_simplified_ademamix`)."""

    name: ClassVar[str] = "scale_by_simplified_ademamix"
    b1: Any = hyperparam(0.99, check=decay_rate)
    b2: Any = hyperparam(0.95, check=decay_rate)
    alpha: Any = hyperparam(0.0)
    eps: Any = hyperparam(1e-8, check=non_negative)
    eps_root: Any = hyperparam(0.0, check=non_negative)

    float16_check: ClassVar[Float16Check] = Float16Check(("n",), "the second moment", None)

    def state_keys(self) -> tuple[str, ...]:
        """The momentum `m`, the second moment `n` and the step `count`."""
        return ("m", "n", "count")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Zero moments (the param's dtype) and count 0."""
        return {"m": zeros_for(param), "n": zeros_for(param), "count": jnp.zeros((), jnp.int32)}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One step for one array; `alpha` may be a schedule of the path's step count."""
        dtype = compute_dtype(g, slots["m"], slots["n"])
        grad = g.astype(dtype)
        new = next_count(slots["count"])
        count = new - 1  # the old count, read from the new one (see `next_count`)
        b1, b2 = self.b1.astype(dtype), self.b2.astype(dtype)
        alpha = hyperparam_at(self.alpha, count).astype(dtype)
        m = as_stored(b1 * slots["m"].astype(dtype) + grad, slots["m"])
        n = moving_average(b2, slots["n"], grad * grad, dtype)
        t = new.astype(dtype)
        n_hat = n / (1 - b2**t)
        eps, eps_root = self.eps.astype(dtype), self.eps_root.astype(dtype)
        u = (m + alpha * grad) / (jnp.sqrt(n_hat + eps_root) + eps)
        return u, {"m": m, "n": n, "count": new}


def scale_by_simplified_ademamix(
    b1: float = 0.99,
    b2: float = 0.95,
    alpha: ScalarOrSchedule = 0.0,
    eps: float = 1e-8,
    eps_root: float = 0.0,
) -> ScaleBySimplifiedAdemamix:
    r"""Rescale updates by Simplified AdEMAMix: an undamped momentum plus the gradient.

    Per path, with step $t$ counted per path:

    $$m_t = \beta_1 m_{t-1} + g_t,\qquad
      n_t = \beta_2 n_{t-1} + (1-\beta_2) g_t^2$$

    $$u_t = \frac{m_t + \alpha\, g_t}{\sqrt{n_t / (1-\beta_2^t) + \epsilon_{root}} + \epsilon}$$

    The momentum is a plain sum with decay $\beta_1$ (no $1-\beta_1$ factor and no bias
    correction), so it grows to about $1/(1-\beta_1)$ times the gradient: the learning rate
    is smaller than Adam's by that factor. One momentum replaces AdEMAMix's fast and slow
    pair, and $\alpha$ needs no warm-up. `alpha` may be a schedule, evaluated at the path's
    step count before the update.

    Args:
        b1: decay of the momentum.
        b2: decay of the second moment.
        alpha: weight of the current gradient (a number or a schedule).
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.

    State:
        `m/<path>` and `n/<path>` shaped like the parameter; `count/<path>` (int32).

    Examples:
        >>> tx = gradtx.contrib.scale_by_simplified_ademamix(alpha=1.0)
        >>> u, _ = tx.update({"w": jnp.array([2.0, -2.0])}, tx.init({"w": jnp.zeros(2)}))
        >>> u["w"]  # (g + alpha g) / |g| on the first step
        Array([ 2., -2.], dtype=float32)

    References:
        Morwani et al., "Connections between Schedule-Free Optimizers, AdEMAMix, and
        Accelerated SGD Variants", 2025.
    """
    return ScaleBySimplifiedAdemamix(b1, b2, alpha, eps, eps_root)


def simplified_ademamix(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.99,
    b2: float = 0.95,
    alpha: ScalarOrSchedule = 0.0,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    weight_decay: float = 0.0,
    mask: Any = None,
) -> Any:
    r"""Simplified AdEMAMix with decoupled weight decay.

    `chain(scale_by_simplified_ademamix(...), add_decayed_weights(weight_decay, mask),
    scale_by_learning_rate(learning_rate))`:

    $$\theta_t = \theta_{t-1} - \eta \left(\frac{m_t + \alpha\, g_t}
      {\sqrt{\hat n_t + \epsilon_{root}} + \epsilon} + \lambda\, \theta_{t-1}\right),
      \qquad m_t = \beta_1 m_{t-1} + g_t$$

    With $\alpha = 0$ it is Adam with an undamped momentum; the paper relates it to
    schedule-free methods and to accelerated SGD.

    Args:
        learning_rate: a number or a schedule.
        b1: decay of the momentum.
        b2: decay of the second moment.
        alpha: weight of the current gradient (a number or a schedule).
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.
        weight_decay: the decoupled decay rate $\lambda$ (multiplied by the learning rate).
        mask: selector of the paths to decay (for example `"!**/bias"`); default: all.

    State:
        `m/<path>`, `n/<path>`, `count/<path>`; `schedule_count/<path>` with a learning-rate
        schedule.

    Examples:
        >>> tx = gradtx.contrib.simplified_ademamix(1e-3, alpha=2.0)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'm/w', 'n/w']

    References:
        Morwani et al., "Connections between Schedule-Free Optimizers, AdEMAMix, and
        Accelerated SGD Variants", 2025.
    """
    moments = scale_by_simplified_ademamix(b1, b2, alpha, eps, eps_root)
    decay = add_decayed_weights(weight_decay, mask)
    return descent("simplified_ademamix", learning_rate, moments, decay)
