"""The NovoGrad optimizer, on `scale_by_novograd`."""

from __future__ import annotations

from typing import Any

from gradtx._optimizers.descent import descent
from gradtx._transforms.novograd import scale_by_novograd
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.shared_args import with_shared_args


@with_shared_args
def novograd(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.25,
    eps: float = 1e-6,
    eps_root: float = 0.0,
    weight_decay: float = 0.0,
    *,
    mu_dtype: Any = None,
) -> Any:
    r"""NovoGrad: momentum of gradients normalised per array by a scalar second moment.

    `chain(scale_by_novograd(b1, b2, eps, eps_root, weight_decay),
    scale_by_learning_rate(learning_rate))`; see `scale_by_novograd` for the formula. The
    weight decay is a number (optax also takes a schedule); a literal `0` needs no params.

    Args:
        b1: decay of the momentum.
        weight_decay: the decay added inside the momentum.
        mu_dtype: dtype of the momentum (default: the parameter's dtype).

    State:
        `mu/<path>`, `nu/<path>` (a scalar), `count/<path>`; `schedule_count/<path>` with a
        schedule.

    Examples:
        >>> tx = gradtx.novograd(0.1)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'mu/w', 'nu/w']

    References:
        Ginsburg et al., "Stochastic Gradient Methods with Layer-wise Adaptive Moments for
        Training of Deep Networks", 2019.
    """
    return descent(
        "novograd", learning_rate, scale_by_novograd(b1, b2, eps, eps_root, weight_decay, mu_dtype)
    )
