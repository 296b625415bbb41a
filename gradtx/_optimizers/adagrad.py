"""Adagrad and Adadelta, on `scale_by_rss` and `scale_by_adadelta`."""

from __future__ import annotations

from typing import Any

from gradtx._combinators.chain import Chain
from gradtx._optimizers.descent import descent
from gradtx._transforms.adagrad import scale_by_adadelta, scale_by_rss
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.shared_args import with_shared_args
from gradtx._transforms.weight_decay import decay_unless_zero


def adagrad(
    learning_rate: ScalarOrSchedule,
    initial_accumulator_value: float = 0.1,
    eps: float = 1e-7,
    *,
    accumulator_dtype: Any = None,
) -> Chain:
    """Adagrad: `chain(scale_by_rss(...), scale_by_learning_rate(learning_rate))`.

    The effective step of each element shrinks as its squared gradients add up.

    Args:
        learning_rate: a number or a schedule.
        initial_accumulator_value: the initial sum of squares.
        eps: added inside the square root.
        accumulator_dtype: dtype of the sum of squares (default: the parameter's dtype).

    State:
        `sum_of_squares/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.adagrad(1.0, initial_accumulator_value=0.0, eps=0.0)
        >>> u, _ = tx.update({"w": jnp.array([-4.0])}, tx.init({"w": jnp.zeros(1)}))
        >>> u["w"]
        Array([1.], dtype=float32)

    References:
        Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and
        Stochastic Optimization", JMLR 2011.
    """
    return descent(
        "adagrad",
        learning_rate,
        scale_by_rss(initial_accumulator_value, eps, accumulator_dtype=accumulator_dtype),
    )


@with_shared_args
def adadelta(
    learning_rate: ScalarOrSchedule = 1.0,
    rho: float = 0.9,
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    *,
    mask: Any = None,
    accumulator_dtype: Any = None,
) -> Chain:
    """Adadelta, with optional (coupled) weight decay.

    `chain(add_decayed_weights(weight_decay, mask), scale_by_adadelta(...),
    scale_by_learning_rate(learning_rate))`: as in optax, the decay is added to the gradient
    *before* the rescaling (L2 regularisation). With a literal `weight_decay=0` and no mask
    the decay step is left out, so `update` does not need the params.

    Differences from optax: the learning rate defaults to `1.0` (the paper's method, which
    has none); optax's default `None` skips the learning-rate step and with it the sign flip,
    so its updates ascend. The decay mask is called `mask` (optax: `weight_decay_mask`).

    Args:
        rho: decay of both moving averages.
        eps: added inside both square roots.
        weight_decay: the L2 decay rate added to the gradient.
        accumulator_dtype: dtype of both averages (default: the parameter's dtype).

    State:
        `mean_sq_grad/<path>`, `mean_sq_update/<path>`; `schedule_count/<path>` with a
        schedule.

    Examples:
        >>> tx = gradtx.adadelta()
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['mean_sq_grad/w', 'mean_sq_update/w']

    References:
        Zeiler, "ADADELTA: An Adaptive Learning Rate Method", 2012.
    """
    return descent(
        "adadelta",
        learning_rate,
        *decay_unless_zero(weight_decay, mask),
        scale_by_adadelta(rho, eps, accumulator_dtype=accumulator_dtype),
    )
