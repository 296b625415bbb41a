"""Adam and its decoupled-weight-decay and Nesterov forms, on `scale_by_adam`."""

from __future__ import annotations

from typing import Any

from gradtx._combinators.chain import Chain
from gradtx._optimizers.descent import descent
from gradtx._transforms.adam import scale_by_adam
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.shared_args import with_shared_args
from gradtx._transforms.weight_decay import add_decayed_weights


@with_shared_args
def adam(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    nesterov: bool = False,
) -> Chain:
    """Adam: `chain(scale_by_adam(...), scale_by_learning_rate(learning_rate))`.

    Args:
        nesterov: use Nesterov momentum (NAdam).

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.adam(1e-3)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'mu/w', 'nu/w']

    References:
        Kingma & Ba, "Adam: A Method for Stochastic Optimization", 2015.
    """
    moments = scale_by_adam(
        b1, b2, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype, nesterov=nesterov
    )
    return descent("adam", learning_rate, moments)


@with_shared_args
def adamw(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    weight_decay: float = 1e-4,
    *,
    mask: Any = None,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    nesterov: bool = False,
) -> Chain:
    """Adam with decoupled weight decay (AdamW).

    `chain(scale_by_adam(...), add_decayed_weights(weight_decay, mask), scale_by_learning_rate)`:
    the decay is added after the moment rescaling, then scaled by the learning rate.

    Examples:
        >>> tx = gradtx.adamw(1e-3, weight_decay=0.01, mask="**/kernel")

    References:
        Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019.
    """
    moments = scale_by_adam(
        b1, b2, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype, nesterov=nesterov
    )
    return descent("adamw", learning_rate, moments, add_decayed_weights(weight_decay, mask))


@with_shared_args
def nadam(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> Chain:
    r"""NAdam: Adam with Nesterov momentum.

    `chain(scale_by_adam(..., nesterov=True), scale_by_learning_rate(learning_rate))`, so the
    first moment used at step $t$ is
    $\beta_1 m_t/(1-\beta_1^{t+1}) + (1-\beta_1) g_t/(1-\beta_1^t)$ (see `scale_by_adam`).

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.nadam(1e-3)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'mu/w', 'nu/w']

    References:
        Dozat, "Incorporating Nesterov Momentum into Adam", ICLR workshop 2016.
    """
    moments = scale_by_adam(
        b1, b2, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype, nesterov=True
    )
    return descent("nadam", learning_rate, moments)


@with_shared_args
def nadamw(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    weight_decay: float = 1e-4,
    *,
    mask: Any = None,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> Chain:
    """NAdam with decoupled weight decay: `adamw(..., nesterov=True)`.

    `chain(scale_by_adam(..., nesterov=True), add_decayed_weights(weight_decay, mask),
    scale_by_learning_rate(learning_rate))`.

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.nadamw(0.5, weight_decay=0.5, mask="**/kernel")
        >>> params = {"kernel": jnp.ones(2), "bias": jnp.ones(2)}
        >>> zeros = {"kernel": jnp.zeros(2), "bias": jnp.zeros(2)}
        >>> u, _ = tx.update(zeros, tx.init(params), params)
        >>> u["kernel"]  # the decay only: -0.5 * 0.5 * 1
        Array([-0.25, -0.25], dtype=float32)

    References:
        Dozat, "Incorporating Nesterov Momentum into Adam", ICLR workshop 2016;
        Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019.
    """
    moments = scale_by_adam(
        b1, b2, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype, nesterov=True
    )
    return descent("nadamw", learning_rate, moments, add_decayed_weights(weight_decay, mask))
