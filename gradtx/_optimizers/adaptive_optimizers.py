"""The adaptive-moment optimizers: Adam's relatives, Adagrad, Adadelta and RMSProp."""

from __future__ import annotations

from typing import Any

from gradtx._combinators.chain import Chain
from gradtx._core.protocol import Transformation
from gradtx._optimizers.optimizers import optimizer
from gradtx._transforms.adagrad import scale_by_adadelta, scale_by_rss
from gradtx._transforms.adam import scale_by_adam
from gradtx._transforms.adam_variants import (
    scale_by_adamax,
    scale_by_adan,
    scale_by_amsgrad,
    scale_by_belief,
    scale_by_radam,
    scale_by_yogi,
)
from gradtx._transforms.rms import scale_by_rms, scale_by_stddev
from gradtx._transforms.scale import ScalarOrSchedule, scale_by_learning_rate
from gradtx._transforms.trace import trace
from gradtx._transforms.weight_decay import add_decayed_weights

__all__ = [
    "adabelief",
    "adadelta",
    "adagrad",
    "adamax",
    "adamaxw",
    "adan",
    "amsgrad",
    "nadam",
    "nadamw",
    "radam",
    "rmsprop",
    "yogi",
]


def _is_literal_zero(value: Any) -> bool:
    """A plain Python zero (not an array, which may be traced or swept)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _decay_unless_zero(weight_decay: Any, mask: Any) -> list[Transformation]:
    """`[add_decayed_weights(...)]`, or nothing for a literal zero decay without a mask."""
    if _is_literal_zero(weight_decay) and mask is None:
        return []
    return [add_decayed_weights(weight_decay, mask)]


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

    Args:
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the second moment.
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.
        mu_dtype: dtype of the first moment (default: the parameter's dtype).
        nu_dtype: dtype of the second moment (default: the parameter's dtype).

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.nadam(1e-3)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'mu/w', 'nu/w']

    References:
        Dozat, "Incorporating Nesterov Momentum into Adam", ICLR workshop 2016.
    """
    return optimizer(
        "nadam",
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype, nesterov=True),
        scale_by_learning_rate(learning_rate),
    )


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

    Args:
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the second moment.
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.
        weight_decay: the decoupled decay rate (multiplied by the learning rate).
        mask: selector of the paths to decay (for example `"!**/bias"`); default: all.
        mu_dtype: dtype of the first moment (default: the parameter's dtype).
        nu_dtype: dtype of the second moment (default: the parameter's dtype).

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
    return optimizer(
        "nadamw",
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype, nesterov=True),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


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
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the exponentially weighted infinity norm.
        eps: added to $|g|$ so the denominator is never zero.
        mu_dtype: dtype of the first moment (default: the parameter's dtype).
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
    return optimizer(
        "adamax",
        scale_by_adamax(b1, b2, eps, mu_dtype=mu_dtype, nu_dtype=nu_dtype),
        scale_by_learning_rate(learning_rate),
    )


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
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the exponentially weighted infinity norm.
        eps: added to $|g|$ so the denominator is never zero.
        weight_decay: the decoupled decay rate (multiplied by the learning rate).
        mask: selector of the paths to decay (for example `"!**/bias"`); default: all.
        mu_dtype: dtype of the first moment (default: the parameter's dtype).
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
    return optimizer(
        "adamaxw",
        scale_by_adamax(b1, b2, eps, mu_dtype=mu_dtype, nu_dtype=nu_dtype),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


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
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the second moment.
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.
        mu_dtype: dtype of the first moment (default: the parameter's dtype).
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
    return optimizer(
        "amsgrad",
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
        scale_by_learning_rate(learning_rate),
    )


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
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the second moment of the prediction error.
        eps: added to the denominator outside the square root.
        eps_root: added to the second moment at every step.
        mu_dtype: dtype of the first moment (default: the parameter's dtype).
        nu_dtype: dtype of the second moment (default: the parameter's dtype).
        nesterov: use Nesterov momentum.

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
    return optimizer(
        "adabelief",
        scale_by_belief(
            b1, b2, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype, nesterov=nesterov
        ),
        scale_by_learning_rate(learning_rate),
    )


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
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the second moment.
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.
        threshold: the smallest length of the approximated moving average at which the
            adaptive step is used (see `scale_by_radam`).
        mu_dtype: dtype of the first moment (default: the parameter's dtype).
        nu_dtype: dtype of the second moment (default: the parameter's dtype).
        nesterov: use Nesterov momentum.

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
    return optimizer(
        "radam",
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
        scale_by_learning_rate(learning_rate),
    )


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
    return optimizer(
        "adagrad",
        scale_by_rss(initial_accumulator_value, eps, accumulator_dtype=accumulator_dtype),
        scale_by_learning_rate(learning_rate),
    )


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
        learning_rate: a number or a schedule.
        rho: decay of both moving averages.
        eps: added inside both square roots.
        weight_decay: the L2 decay rate added to the gradient.
        mask: selector of the paths to decay (for example `"!**/bias"`); default: all.
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
    return optimizer(
        "adadelta",
        *_decay_unless_zero(weight_decay, mask),
        scale_by_adadelta(rho, eps, accumulator_dtype=accumulator_dtype),
        scale_by_learning_rate(learning_rate),
    )


def rmsprop(
    learning_rate: ScalarOrSchedule,
    decay: float = 0.9,
    eps: float = 1e-8,
    initial_scale: float = 0.0,
    eps_in_sqrt: bool = True,
    centered: bool = False,
    momentum: float | None = None,
    nesterov: bool = False,
    bias_correction: bool = False,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    accumulator_dtype: Any = None,
) -> Chain:
    """RMSProp, plain or centered, with optional (Nesterov) momentum.

    `chain(scale_by_rms(...) or scale_by_stddev(...), scale_by_learning_rate(learning_rate),
    trace(momentum, nesterov))`: as in optax, the momentum accumulates the already scaled
    steps (the trace is left out without `momentum`).

    Args:
        learning_rate: a number or a schedule.
        decay: decay of the moving average(s) of the gradients.
        eps: the stabilising constant.
        initial_scale: the initial value of the second moment (PyTorch 0, TensorFlow 1 1).
        eps_in_sqrt: add `eps` inside the square root (optax) or outside (PyTorch).
        centered: divide by the estimated standard deviation rather than the RMS.
        momentum: the momentum coefficient, or `None` for none.
        nesterov: use Nesterov momentum.
        bias_correction: bias-correct the moving average(s).
        mu_dtype: dtype of the first moment when `centered` (default: the parameter's dtype).
        nu_dtype: dtype of the second moment (default: the parameter's dtype).
        accumulator_dtype: dtype of the momentum buffer (default: the parameter's dtype).

    State:
        `nu/<path>`; `mu/<path>` when centered; `count/<path>` with bias correction;
        `schedule_count/<path>` with a schedule; `trace/<path>` with momentum.

    Examples:
        >>> tx = gradtx.rmsprop(1e-3, centered=True, momentum=0.9)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['mu/w', 'nu/w', 'trace/w']

    References:
        Hinton, "Neural Networks for Machine Learning", lecture 6e, 2012;
        Graves, "Generating Sequences With Recurrent Neural Networks", 2013.
    """
    if nesterov and momentum is None:
        raise ValueError("rmsprop: nesterov=True needs a `momentum` value.")
    if centered:
        rescale: Transformation = scale_by_stddev(
            decay,
            eps,
            initial_scale,
            eps_in_sqrt,
            bias_correction,
            mu_dtype=mu_dtype,
            nu_dtype=nu_dtype,
        )
    else:
        if mu_dtype is not None:
            raise ValueError("rmsprop: `mu_dtype` applies only with centered=True.")
        rescale = scale_by_rms(
            decay, eps, initial_scale, eps_in_sqrt, bias_correction, nu_dtype=nu_dtype
        )
    parts = [rescale, scale_by_learning_rate(learning_rate)]
    if momentum is not None:
        parts.append(trace(momentum, nesterov, accumulator_dtype=accumulator_dtype))
    return optimizer("rmsprop", *parts)


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
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: the rate of the second moment's additive update.
        eps: added to the denominator outside the square root.
        mu_dtype: dtype of the first moment (default: the parameter's dtype).
        nu_dtype: dtype of the second moment (default: the parameter's dtype).

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.yogi(1e-2)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'mu/w', 'nu/w']

    References:
        Zaheer et al., "Adaptive Methods for Nonconvex Optimization", NeurIPS 2018.
    """
    return optimizer(
        "yogi",
        scale_by_yogi(b1, b2, eps, mu_dtype=mu_dtype, nu_dtype=nu_dtype),
        scale_by_learning_rate(learning_rate),
    )


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
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the moving average of gradient differences.
        b3: decay of the second moment.
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.
        weight_decay: the decoupled decay rate (multiplied by the learning rate).
        mask: selector of the paths to decay (for example `"!**/bias"`); default: all.
        mu_dtype: dtype of `mu`, `delta` and `prev_grad` (default: the parameter's dtype).
        nu_dtype: dtype of `nu` (default: the parameter's dtype).

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
    return optimizer(
        "adan",
        scale_by_adan(b1, b2, b3, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype),
        *_decay_unless_zero(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )
