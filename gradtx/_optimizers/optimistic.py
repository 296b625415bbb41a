"""Optimistic gradient descent and optimistic Adam, on `scale_by_optimistic_gradient`."""

from __future__ import annotations

from typing import Any

from gradtx._combinators.chain import Chain
from gradtx._core.module import is_schedule
from gradtx._optimizers.descent import descent
from gradtx._transforms.adam import scale_by_adam
from gradtx._transforms.optimistic import scale_by_optimistic_gradient
from gradtx._transforms.scale import ScalarOrSchedule, scale_by_learning_rate
from gradtx._transforms.shared_args import with_shared_args


def optimistic_gradient_descent(
    learning_rate: ScalarOrSchedule, alpha: float = 1.0, beta: float = 1.0
) -> Any:
    r"""Optimistic gradient descent, for min-max games.

    `chain(scale_by_optimistic_gradient(alpha, beta), scale_by_learning_rate(learning_rate))`:

    $$\theta_t = \theta_{t-1} - \eta\big((\alpha + \beta) g_t - \beta g_{t-1}\big)$$

    with $g_0 = g_1$. `alpha` and `beta` are numbers (optax also takes schedules for them).

    Args:
        learning_rate: a number or a schedule.
        alpha: the weight of the current gradient.
        beta: the weight of the gradient's change.

    State:
        `previous_gradient/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.optimistic_gradient_descent(0.1)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'previous_gradient/w']

    References:
        Mokhtari et al., "A Unified Analysis of Extra-gradient and Optimistic Gradient Methods
        for Saddle Point Problems: Proximal Point Approach", 2019.
    """
    return descent(
        "optimistic_gradient_descent", learning_rate, scale_by_optimistic_gradient(alpha, beta)
    )


@with_shared_args
def optimistic_adam(
    learning_rate: float,
    optimism: float | None = None,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any = None,
    *,
    nesterov: bool = True,
) -> Chain:
    r"""Optimistic Adam: the optimistic step taken on Adam's normalised direction.

    `chain(scale_by_adam(b1, b2, eps, eps_root, mu_dtype=mu_dtype, nesterov=nesterov),
    scale_by_optimistic_gradient(alpha=learning_rate, beta=optimism),
    scale_by_learning_rate(1.0))`, as optax defines it. With $r_t$ Adam's bias-corrected
    direction $\hat m_t / (\sqrt{\hat v_t + \bar\epsilon} + \epsilon)$ (NAdam's $\hat m_t$
    with `nesterov=True`, the default):

    $$\theta_t = \theta_{t-1} - \eta\, r_t - o\,(r_t - r_{t-1})$$

    with $\eta$ = `learning_rate`, $o$ = `optimism` (default: $\eta$) and $r_0 = r_1$ at a
    path's first step. Optimism damps the cycling of simultaneous gradient steps in min-max
    games such as GANs.

    Which optimistic Adam this is: Daskalakis et al. (2018, Algorithm 1) take the optimistic
    step on Adam's normalised update, $\theta_t = \theta_{t-1} - 2\eta r_t + \eta r_{t-1}$:
    that is this function with `nesterov=False` and the default `optimism`, except at the
    first step, where they start from $r_0 = 0$ (a step of $2\eta r_1$) and this takes
    $\eta r_1$. optax's default `nesterov=True` puts NAdam's momentum in $r_t$; pass
    `nesterov=False` for the paper's method. The other arrangement, extrapolating the raw
    gradients ($2g_t - g_{t-1}$) and feeding them to Adam, changes Adam's moments rather
    than its steps: build it as `chain(scale_by_optimistic_gradient(), scale_by_adam(),
    scale_by_learning_rate(lr))`.

    The learning rate is the weight $\alpha$ of the optimistic step, so it is a number
    (optax refuses a schedule too). For a schedule $\eta_t$, chain `scale_by_adam(...)`,
    `scale_by_optimistic_gradient(alpha, beta)` and `scale_by_learning_rate(schedule)`
    (optax's `optimistic_adam_v2`): the step is then $\eta_t(\alpha r_t + \beta(r_t -
    r_{t-1}))$.
    The chain's steps keep their states under their own names (Adam and the optimistic step
    both count steps).

    Args:
        learning_rate: the step size $\eta$ (a number).
        optimism: the weight $o$ of the change of direction; `None` uses `learning_rate`, as
            in the paper.
        b1: decay of Adam's first moment.
        b2: decay of Adam's second moment.
        eps: added to the denominator of Adam's direction.
        eps_root: added to the second moment inside the square root.
        nesterov: use NAdam's first moment (optax's default) instead of Adam's.

    State:
        `scale_by_adam/{mu,nu,count}/<path>` and
        `scale_by_optimistic_gradient/{previous_gradient,count}/<path>`.

    Examples:
        >>> tx = gradtx.optimistic_adam(0.01)
        >>> for key in sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)}))):
        ...     print(key)
        scale_by_adam/count/w
        scale_by_adam/mu/w
        scale_by_adam/nu/w
        scale_by_optimistic_gradient/count/w
        scale_by_optimistic_gradient/previous_gradient/w

    References:
        Daskalakis et al., "Training GANs with Optimism", ICLR 2018.
    """
    if is_schedule(learning_rate):
        raise TypeError(
            "optimistic_adam: `learning_rate` must be a number: it is the weight alpha of the "
            "optimistic step. For a schedule, chain `scale_by_adam(...)`, "
            "`scale_by_optimistic_gradient(alpha, beta)` and `scale_by_learning_rate(schedule)`."
        )
    steps = (
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype=mu_dtype, nesterov=nesterov),
        scale_by_optimistic_gradient(
            alpha=learning_rate, beta=learning_rate if optimism is None else optimism
        ),
        scale_by_learning_rate(1.0),
    )
    return Chain(steps, tuple(step.name for step in steps), "optimistic_adam")
