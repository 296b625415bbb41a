"""Prodigy: D-Adaptation with a faster-growing estimate of the step size."""

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
from gradtx._core.module import decay_rate, hyperparam, non_negative, static
from gradtx._layouts.step_counts import next_count
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx.contrib._dadapt import needs_params_error
from gradtx.contrib._reductions import (
    adam_direction_updates,
    bias_correction,
    copy_of,
    flat_dot,
    global_sum,
    scalar_copy,
)

__all__ = ["prodigy"]

_MOMENTS = ("exp_avg", "exp_avg_sq", "grad_sum")


def _l1(array: Any) -> Any:
    return jnp.sum(jnp.abs(array))


class Prodigy(ElementwiseTransform):
    """Learning-rate-free AdamW by Prodigy (see `prodigy`)."""

    name: ClassVar[str] = "prodigy"
    needs_params: ClassVar[bool] = True
    learning_rate: Any = hyperparam(1.0)
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.999, check=decay_rate)
    beta3: Any = hyperparam(None, check=decay_rate)
    eps: Any = hyperparam(1e-8, check=non_negative)
    estim_lr0: Any = hyperparam(1e-6)
    estim_lr_coef: Any = hyperparam(1.0)
    weight_decay: Any = hyperparam(0.0)
    safeguard_warmup: bool = static(False)

    float16_check: ClassVar[Float16Check] = Float16Check(("exp_avg_sq",), "the second moment", None)

    def state_keys(self) -> tuple[str, ...]:
        """Per-path moments, gradient sum and starting point; the global estimate and step."""
        return (*_MOMENTS, "params0", "estim_lr", "numerator_weighted", "count")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Zero moments and gradient sum, and a copy of the parameter."""
        slots = {name: zeros_for(param) for name in _MOMENTS}
        slots["params0"] = copy_of(param)
        return slots

    def init(self, params: Any) -> dict:
        """The per-path slots and the global scalars (float32 and int32)."""
        warn_float16_statistics(self, params)
        state = init_slots(params, self.init_leaf, (*_MOMENTS, "params0"))
        state["estim_lr"] = scalar_copy(self.estim_lr0)
        state["numerator_weighted"] = jnp.zeros((), jnp.float32)
        state["count"] = jnp.zeros((), jnp.int32)
        return state

    def update(self, updates: Any, state: dict, params: Any = None, **extra: Any) -> tuple:
        """One Prodigy step: moments, then the new estimate, then the step."""
        self.check_state(state)
        if params is None:
            raise needs_params_error(self.name)
        count = next_count(state["count"])
        t = count.astype(jnp.float32)
        b1, b2 = self.b1, self.b2
        b3 = jnp.sqrt(b2) if self.beta3 is None else self.beta3
        d, d0 = state["estim_lr"], self.estim_lr0
        lr = hyperparam_at(self.learning_rate, state["count"])
        dlr = d * lr * jnp.sqrt(bias_correction(b2, t)) / bias_correction(b1, t)
        # safeguard_warmup leaves the schedule out of the weights of the gradient sum.
        weight = d / d0 if self.safeguard_warmup else dlr / d0
        inner: list = []

        def moments(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            dtype = compute_dtype(g, param, *slots.values())
            grad = g.astype(dtype)
            m, v, s = (slots[k].astype(dtype) for k in _MOMENTS)
            p0 = slots["params0"].astype(dtype)
            inner.append((grad, p0 - param.astype(dtype)))
            db1, db2, db3 = b1.astype(dtype), b2.astype(dtype), b3.astype(dtype)
            dg = d.astype(dtype) * grad
            new = {
                "exp_avg": db1 * m + (1 - db1) * dg,
                "exp_avg_sq": db2 * v + (1 - db2) * (dg * dg),
                "grad_sum": db3 * s + weight.astype(dtype) * dg,
            }
            return g, {k: as_stored(x, slots[k]) for k, x in new.items()}

        slots = {k: state[k] for k in (*_MOMENTS, "params0")}
        _, slots = update_slots(moments, updates, slots, params, owner=self.name, needs_params=True)
        numerator = b3 * state["numerator_weighted"] + (d / d0) * dlr * flat_dot(inner)
        l1 = global_sum(slots["grad_sum"].values(), _l1)
        estimate = self.estim_lr_coef * numerator / l1
        # No gradient at all yet (l1 = 0): keep the previous estimate instead of 0/0.
        new_d = jnp.where(l1 > 0, jnp.maximum(d, estimate), d)

        new_updates = adam_direction_updates(
            updates,
            slots,
            params,
            owner=self.name,
            step_size=dlr,
            eps=new_d * self.eps,
            decay=self.weight_decay * dlr,
        )
        return new_updates, {
            **slots,
            "estim_lr": new_d,
            "numerator_weighted": numerator,
            "count": count,
        }


def prodigy(
    learning_rate: ScalarOrSchedule = 1.0,
    betas: tuple[float, float] = (0.9, 0.999),
    beta3: float | None = None,
    eps: float = 1e-8,
    estim_lr0: float = 1e-6,
    estim_lr_coef: float = 1.0,
    weight_decay: float = 0.0,
    safeguard_warmup: bool = False,
) -> Prodigy:
    r"""Learning-rate-free AdamW by Prodigy.

    With $d_t$ the current step-size estimate, $\gamma_t$ the learning-rate schedule (1 for
    the method as published), $t$ the global step, $\theta_0$ the params at `init` and
    $\lambda_t = d_t \gamma_t \sqrt{1-\beta_2^t} / (1-\beta_1^t)$; per path and element:

    $$m_t = \beta_1 m_{t-1} + (1-\beta_1) d_t g_t,\quad
      v_t = \beta_2 v_{t-1} + (1-\beta_2) d_t^2 g_t^2,\quad
      s_t = \beta_3 s_{t-1} + \frac{\lambda_t}{d_0} d_t g_t$$

    and, over all paths together,

    $$r_t = \beta_3 r_{t-1} + \frac{d_t}{d_0}\lambda_t\,\langle g_t, \theta_0 - \theta_t\rangle,
      \qquad d_{t+1} = \max\Big(d_t,\ c\,\frac{r_t}{\lVert s_t\rVert_1}\Big)$$

    $$u_t = -\lambda_t \frac{m_t}{\sqrt{v_t} + d_{t+1}\,\epsilon} - \lambda\,\lambda_t\,\theta_t$$

    with $\beta_3 = \sqrt{\beta_2}$ by default and $c$ = `estim_lr_coef`. With
    `safeguard_warmup`, $s_t$ weighs $d_t g_t$ by $d_t / d_0$ instead of $\lambda_t / d_0$
    (the schedule is left out, which keeps $d$ from growing too fast during a warm-up). The
    update is already a descent step. While every gradient so far was zero, $d$ keeps its
    value.

    Args:
        learning_rate: a schedule multiplier on the estimated step (a number or a schedule of
            the global step; a linear decay from 1 to 0 after a short warm-up is suggested).
        betas: the moment decays $(\beta_1, \beta_2)$.
        beta3: the decay of $s$ and $r$ (default $\sqrt{\beta_2}$).
        eps: added to the denominator, scaled by $d$.
        estim_lr0: the initial (under-)estimate $d_0$.
        estim_lr_coef: the factor $c$ on each new estimate.
        weight_decay: AdamW-style decoupled decay $\lambda$, scaled by $\lambda_t$.
        safeguard_warmup: leave the schedule out of the weights of $s$.

    State:
        Per path, shaped like the parameter: `exp_avg/<path>`, `exp_avg_sq/<path>`,
        `grad_sum/<path>` and `params0/<path>` (a copy of the parameter made by `init`, so
        `init` needs the real params; `jax.ShapeDtypeStruct` leaves give zeros, to restore a
        checkpoint into). Global, by name: `estim_lr` ($d$, float32), `numerator_weighted`
        ($r$, float32) and `count` (int32), which advance at every update.

    Examples:
        >>> tx = gradtx.contrib.prodigy()
        >>> params = {"w": jnp.ones(2)}
        >>> state = tx.init(params)
        >>> u, state = tx.update({"w": jnp.array([1.0, -1.0])}, state, params)
        >>> jnp.round(u["w"] / 1e-6, 3)  # the first step is d0-sized
        Array([-1.,  1.], dtype=float32)
        >>> bool(state["estim_lr"] == jnp.float32(1e-6))  # no distance travelled yet: d0
        True

    References:
        Mishchenko & Defazio, "Prodigy: An Expeditiously Adaptive Parameter-Free Learner",
        ICML 2024.
    """
    b1, b2 = betas
    return Prodigy(
        learning_rate,
        b1,
        b2,
        beta3,
        eps,
        estim_lr0,
        estim_lr_coef,
        weight_decay,
        safeguard_warmup,
    )
