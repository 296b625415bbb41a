"""The Lion optimizer, on `scale_by_lion`."""

from __future__ import annotations

from typing import Any

from gradtx._optimizers.descent import descent
from gradtx._transforms.lion import scale_by_lion
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.shared_args import with_shared_args
from gradtx._transforms.weight_decay import add_decayed_weights


@with_shared_args
def lion(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.99,
    mu_dtype: Any = None,
    weight_decay: float = 1e-3,
    mask: Any = None,
    *,
    mode: str = "hard",
    smooth_beta: float = 1.0,
) -> Any:
    r"""Lion: the sign of an interpolated momentum, with decoupled weight decay.

    `chain(scale_by_lion(b1, b2, mode=mode, smooth_beta=smooth_beta),
    add_decayed_weights(weight_decay, mask), scale_by_learning_rate(learning_rate))`:

    $$\theta_t = \theta_{t-1} - \eta\big(\operatorname{sign}(\beta_1 m_{t-1} + (1-\beta_1) g_t)
      + \lambda\,\theta_{t-1}\big),\qquad m_t = \beta_2 m_{t-1} + (1-\beta_2) g_t$$

    Args:
        learning_rate: a number or a schedule (typically 3-10x smaller than Adam's).
        b1: interpolation between momentum and gradient for the update.
        b2: decay of the momentum.
        mu_dtype: dtype of the momentum (default: the parameter's dtype).
        weight_decay: the decoupled decay rate $\lambda$ (typically 3-10x larger than AdamW's).
        mode: `"hard"` (the sign, Lion as published), `"smooth"` (`tanh(smooth_beta * x)`) or
            `"refined"` (`x` where `|x| < 1`, its sign elsewhere); see `scale_by_lion`. optax
            has these on `scale_by_lion` only.
        smooth_beta: the slope of the `"smooth"` mode.

    State:
        `mu/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.lion(1e-4, weight_decay=0.1, mask="**/w")
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2), "b": jnp.zeros(2)})))
        ['mu/b', 'mu/w']

    References:
        Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023.
    """
    return descent(
        "lion",
        learning_rate,
        scale_by_lion(b1, b2, mu_dtype, mode=mode, smooth_beta=smooth_beta),
        add_decayed_weights(weight_decay, mask),
    )
