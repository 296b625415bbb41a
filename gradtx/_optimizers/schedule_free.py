"""Schedule-Free SGD and AdamW: `schedule_free` around a base optimizer without momentum."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from gradtx._combinators.schedule_free import ScheduleFree
from gradtx._core.module import decay_rate, hyperparam, is_schedule
from gradtx._core.per_array import hyperparam_at
from gradtx._optimizers.descent import descent
from gradtx._schedules.base import Schedule
from gradtx._schedules.warmups import warmup_constant
from gradtx._transforms.rms import scale_by_rms
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.shared_args import with_shared_args
from gradtx._transforms.weight_decay import add_decayed_weights, decay_unless_zero


def _warmed_up(learning_rate: Any, warmup_steps: Any, owner: str) -> Any:
    """The rate with the paper's linear warm-up: `lr * min(1, t / W)` at step `t` from 1.

    gradtx calls schedules with the number of earlier updates `k = t - 1`, and
    `warmup_constant(lr / W, lr, W - 1)` at `k` is `lr (k + 1) / W` up to `k = W - 1`,
    then `lr`: the first step already moves, by `lr / W`. `W` may be traced (a value that
    `inject_hyperparams` keeps in the state); a concrete one is checked.
    """
    if warmup_steps is None:
        return learning_rate
    if not isinstance(warmup_steps, Tracer):
        value = np.asarray(warmup_steps)
        number = value.shape == () and np.issubdtype(value.dtype, np.number)
        if isinstance(warmup_steps, bool) or not number or value < 0 or value != np.round(value):
            raise ValueError(
                f"{owner}: `warmup_steps` must be a non-negative integer or None, got "
                f"{warmup_steps!r}."
            )
        if value == 0:
            return learning_rate
    if is_schedule(learning_rate):
        raise TypeError(
            f"{owner}: `warmup_steps` needs a number as `learning_rate`, got a schedule; put the "
            "warm-up in the schedule and leave `warmup_steps=None`."
        )
    steps = (
        warmup_steps if isinstance(warmup_steps, int) else jnp.asarray(warmup_steps, jnp.float32)
    )
    return warmup_constant(learning_rate / steps, learning_rate, steps - 1)


class AdamStepSize(Schedule):
    r"""`rate(k) * sqrt(1 - b2**(k + 1))`: Adam's bias correction folded into the rate.

    Schedule-Free AdamW steps by $\gamma_t = \gamma\,\sqrt{1 - \beta_2^t}$ (step $t$ from 1)
    and weighs its average with that $\gamma_t$, so the correction is part of the schedule
    rather than of the second moment.
    """

    rate: Any = hyperparam()
    b2: Any = hyperparam(check=decay_rate)

    def __call__(self, step: Any) -> jax.Array:
        """The corrected rate after `step` earlier updates."""
        t = (jnp.asarray(step) + 1).astype(jnp.float32)
        # 1 - b2**t to full float32 precision (b2 near 1, t small): -expm1(t log1p(b2 - 1)).
        correction = -jnp.expm1(t * jnp.log1p(self.b2 - 1))
        return jnp.asarray(hyperparam_at(self.rate, step), jnp.float32) * jnp.sqrt(correction)


def schedule_free_sgd(
    learning_rate: ScalarOrSchedule = 1.0,
    warmup_steps: int | None = None,
    b1: float = 0.9,
    weight_decay: float | None = None,
    weight_lr_power: float = 2.0,
    state_dtype: Any = None,
) -> ScheduleFree:
    r"""Schedule-Free SGD: `schedule_free` around plain SGD (Defazio et al., 2024).

    `schedule_free(chain(add_decayed_weights(weight_decay), scale_by_learning_rate(lr)), lr,
    b1, weight_lr_power)`. At step $t$ (from 1), with the gradient $g_t$ taken at the
    params $y_t$ and $\gamma_t = \gamma \min(1, t / T_{\text{warmup}})$:

    $$z_{t+1} = z_t - \gamma_t\,(g_t + \lambda\,y_t)$$

    then $x$ and $y$ as in `schedule_free`. The decay is taken at $y$ and multiplied by the
    rate, as in the authors' code and PyTorch. Evaluate with
    `gradtx.eval_params(tx, state, params)`.

    Args:
        learning_rate: the peak rate $\gamma$ (a number, or a schedule without
            `warmup_steps`).
        warmup_steps: the length $T_{\text{warmup}}$ of the linear warm-up, or `None`; the
            first step already moves by $\gamma / T_{\text{warmup}}$.
        b1: the interpolation $\beta_1 \in (0, 1]$ (the momentum of the method).
        weight_decay: the decay rate $\lambda$, or `None` for none.
        weight_lr_power: the power of the rate in the averaging weights.
        state_dtype: dtype of `z` (default: the parameter's dtype).

    State:
        `base/schedule_count/<path>` with a warm-up or a schedule, `z/<path>`, and the
        per-path scalars `weight_sum/<path>`, `max_lr/<path>`, `count/<path>` (see
        `schedule_free`).

    Examples:
        >>> tx = gradtx.schedule_free_sgd(0.1, warmup_steps=10)
        >>> params = {"w": jnp.ones(2)}
        >>> state = tx.init(params)
        >>> u, state = tx.update({"w": jnp.ones(2)}, state, params)
        >>> gradtx.apply_updates(params, u)["w"]  # the first step: the rate is 0.1 / 10
        Array([0.99, 0.99], dtype=float32)
        >>> sorted(gradtx.state_dict(state))
        ['base/schedule_count/w', 'base/scheduled/learning_rate', 'count/w', 'max_lr/w',
         'weight_sum/w', 'z/w']

    References:
        Defazio et al., "The Road Less Scheduled", NeurIPS 2024 (arXiv:2405.15682).
    """
    rate = _warmed_up(learning_rate, warmup_steps, "schedule_free_sgd")
    parts = [] if weight_decay is None else [add_decayed_weights(weight_decay)]
    base = descent("sgd", rate, *parts)
    return ScheduleFree(base, rate, b1, weight_lr_power, state_dtype, "schedule_free_sgd")


@with_shared_args
def schedule_free_adamw(
    learning_rate: ScalarOrSchedule = 0.0025,
    warmup_steps: int | None = None,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    weight_lr_power: float = 2.0,
    state_dtype: Any = None,
    *,
    nu_dtype: Any = None,
) -> ScheduleFree:
    r"""Schedule-Free AdamW: `schedule_free` around Adam without momentum (Defazio et al.).

    `schedule_free(chain(scale_by_rms(b2, eps, eps_in_sqrt=False), add_decayed_weights(
    weight_decay), scale_by_learning_rate(rate)), rate, b1, weight_lr_power)`, with the
    rate of the paper's Algorithm 2: at step $t$ (from 1), with the gradient $g_t$ taken at
    the params $y_t$,

    $$v_t = \beta_2 v_{t-1} + (1 - \beta_2)\,g_t^2,\qquad
      \gamma_t = \gamma \min(1, t / T_{\text{warmup}})\,\sqrt{1 - \beta_2^t}$$

    $$z_{t+1} = z_t - \gamma_t \Big(\frac{g_t}{\sqrt{v_t} + \epsilon} + \lambda\,y_t\Big)$$

    then $x$ and $y$ as in `schedule_free`, the averaging weights taken from this
    $\gamma_t$ (bias correction included, so the first steps weigh little). Evaluate with
    `gradtx.eval_params(tx, state, params)`.

    Args:
        learning_rate: the peak rate $\gamma$ (a number, or a schedule without
            `warmup_steps`).
        warmup_steps: the length $T_{\text{warmup}}$ of the linear warm-up, or `None`.
        b1: the interpolation $\beta_1 \in (0, 1]$ (the momentum of the method).
        b2: the decay $\beta_2$ of the second moment.
        eps: added to $\sqrt{v_t}$.
        weight_decay: the decay rate $\lambda$, taken at $y$ and scaled by $\gamma_t$.
        weight_lr_power: the power of the rate in the averaging weights.
        state_dtype: dtype of `z` (default: the parameter's dtype).

    State:
        `base/nu/<path>`, `base/schedule_count/<path>`, `z/<path>`, and the per-path scalars
        `weight_sum/<path>`, `max_lr/<path>`, `count/<path>` (see `schedule_free`).

    Examples:
        >>> tx = gradtx.schedule_free_adamw(0.1)
        >>> params = {"w": jnp.ones(2)}
        >>> state = tx.init(params)
        >>> u, state = tx.update({"w": jnp.array([2.0, -0.5])}, state, params)
        >>> [f"{v:.4f}" for v in u["w"].tolist()]  # Adam's first step: -lr * sign(g)
        ['-0.1000', '0.1000']
        >>> sorted(gradtx.state_dict(state))
        ['base/nu/w', 'base/schedule_count/w', 'base/scheduled/learning_rate', 'count/w',
         'max_lr/w', 'weight_sum/w', 'z/w']

    References:
        Defazio et al., "The Road Less Scheduled", NeurIPS 2024 (arXiv:2405.15682),
        Algorithm 2.
    """
    rate = AdamStepSize(_warmed_up(learning_rate, warmup_steps, "schedule_free_adamw"), b2)
    base = descent(
        "adamw",
        rate,
        scale_by_rms(b2, eps, eps_in_sqrt=False, nu_dtype=nu_dtype),
        *decay_unless_zero(weight_decay, None),
    )
    return ScheduleFree(base, rate, b1, weight_lr_power, state_dtype, "schedule_free_adamw")
