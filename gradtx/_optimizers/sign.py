"""Sign-based optimizers: signSGD, Signum and Rprop, on `scale_by_sign` and `scale_by_rprop`."""

from __future__ import annotations

from typing import Any

from gradtx._combinators.chain import optimizer
from gradtx._optimizers.descent import descent
from gradtx._transforms.averaging import ema
from gradtx._transforms.scale import ScalarOrSchedule, scale
from gradtx._transforms.sign import scale_by_rprop, scale_by_sign


def sign_sgd(learning_rate: ScalarOrSchedule) -> Any:
    r"""signSGD: step by the sign of the gradient.

    `chain(scale_by_sign(), scale_by_learning_rate(learning_rate))`:

    $$\theta_t = \theta_{t-1} - \eta\, \operatorname{sign}(g_t)$$

    Args:
        learning_rate: a number or a schedule.

    Examples:
        >>> tx = gradtx.sign_sgd(0.1)
        >>> tx.update({"w": jnp.array([-3.0, 2.0])}, tx.init({"w": jnp.zeros(2)}))[0]["w"]
        Array([ 0.1, -0.1], dtype=float32)

    References:
        Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex Problems", 2018.
    """
    return descent("sign_sgd", learning_rate, scale_by_sign())


def signum(
    learning_rate: ScalarOrSchedule, beta: float = 0.9, accumulator_dtype: Any = None
) -> Any:
    r"""Signum: step by the sign of a momentum.

    `chain(ema(beta, debias=False), scale_by_sign(), scale_by_learning_rate(learning_rate))`:

    $$m_t = \beta m_{t-1} + (1-\beta) g_t,\qquad \theta_t = \theta_{t-1} - \eta\,
      \operatorname{sign}(m_t)$$

    (no bias correction: it does not change the sign).

    Args:
        learning_rate: a number or a schedule.
        beta: decay of the momentum.
        accumulator_dtype: dtype of the momentum (default: the parameter's dtype).

    State:
        `ema/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.signum(0.1)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['ema/w']

    References:
        Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex Problems", 2018.
    """
    return descent(
        "signum",
        learning_rate,
        ema(beta, debias=False, accumulator_dtype=accumulator_dtype),
        scale_by_sign(),
    )


def rprop(
    learning_rate: float,
    eta_minus: float = 0.5,
    eta_plus: float = 1.2,
    min_step_size: float = 1e-6,
    max_step_size: float = 50.0,
) -> Any:
    r"""Rprop (iRprop$^-$): per-element step sizes driven by the sign of the gradient.

    `chain(scale_by_rprop(...), scale(-1))`; see `scale_by_rprop` for the rule. The learning
    rate is the initial step size of every element, so it is a number, not a schedule, and
    the chain ends in `scale(-1)` rather than a learning rate. Unlike optax 0.2.8, the update
    of a step is that step's own (optax returns the previous one; see `scale_by_rprop`).

    Args:
        learning_rate: the initial step size.
        eta_minus: factor that shrinks a step size after a sign change.
        eta_plus: factor that grows a step size while the sign holds.
        min_step_size: the smallest step size.
        max_step_size: the largest step size.

    State:
        `step_sizes/<path>` and `prev_updates/<path>`.

    Examples:
        >>> tx = gradtx.rprop(0.1)
        >>> tx.update({"w": jnp.array([2.0, -1.0])}, tx.init({"w": jnp.zeros(2)}))[0]["w"]
        Array([-0.1,  0.1], dtype=float32)

    References:
        Riedmiller & Braun, "A Direct Adaptive Method for Faster Backpropagation Learning: The
        RPROP Algorithm", 1993; Igel & Hüsken, "Improving the Rprop Learning Algorithm", 2000.
    """
    return optimizer(
        "rprop",
        scale_by_rprop(learning_rate, eta_minus, eta_plus, min_step_size, max_step_size),
        scale(-1.0),
    )
