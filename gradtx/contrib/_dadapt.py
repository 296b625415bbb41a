"""D-Adaptation for AdamW: the step size from a lower bound on the distance to the solution."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.elementwise import (
    ElementwiseTransform,
    Float16Check,
    hyperparam_at,
    warn_float16_statistics,
)
from gradtx._core.lift import as_stored, compute_dtype, init_slots, update_slots, zeros_for
from gradtx._core.module import decay_rate, hyperparam, non_negative
from gradtx._layouts.step_counts import next_count
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx.contrib._reductions import (
    adam_direction_updates,
    bias_correction,
    flat_dot,
    global_sum,
    scalar_copy,
)

__all__ = ["dadapt_adamw", "needs_params_error"]

_PER_PATH = ("exp_avg", "exp_avg_sq", "grad_sum")


def needs_params_error(owner: str) -> ValueError:
    """The error for a transformation called without the params it needs."""
    return ValueError(f"{owner} needs the params: call `tx.update(updates, state, params)`.")


def _l1(array: Any) -> Any:
    return jnp.sum(jnp.abs(array))


class DAdaptAdamW(ElementwiseTransform):
    """AdamW whose step size is estimated by D-Adaptation (see `dadapt_adamw`)."""

    name: ClassVar[str] = "dadapt_adamw"
    needs_params: ClassVar[bool] = True
    learning_rate: Any = hyperparam(1.0)
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.999, check=decay_rate)
    eps: Any = hyperparam(1e-8, check=non_negative)
    estim_lr0: Any = hyperparam(1e-6)
    weight_decay: Any = hyperparam(0.0)

    float16_check: ClassVar[Float16Check] = Float16Check(("exp_avg_sq",), "the second moment", None)

    def state_keys(self) -> tuple[str, ...]:
        """Per-path moments and weighted gradient sum; the global estimate and step."""
        return (*_PER_PATH, "estim_lr", "numerator_weighted", "count")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Zero moments and gradient sum in the parameter's dtype."""
        return {name: zeros_for(param) for name in _PER_PATH}

    def init(self, params: Any) -> dict:
        """The per-path slots and the global scalars (float32 and int32)."""
        warn_float16_statistics(self, params)
        state = init_slots(params, self.init_leaf, _PER_PATH)
        state["estim_lr"] = scalar_copy(self.estim_lr0)
        state["numerator_weighted"] = jnp.zeros((), jnp.float32)
        state["count"] = jnp.zeros((), jnp.int32)
        return state

    def update(self, updates: Any, state: dict, params: Any = None, **extra: Any) -> tuple:
        """One D-Adapt AdamW step: moments, then the new estimate, then the step."""
        self.check_state(state)
        if params is None:
            raise needs_params_error(self.name)
        count = next_count(state["count"])
        t = count.astype(jnp.float32)
        b1, b2 = self.b1, self.b2
        sb2 = jnp.sqrt(b2)
        lr = hyperparam_at(self.learning_rate, state["count"])
        dlr = state["estim_lr"] * lr * jnp.sqrt(bias_correction(b2, t)) / bias_correction(b1, t)
        inner: list = []

        def moments(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            dtype = compute_dtype(g, *slots.values())
            grad = g.astype(dtype)
            m, v, s = (slots[k].astype(dtype) for k in _PER_PATH)
            db1, db2, dsb2 = b1.astype(dtype), b2.astype(dtype), sb2.astype(dtype)
            d, eps = dlr.astype(dtype), self.eps.astype(dtype)
            inner.append((grad, s / (jnp.sqrt(v) + eps)))
            new = {
                "exp_avg": db1 * m + (1 - db1) * d * grad,
                "exp_avg_sq": db2 * v + (1 - db2) * (grad * grad),
                "grad_sum": dsb2 * s + (1 - dsb2) * d * grad,
            }
            return g, {k: as_stored(x, slots[k]) for k, x in new.items()}

        slots = {k: state[k] for k in _PER_PATH}
        _, slots = update_slots(moments, updates, slots, params, owner=self.name, needs_params=True)
        numerator = sb2 * state["numerator_weighted"] + (1 - sb2) * dlr * flat_dot(inner)
        l1 = global_sum(slots["grad_sum"].values(), _l1)
        estimate = numerator / ((1 - sb2) * l1)
        # No gradient at all yet (l1 = 0): keep the previous estimate instead of 0/0.
        estim_lr = jnp.where(l1 > 0, jnp.maximum(state["estim_lr"], estimate), state["estim_lr"])

        new_updates = adam_direction_updates(
            updates,
            slots,
            params,
            owner=self.name,
            step_size=jnp.ones((), jnp.float32),
            eps=self.eps,
            decay=self.weight_decay * dlr,
        )
        return new_updates, {
            **slots,
            "estim_lr": estim_lr,
            "numerator_weighted": numerator,
            "count": count,
        }


def dadapt_adamw(
    learning_rate: ScalarOrSchedule = 1.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    estim_lr0: float = 1e-6,
    weight_decay: float = 0.0,
) -> DAdaptAdamW:
    r"""Learning-rate-free AdamW by D-Adaptation.

    With $d_t$ the current estimate of the distance to the solution, $\gamma_t$ the
    learning-rate schedule (1 for the method as published), $t$ the global step and
    $\lambda_t = d_t \gamma_t \sqrt{1-\beta_2^t} / (1-\beta_1^t)$; per path and element:

    $$m_t = \beta_1 m_{t-1} + (1-\beta_1)\lambda_t g_t,\quad
      v_t = \beta_2 v_{t-1} + (1-\beta_2) g_t^2,\quad
      s_t = \sqrt{\beta_2}\, s_{t-1} + (1-\sqrt{\beta_2})\lambda_t g_t$$

    and, over all paths together (inner products and the L1 norm are global),

    $$r_t = \sqrt{\beta_2}\, r_{t-1} + (1-\sqrt{\beta_2})\,\lambda_t
      \Big\langle g_t, \frac{s_{t-1}}{\sqrt{v_{t-1}} + \epsilon}\Big\rangle,\qquad
      d_{t+1} = \max\Big(d_t,\ \frac{r_t}{(1-\sqrt{\beta_2})\lVert s_t\rVert_1}\Big)$$

    $$u_t = -\frac{m_t}{\sqrt{v_t} + \epsilon} - \lambda\,\lambda_t\,\theta_t$$

    The update is already a descent step (no separate learning rate). $d$ only grows, from
    `estim_lr0`. While every gradient so far was zero ($\lVert s_t\rVert_1 = 0$) $d$ keeps
    its value.

    Args:
        learning_rate: a schedule multiplier on the estimated step (a number or a schedule
            of the global step).
        betas: the moment decays $(\beta_1, \beta_2)$.
        eps: added to the denominator.
        estim_lr0: the initial (under-)estimate $d_0$.
        weight_decay: AdamW-style decoupled decay $\lambda$, scaled by $\lambda_t$.

    State:
        Per path, shaped like the parameter: `exp_avg/<path>`, `exp_avg_sq/<path>`,
        `grad_sum/<path>`. Global, by name: `estim_lr` ($d$, float32), `numerator_weighted`
        ($r$, float32) and `count` (int32). The global scalars advance at every update, also
        when some paths have no gradient (their slots stay as they are).

    Examples:
        >>> tx = gradtx.contrib.dadapt_adamw()
        >>> params = {"w": jnp.ones(2)}
        >>> state = tx.init(params)
        >>> sorted(gradtx.state_dict(state))
        ['count', 'estim_lr', 'exp_avg/w', 'exp_avg_sq/w', 'grad_sum/w', 'numerator_weighted']
        >>> u, state = tx.update({"w": jnp.array([1.0, -1.0])}, state, params)
        >>> jnp.round(u["w"] / 1e-6, 3)  # the first step is d0-sized
        Array([-1.,  1.], dtype=float32)

    References:
        Defazio & Mishchenko, "Learning-Rate-Free Learning by D-Adaptation", ICML 2023.
    """
    b1, b2 = betas
    return DAdaptAdamW(learning_rate, b1, b2, eps, estim_lr0, weight_decay)
