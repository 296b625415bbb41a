"""The optimizers of Adam's relatives: AdaMax, AMSGrad, AdaBelief, RAdam, Yogi and Adan."""

from __future__ import annotations

from typing import Any

from gradtx._combinators.chain import Chain
from gradtx._optimizers.descent import descent
from gradtx._transforms.adam_variants import (
    scale_by_adamax,
    scale_by_adan,
    scale_by_amsgrad,
    scale_by_belief,
    scale_by_radam,
    scale_by_yogi,
)
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.shared_args import with_shared_args
from gradtx._transforms.weight_decay import add_decayed_weights, decay_unless_zero


@with_shared_args
def adamax(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> Chain:
    """AdaMax: `chain(scale_by_adamax(...), scale_by_learning_rate(learning_rate))`.

    Args:
        b2: decay of the exponentially weighted infinity norm.
        eps: added to $|g|$ so the denominator is never zero.
        nu_dtype: dtype of the infinity norm (default: the parameter's dtype).

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.adamax(0.1)
        >>> u, _ = tx.update({"w": jnp.array([3.0])}, tx.init({"w": jnp.zeros(1)}))
        >>> u["w"]
        Array([-0.1], dtype=float32)

    References:
        Kingma & Ba, "Adam: A Method for Stochastic Optimization", 2015 (section 7.1).
    """
    return descent(
        "adamax", learning_rate, scale_by_adamax(b1, b2, eps, mu_dtype=mu_dtype, nu_dtype=nu_dtype)
    )


@with_shared_args
def adamaxw(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-4,
    *,
    mask: Any = None,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> Chain:
    """AdaMax with decoupled weight decay.

    `chain(scale_by_adamax(...), add_decayed_weights(weight_decay, mask),
    scale_by_learning_rate(learning_rate))`.

    Args:
        b2: decay of the exponentially weighted infinity norm.
        eps: added to $|g|$ so the denominator is never zero.
        nu_dtype: dtype of the infinity norm (default: the parameter's dtype).

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.adamaxw(0.1, weight_decay=0.5)
        >>> params = {"w": jnp.ones(1)}
        >>> u, _ = tx.update({"w": jnp.zeros(1)}, tx.init(params), params)
        >>> u["w"]
        Array([-0.05], dtype=float32)

    References:
        Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019.
    """
    return descent(
        "adamaxw",
        learning_rate,
        scale_by_adamax(b1, b2, eps, mu_dtype=mu_dtype, nu_dtype=nu_dtype),
        add_decayed_weights(weight_decay, mask),
    )


@with_shared_args
def amsgrad(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    bias_correction_mu: bool = True,
    bias_correction_nu: bool = True,
) -> Chain:
    """AMSGrad: `chain(scale_by_amsgrad(...), scale_by_learning_rate(learning_rate))`.

    Args:
        nu_dtype: dtype of `nu` and `nu_max` (default: the parameter's dtype).
        bias_correction_mu: bias-correct the first moment (`False` as in the paper).
        bias_correction_nu: bias-correct the second moment (`False` as in the paper).

    State:
        `mu/<path>`, `nu/<path>`, `nu_max/<path>`, `count/<path>`; `schedule_count/<path>`
        with a schedule.

    Examples:
        >>> tx = gradtx.amsgrad(1e-3)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'mu/w', 'nu/w', 'nu_max/w']

    References:
        Reddi, Kale & Kumar, "On the Convergence of Adam and Beyond", 2018.
    """
    return descent(
        "amsgrad",
        learning_rate,
        scale_by_amsgrad(
            b1,
            b2,
            eps,
            eps_root,
            mu_dtype=mu_dtype,
            nu_dtype=nu_dtype,
            bias_correction_mu=bias_correction_mu,
            bias_correction_nu=bias_correction_nu,
        ),
    )


@with_shared_args
def adabelief(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-16,
    eps_root: float = 1e-16,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    nesterov: bool = False,
) -> Chain:
    """AdaBelief: `chain(scale_by_belief(...), scale_by_learning_rate(learning_rate))`.

    The epsilons default to optax's `1e-16`; the paper uses `eps=1e-8, eps_root=0`.

    Args:
        b2: decay of the second moment of the prediction error.
        eps_root: added to the second moment at every step.

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.adabelief(1e-3)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'mu/w', 'nu/w']

    References:
        Zhuang et al., "AdaBelief Optimizer: Adapting Stepsizes by the Belief in Observed
        Gradients", 2020.
    """
    return descent(
        "adabelief",
        learning_rate,
        scale_by_belief(
            b1, b2, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype, nesterov=nesterov
        ),
    )


@with_shared_args
def radam(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    threshold: float = 5.0,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    nesterov: bool = False,
) -> Chain:
    """Rectified Adam: `chain(scale_by_radam(...), scale_by_learning_rate(learning_rate))`.

    Args:
        threshold: the smallest length of the approximated moving average at which the
            adaptive step is used (see `scale_by_radam`).

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.radam(0.1)
        >>> u, _ = tx.update({"w": jnp.array([2.0])}, tx.init({"w": jnp.zeros(1)}))
        >>> u["w"]  # the first steps are momentum SGD
        Array([-0.2], dtype=float32)

    References:
        Liu et al., "On the Variance of the Adaptive Learning Rate and Beyond", 2020.
    """
    return descent(
        "radam",
        learning_rate,
        scale_by_radam(
            b1,
            b2,
            eps,
            eps_root,
            threshold,
            mu_dtype=mu_dtype,
            nu_dtype=nu_dtype,
            nesterov=nesterov,
        ),
    )


@with_shared_args
def yogi(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-3,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> Chain:
    """Yogi: `chain(scale_by_yogi(b1, b2, eps), scale_by_learning_rate(learning_rate))`.

    Args:
        b2: the rate of the second moment's additive update.

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.yogi(1e-2)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'mu/w', 'nu/w']

    References:
        Zaheer et al., "Adaptive Methods for Nonconvex Optimization", NeurIPS 2018.
    """
    return descent(
        "yogi", learning_rate, scale_by_yogi(b1, b2, eps, mu_dtype=mu_dtype, nu_dtype=nu_dtype)
    )


@with_shared_args
def adan(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.98,
    b2: float = 0.92,
    b3: float = 0.99,
    eps: float = 1e-8,
    eps_root: float = 1e-8,
    weight_decay: float = 0.0,
    *,
    mask: Any = None,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> Chain:
    """Adan, with optional decoupled weight decay.

    `chain(scale_by_adan(...), add_decayed_weights(weight_decay, mask),
    scale_by_learning_rate(learning_rate))`. With a literal `weight_decay=0` (the default)
    and no mask the decay step is left out, so `update` does not need the params. As in
    optax, `eps_root` defaults to `1e-8` here and to `0` in `scale_by_adan`.

    Args:
        b2: decay of the moving average of gradient differences.
        b3: decay of the second moment.
        mu_dtype: dtype of `mu`, `delta` and `prev_grad` (default: the parameter's dtype).

    State:
        `mu/<path>`, `delta/<path>`, `nu/<path>`, `prev_grad/<path>`, `count/<path>`;
        `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.adan(1e-3, weight_decay=0.02, mask="!**/bias")
        >>> sorted(tx.init({"w": jnp.zeros(2), "bias": jnp.zeros(2)}))
        ['count', 'delta', 'mu', 'nu', 'prev_grad']

    References:
        Xie et al., "Adan: Adaptive Nesterov Momentum Algorithm for Faster Optimizing Deep
        Models", 2022.
    """
    return descent(
        "adan",
        learning_rate,
        scale_by_adan(b1, b2, b3, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype),
        *decay_unless_zero(weight_decay, mask),
    )
