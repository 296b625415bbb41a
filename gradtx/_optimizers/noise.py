"""SGD with annealed gradient noise, on `add_noise`."""

from __future__ import annotations

from typing import Any

from gradtx._optimizers.descent import descent
from gradtx._transforms.noise import add_noise
from gradtx._transforms.scale import ScalarOrSchedule


def noisy_sgd(
    learning_rate: ScalarOrSchedule,
    eta: float = 0.01,
    gamma: float = 0.55,
    seed: Any = 0,
) -> Any:
    r"""SGD with annealed Gaussian gradient noise.

    `chain(add_noise(eta, gamma, seed), scale_by_learning_rate(learning_rate))`:

    $$\theta_t = \theta_{t-1} - \eta_{lr}\Big(g_t + \sqrt{\eta/t^{\gamma}}\ \xi_t\Big),\qquad
      \xi_t \sim \mathcal N(0, I)$$

    Args:
        learning_rate: a number or a schedule.
        eta: the initial noise variance.
        gamma: the decay exponent of the variance.
        seed: an int seed or a `jax.random` key (optax calls it `key`).

    State:
        `count/<path>`, `rng_key/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.noisy_sgd(0.1, seed=42)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'rng_key/w']

    References:
        Neelakantan et al., "Adding Gradient Noise Improves Learning for Very Deep Networks",
        2015.
    """
    return descent("noisy_sgd", learning_rate, add_noise(eta, gamma, seed))
