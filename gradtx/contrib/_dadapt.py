"""D-Adaptation for AdamW: the step size from a lower bound on the distance to the solution."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import as_stored, compute_dtype, update_slots, zeros_for
from gradtx._core.module import decay_rate, hyperparam, non_negative
from gradtx._core.per_array import Float16Check, PerArrayTransform, hyperparam_at
from gradtx._core.protocol import Params, Updates
from gradtx._layouts.step_counts import next_count
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._tree.reductions import global_sum
from gradtx.contrib._reductions import bias_correction, flat_dot, scalar_copy

MOMENT_SLOTS = ("exp_avg", "exp_avg_sq", "grad_sum")


def _l1(array: Any) -> Any:
    return jnp.sum(jnp.abs(array))


class DistanceEstimatingAdamW(PerArrayTransform):
    """AdamW whose step size `d` is a global estimate of the distance to the solution.

    D-Adaptation and Prodigy share this step: per path the moments `exp_avg`, `exp_avg_sq`
    and a weighted gradient sum `grad_sum` (`s`); over all paths an inner product `r`; then
    `d = max(d, r / |s|_1)`, kept while `|s|_1` is 0, and the AdamW step. Subclasses define:

        leaf_moments(g, slots, param, d, dlr, b3) -> ((a, b), new moments): one array's
            math, with `(a, b)` the pair whose inner product `r` sums
        estimate(r, dot, l1, d, dlr, b3) -> (new r, estimate of d)
        adam_step(dlr, new_d) -> (step size, epsilon) of the AdamW step
    """

    needs_params: ClassVar[bool] = True
    float16_check: ClassVar[Float16Check] = Float16Check(("exp_avg_sq",), "the second moment", None)
    # Per-path slots beyond the moments (Prodigy's copy of the params).
    extra_slots: ClassVar[tuple[str, ...]] = ()

    if TYPE_CHECKING:  # each subclass's own fields (here they would come first) and math
        learning_rate: ClassVar[Any]
        b1: ClassVar[Any]
        b2: ClassVar[Any]
        estim_lr0: ClassVar[Any]
        weight_decay: ClassVar[Any]

        def leaf_moments(
            self, g: Any, slots: dict, param: Any, d: Any, dlr: Any, b3: Any
        ) -> tuple[tuple[Any, Any], dict]: ...
        def estimate(
            self, numerator: Any, dot: Any, l1: Any, d: Any, dlr: Any, b3: Any
        ) -> tuple: ...
        def adam_step(self, dlr: Any, d: Any) -> tuple[Any, Any]: ...

    def state_keys(self) -> tuple[str, ...]:
        """Per-path moments and weighted gradient sum; the global estimate and step."""
        return (*self.slot_keys(), "estim_lr", "numerator_weighted", "count")

    def slot_keys(self) -> tuple[str, ...]:
        """The per-path slots: the moments, and `extra_slots`."""
        return (*MOMENT_SLOTS, *self.extra_slots)

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Zero moments and gradient sum in the parameter's dtype."""
        return {name: zeros_for(param) for name in MOMENT_SLOTS}

    def init_state(self, params: Params) -> dict:
        """The per-path slots and the global scalars (float32 and int32)."""
        state = super().init_state(params)
        state["estim_lr"] = scalar_copy(self.estim_lr0)
        state["numerator_weighted"] = jnp.zeros((), jnp.float32)
        state["count"] = jnp.zeros((), jnp.int32)
        return state

    def sum_decay(self) -> Any:
        """The decay of `s` and `r`: the square root of `b2`."""
        return jnp.sqrt(self.b2)

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """One step: moments, then the new estimate, then the AdamW step."""
        self.check_state(state)  # `update_slots` below raises without the params
        count = next_count(state["count"])
        t = count.astype(jnp.float32)
        d = state["estim_lr"]
        lr = hyperparam_at(self.learning_rate, state["count"])
        dlr = d * lr * jnp.sqrt(bias_correction(self.b2, t)) / bias_correction(self.b1, t)
        b3 = self.sum_decay()
        inner: list = []

        def moments(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            pair, new = self.leaf_moments(g, slots, param, d, dlr, b3)
            inner.append(pair)
            return g, {k: as_stored(x, slots[k]) for k, x in new.items()}

        slots = {k: state[k] for k in self.slot_keys()}
        _, slots = update_slots(moments, updates, slots, params, owner=self.name, needs_params=True)
        l1 = global_sum(slots["grad_sum"].values(), _l1)
        numerator, estimate = self.estimate(
            state["numerator_weighted"], flat_dot(inner), l1, d, dlr, b3
        )
        # No gradient at all yet (l1 = 0): keep the previous estimate instead of 0/0.
        new_d = jnp.where(l1 > 0, jnp.maximum(d, estimate), d)
        step_size, eps = self.adam_step(dlr, new_d)
        decay = self.weight_decay * dlr

        def adamw(g: Any, leaf: dict, param: Any) -> tuple[Any, dict]:
            # `-decay * p - step_size * m / (sqrt(v) + eps)`, from the moments as stored
            dtype = compute_dtype(g, param, *leaf.values())
            m, v = leaf["exp_avg"].astype(dtype), leaf["exp_avg_sq"].astype(dtype)
            u = -decay.astype(dtype) * param.astype(dtype) - step_size.astype(dtype) * m / (
                jnp.sqrt(v) + eps.astype(dtype)
            )
            return u.astype(g.dtype), {}

        moment_slots = {k: slots[k] for k in ("exp_avg", "exp_avg_sq")}
        new_updates, _ = update_slots(
            adamw, updates, moment_slots, params, owner=self.name, needs_params=True
        )
        return new_updates, {
            **slots,
            "estim_lr": new_d,
            "numerator_weighted": numerator,
            "count": count,
        }


class DAdaptAdamW(DistanceEstimatingAdamW):
    """AdamW whose step size is estimated by D-Adaptation (see `dadapt_adamw`)."""

    name: ClassVar[str] = "dadapt_adamw"
    learning_rate: Any = hyperparam(1.0)
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.999, check=decay_rate)
    eps: Any = hyperparam(1e-8, check=non_negative)
    estim_lr0: Any = hyperparam(1e-6)
    weight_decay: Any = hyperparam(0.0)

    def leaf_moments(
        self, g: Any, slots: dict, param: Any, d: Any, dlr: Any, b3: Any
    ) -> tuple[tuple[Any, Any], dict]:
        """`<g, s / (sqrt(v) + eps)>` with the old moments; moments weighted by `dlr`."""
        dtype = compute_dtype(g, *slots.values())
        grad = g.astype(dtype)
        m, v, s = (slots[k].astype(dtype) for k in MOMENT_SLOTS)
        db1, db2, dsb2 = self.b1.astype(dtype), self.b2.astype(dtype), b3.astype(dtype)
        lam, eps = dlr.astype(dtype), self.eps.astype(dtype)
        new = {
            "exp_avg": db1 * m + (1 - db1) * lam * grad,
            "exp_avg_sq": db2 * v + (1 - db2) * (grad * grad),
            "grad_sum": dsb2 * s + (1 - dsb2) * lam * grad,
        }
        return (grad, s / (jnp.sqrt(v) + eps)), new

    def estimate(self, numerator: Any, dot: Any, l1: Any, d: Any, dlr: Any, b3: Any) -> tuple:
        """`r = sb2 r + (1 - sb2) dlr dot` and `r / ((1 - sb2) |s|_1)`."""
        numerator = b3 * numerator + (1 - b3) * dlr * dot
        return numerator, numerator / ((1 - b3) * l1)

    def adam_step(self, dlr: Any, d: Any) -> tuple[Any, Any]:
        """The moments carry `dlr` already: step size 1, the plain epsilon."""
        return jnp.ones((), jnp.float32), self.eps


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
