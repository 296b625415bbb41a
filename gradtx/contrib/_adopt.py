"""ADOPT: Adam with the second moment taken before the current gradient (Taniguchi et al.)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import as_stored, compute_dtype, dtype_or_none
from gradtx._core.module import decay_rate, hyperparam, non_negative, static
from gradtx._core.per_array import Float16Check
from gradtx._layouts.step_counts import next_count
from gradtx._optimizers.descent import descent
from gradtx._transforms.adam import AdamMoments
from gradtx._transforms.scale import ScalarOrSchedule


def quarter_power(step: Any) -> Any:
    """The default clipping bound of ADOPT: `step ** 0.25` (0 at the first step)."""
    return step**0.25


def _static_fn(value: Any, name: str) -> Any:
    if not callable(value):
        raise TypeError(f"`{name}` must be a function of the step, got {value!r}")
    return value


class ScaleByAdopt(AdamMoments):
    """ADOPT's normalise-then-average rescaling (see `scale_by_adopt`), on Adam's slots."""

    name: ClassVar[str] = "scale_by_adopt"
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.9999, check=decay_rate)
    eps: Any = hyperparam(1e-6, check=non_negative)
    mu_dtype: Any = static(None, converter=dtype_or_none)
    nesterov: bool = static(False)
    use_clipping: bool = static(True)
    clip_value_fn: Callable[[Any], Any] = static(quarter_power, converter=_static_fn)

    float16_check: ClassVar[Float16Check] = Float16Check(("nu",), "the second moment", None)
    nu_dtype: ClassVar[Any] = None  # `nu` in the param's dtype

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One ADOPT step for one array; the first step only initialises `nu`."""
        dtype = compute_dtype(g, slots["mu"], slots["nu"])
        grad = g.astype(dtype)
        new = next_count(slots["count"])
        count = new - 1  # the old count, read from the new one (see `next_count`)
        first = count == 0
        one, zero = jnp.ones((), dtype), jnp.zeros((), dtype)
        b1 = jnp.where(first, one, self.b1.astype(dtype))
        b2 = jnp.where(first, zero, self.b2.astype(dtype))
        old_nu = slots["nu"].astype(dtype)
        step = grad / jnp.maximum(jnp.sqrt(old_nu), self.eps.astype(dtype))
        if self.use_clipping:
            bound = jnp.asarray(self.clip_value_fn(count.astype(dtype)), dtype)
            step = jnp.clip(step, -bound, bound)
        nu = as_stored(b2 * old_nu + (1 - b2) * (grad * grad), slots["nu"])
        mu = as_stored(b1 * slots["mu"].astype(dtype) + (1 - b1) * step, slots["mu"])
        u = b1 * mu + (1 - b1) * step if self.nesterov else mu
        return u, {"mu": mu, "nu": nu, "count": new}


def scale_by_adopt(
    b1: float = 0.9,
    b2: float = 0.9999,
    eps: float = 1e-6,
    mu_dtype: Any = None,
    *,
    nesterov: bool = False,
    use_clipping: bool = True,
    clip_value_fn: Callable[[Any], Any] = quarter_power,
) -> ScaleByAdopt:
    r"""Rescale updates by ADOPT: normalise by the *previous* second moment, then average.

    Per path, with step $t = 0, 1, \ldots$ counted per path, $v_{-1} = 0$ and $m_{-1} = 0$:

    $$s_t = \operatorname{clip}\!\left(\frac{g_t}{\max(\sqrt{v_{t-1}}, \epsilon)},
      \ -c(t),\ c(t)\right),\qquad m_t = \beta_1 m_{t-1} + (1-\beta_1)\, s_t,\qquad
      v_t = \beta_2 v_{t-1} + (1-\beta_2)\, g_t^2$$

    and $u_t = m_t$ (Nesterov: $u_t = \beta_1 m_t + (1-\beta_1) s_t$). The first step
    ($t = 0$) uses $\beta_1 = 1$ and $\beta_2 = 0$: it sets $v_0 = g_0^2$ and returns a zero
    update. The clipping bound is $c(t) = $ `clip_value_fn(t)`, by default $t^{1/4}$; without
    `use_clipping` the step is not clipped.

    Args:
        b1: decay of the first moment.
        b2: decay of the second moment.
        eps: lower bound of the denominator.
        mu_dtype: dtype of `mu` (default: the parameter's dtype).
        nesterov: use Nesterov momentum.
        use_clipping: clip the normalised gradient to $[-c(t), c(t)]$.
        clip_value_fn: the bound $c(t)$, a function of the (float) step count; kept as static
            structure, so pass a module-level function (a new lambda recompiles).

    State:
        `mu/<path>`, `nu/<path>` shaped like the parameter; `count/<path>` an int32 scalar.

    Examples:
        >>> tx = gradtx.contrib.scale_by_adopt()
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> u, state = tx.update({"w": jnp.array([3.0, -4.0])}, state)
        >>> u["w"], state["nu"]["w"]
        (Array([0., 0.], dtype=float32), Array([ 9., 16.], dtype=float32))

    References:
        Taniguchi et al., "ADOPT: Modified Adam Can Converge with Any beta2 with the Optimal
        Rate", NeurIPS 2024.
    """
    return ScaleByAdopt(b1, b2, eps, mu_dtype, nesterov, use_clipping, clip_value_fn)


def adopt(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.9999,
    eps: float = 1e-6,
    mu_dtype: Any = None,
    *,
    nesterov: bool = False,
    use_clipping: bool = True,
    clip_value_fn: Callable[[Any], Any] = quarter_power,
) -> Any:
    r"""ADOPT: `chain(scale_by_adopt(...), scale_by_learning_rate(learning_rate))`.

    $\theta_t = \theta_{t-1} - \eta\, m_t$ with $m_t$ from `scale_by_adopt`: Adam whose
    gradient is normalised by the second moment of the *previous* steps, which converges for
    any $\beta_2$.

    Args:
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the second moment.
        eps: lower bound of the denominator.
        mu_dtype: dtype of `mu` (default: the parameter's dtype).
        nesterov: use Nesterov momentum.
        use_clipping: clip the normalised gradient (recommended from scratch).
        clip_value_fn: the clipping bound as a function of the step, default $t^{1/4}$.

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.contrib.adopt(1e-3)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'mu/w', 'nu/w']

    References:
        Taniguchi et al., "ADOPT: Modified Adam Can Converge with Any beta2 with the Optimal
        Rate", NeurIPS 2024.
    """
    moments = scale_by_adopt(
        b1,
        b2,
        eps,
        mu_dtype,
        nesterov=nesterov,
        use_clipping=use_clipping,
        clip_value_fn=clip_value_fn,
    )
    return descent("adopt", learning_rate, moments)
