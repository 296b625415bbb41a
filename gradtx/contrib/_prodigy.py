"""Prodigy: D-Adaptation with a faster-growing estimate of the step size."""

from __future__ import annotations

from typing import Any, ClassVar

from gradtx._core.lift import compute_dtype
from gradtx._core.module import decay_rate, hyperparam, non_negative, static
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx.contrib._dadapt import MOMENT_SLOTS, DistanceEstimatingAdamW
from gradtx.contrib._reductions import copy_of


class Prodigy(DistanceEstimatingAdamW):
    """Learning-rate-free AdamW by Prodigy (see `prodigy`)."""

    name: ClassVar[str] = "prodigy"
    extra_slots: ClassVar[tuple[str, ...]] = ("params0",)
    learning_rate: Any = hyperparam(1.0)
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.999, check=decay_rate)
    beta3: Any = hyperparam(None, check=decay_rate)
    eps: Any = hyperparam(1e-8, check=non_negative)
    estim_lr0: Any = hyperparam(1e-6)
    estim_lr_coef: Any = hyperparam(1.0)
    weight_decay: Any = hyperparam(0.0)
    safeguard_warmup: bool = static(False)

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Zero moments and gradient sum, and a copy of the parameter."""
        return {**super().init_leaf(param), "params0": copy_of(param)}

    def sum_decay(self) -> Any:
        """`beta3`, by default the square root of `b2`."""
        return super().sum_decay() if self.beta3 is None else self.beta3

    def leaf_moments(
        self, g: Any, slots: dict, param: Any, d: Any, dlr: Any, b3: Any
    ) -> tuple[tuple[Any, Any], dict]:
        """`<g, x0 - x>`; moments of `d g`, the sum weighted by `dlr / d0` (or `d / d0`)."""
        dtype = compute_dtype(g, param, *slots.values())
        grad = g.astype(dtype)
        m, v, s = (slots[k].astype(dtype) for k in MOMENT_SLOTS)
        p0 = slots["params0"].astype(dtype)
        db1, db2, db3 = self.b1.astype(dtype), self.b2.astype(dtype), b3.astype(dtype)
        # safeguard_warmup leaves the schedule out of the weights of the gradient sum.
        weight = d / self.estim_lr0 if self.safeguard_warmup else dlr / self.estim_lr0
        dg = d.astype(dtype) * grad
        new = {
            "exp_avg": db1 * m + (1 - db1) * dg,
            "exp_avg_sq": db2 * v + (1 - db2) * (dg * dg),
            "grad_sum": db3 * s + weight.astype(dtype) * dg,
        }
        return (grad, p0 - param.astype(dtype)), new

    def estimate(self, numerator: Any, dot: Any, l1: Any, d: Any, dlr: Any, b3: Any) -> tuple:
        """`r = b3 r + (d / d0) dlr dot` and `c r / |s|_1`."""
        numerator = b3 * numerator + (d / self.estim_lr0) * dlr * dot
        return numerator, self.estim_lr_coef * numerator / l1

    def adam_step(self, dlr: Any, d: Any) -> tuple[Any, Any]:
        """The step size `dlr`, and epsilon scaled by the new `d`."""
        return dlr, d * self.eps


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
        learning_rate, b1, b2, beta3, eps, estim_lr0, estim_lr_coef, weight_decay, safeguard_warmup
    )
