"""Optimistic gradient descent, on `scale_by_optimistic_gradient`."""

from __future__ import annotations

from typing import Any

from gradtx._combinators.chain import optimizer
from gradtx._transforms.optimistic import scale_by_optimistic_gradient
from gradtx._transforms.scale import ScalarOrSchedule, scale_by_learning_rate

__all__ = ["optimistic_gradient_descent"]


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
    return optimizer(
        "optimistic_gradient_descent",
        scale_by_optimistic_gradient(alpha, beta),
        scale_by_learning_rate(learning_rate),
    )
