"""SGD with the Polyak step size, on `scale_by_polyak`."""

from __future__ import annotations

from typing import Any

from gradtx._optimizers.descent import descent
from gradtx._transforms.polyak import scale_by_polyak
from gradtx._transforms.scale import ScalarOrSchedule


def polyak_sgd(
    max_learning_rate: float = 1.0,
    scaling: ScalarOrSchedule = 1.0,
    f_min: float = 0.0,
    eps: float = 0.0,
    variant: str = "sps",
) -> Any:
    r"""SGD with the Polyak step size; call `update(grads, state, params, value=loss)`.

    `chain(scale_by_polyak(f_min, max_learning_rate, eps, variant),
    scale_by_learning_rate(scaling))`:

    $$\theta_t = \theta_{t-1} - s\,\min\left(\frac{f(\theta_{t-1}) - f^\star}
      {\lVert g_t\rVert^2 + \epsilon},\ \gamma_{max}\right) g_t$$

    Divergence from optax: optax applies `scaling` before the Polyak step, so its norm is that
    of the scaled gradient; here `scaling` multiplies the Polyak step. The two agree for the
    default `scaling=1`.

    Args:
        max_learning_rate: the largest Polyak step $\gamma_{max}$.
        scaling: a number or a schedule $s$ multiplying the step.
        f_min: a lower bound $f^\star$ on the loss.
        eps: added to the squared gradient norm.
        variant: `"sps"` or `"sps+"` (the gap clipped at zero).

    Examples:
        >>> tx = gradtx.polyak_sgd()
        >>> params = {"w": jnp.array([1.0, 2.0])}
        >>> loss, grads = jax.value_and_grad(lambda p: jnp.sum(p["w"] ** 2))(params)
        >>> u, _ = tx.update(grads, tx.init(params), params, value=loss)
        >>> u["w"]
        Array([-0.5, -1. ], dtype=float32)

    References:
        Loizou et al., "Stochastic Polyak Step-size for SGD: An Adaptive Learning Rate for Fast
        Convergence", 2021.
    """
    return descent("polyak_sgd", scaling, scale_by_polyak(f_min, max_learning_rate, eps, variant))
