"""SGD and Nesterov's method: the learning-rate step, with or without momentum (`trace`)."""

from __future__ import annotations

from typing import Any

from gradtx._combinators.chain import Chain
from gradtx._core.protocol import Transformation
from gradtx._optimizers.descent import descent
from gradtx._transforms.momentum import trace
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.shared_args import with_shared_args


@with_shared_args
def sgd(
    learning_rate: ScalarOrSchedule,
    momentum: float | None = None,
    nesterov: bool = False,
    *,
    accumulator_dtype: Any = None,
) -> Chain:
    """Stochastic gradient descent, optionally with (Nesterov) momentum.

    `chain(trace(momentum, nesterov), scale_by_learning_rate(learning_rate))`; without
    momentum, just the learning-rate step.

    Args:
        momentum: the momentum coefficient, or `None` for plain SGD.

    State:
        `trace/<path>` with momentum; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.sgd(0.1, momentum=0.9)
        >>> params = {"w": jnp.ones(2)}
        >>> u, state = tx.update({"w": jnp.ones(2)}, tx.init(params))
        >>> u["w"]
        Array([-0.1, -0.1], dtype=float32)
    """
    parts: list[Transformation] = []
    if momentum is not None:
        parts.append(trace(momentum, nesterov, accumulator_dtype=accumulator_dtype))
    elif nesterov:
        raise ValueError("sgd: nesterov=True needs a `momentum` value.")
    return descent("sgd", learning_rate, *parts)


def nesterov(
    learning_rate: ScalarOrSchedule, momentum: float = 0.9, *, accumulator_dtype: Any = None
) -> Any:
    r"""SGD with Nesterov momentum: `sgd(learning_rate, momentum, nesterov=True)` by name.

    `chain(trace(momentum, nesterov=True), scale_by_learning_rate(learning_rate))`:

    $$t_k = g_k + \mu\, t_{k-1},\qquad \theta_k = \theta_{k-1} - \eta\,(g_k + \mu\, t_k)$$

    Args:
        learning_rate: a number or a schedule.
        momentum: the momentum coefficient $\mu$.
        accumulator_dtype: dtype of the momentum buffer (default: the parameter's dtype).

    State:
        `trace/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.nesterov(0.1)
        >>> u, _ = tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.zeros(2)}))
        >>> u["w"]
        Array([-0.19, -0.19], dtype=float32)

    References:
        Sutskever et al., "On the importance of initialization and momentum in deep learning",
        2013.
    """
    return descent(
        "nesterov",
        learning_rate,
        trace(momentum, nesterov=True, accumulator_dtype=accumulator_dtype),
    )
