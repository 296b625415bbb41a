"""More optimizers, each a short flat chain: Lion, sign methods, Rprop, noise, Polyak, ..."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.elementwise import ElementwiseTransform, hyperparam_at
from gradtx._core.lift import compute_dtype
from gradtx._core.module import hyperparam
from gradtx._optimizers.optimizers import optimizer
from gradtx._transforms.averaging import ema
from gradtx._transforms.lion import scale_by_lion
from gradtx._transforms.noise import add_noise
from gradtx._transforms.novograd import scale_by_novograd
from gradtx._transforms.optimistic import scale_by_optimistic_gradient
from gradtx._transforms.polyak import scale_by_polyak
from gradtx._transforms.scale import ScalarOrSchedule, _is_schedule, scale, scale_by_learning_rate
from gradtx._transforms.sign import scale_by_rprop, scale_by_sign
from gradtx._transforms.trace import trace
from gradtx._transforms.trust_ratio import scale_by_trust_ratio
from gradtx._transforms.weight_decay import add_decayed_weights

__all__ = [
    "fromage",
    "lion",
    "nesterov",
    "noisy_sgd",
    "novograd",
    "optimistic_gradient_descent",
    "polyak_sgd",
    "rprop",
    "sign_sgd",
    "signum",
]


def lion(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.99,
    mu_dtype: Any = None,
    weight_decay: float = 1e-3,
    mask: Any = None,
) -> Any:
    r"""Lion: the sign of an interpolated momentum, with decoupled weight decay.

    `chain(scale_by_lion(b1, b2), add_decayed_weights(weight_decay, mask),
    scale_by_learning_rate(learning_rate))`:

    $$\theta_t = \theta_{t-1} - \eta\big(\operatorname{sign}(\beta_1 m_{t-1} + (1-\beta_1) g_t)
      + \lambda\,\theta_{t-1}\big),\qquad m_t = \beta_2 m_{t-1} + (1-\beta_2) g_t$$

    Args:
        learning_rate: a number or a schedule (typically 3-10x smaller than Adam's).
        b1: interpolation between momentum and gradient for the update.
        b2: decay of the momentum.
        mu_dtype: dtype of the momentum (default: the parameter's dtype).
        weight_decay: the decoupled decay rate $\lambda$ (typically 3-10x larger than AdamW's).
        mask: selector of the paths to decay (for example `"!**/bias"`); default: all.

    State:
        `mu/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.lion(1e-4, weight_decay=0.1, mask="**/w")
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2), "b": jnp.zeros(2)})))
        ['mu/b', 'mu/w']

    References:
        Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023.
    """
    return optimizer(
        "lion",
        scale_by_lion(b1, b2, mu_dtype),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


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
    return optimizer("sign_sgd", scale_by_sign(), scale_by_learning_rate(learning_rate))


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
    return optimizer(
        "signum",
        ema(beta, debias=False, accumulator_dtype=accumulator_dtype),
        scale_by_sign(),
        scale_by_learning_rate(learning_rate),
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
    return optimizer(
        "noisy_sgd", add_noise(eta, gamma, seed), scale_by_learning_rate(learning_rate)
    )


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
    return optimizer(
        "polyak_sgd",
        scale_by_polyak(f_min, max_learning_rate, eps, variant),
        scale_by_learning_rate(scaling),
    )


def optimistic_gradient_descent(
    learning_rate: ScalarOrSchedule, alpha: float = 1.0, beta: float = 1.0
) -> Any:
    r"""Optimistic gradient descent, for min-max games.

    `chain(scale_by_optimistic_gradient(alpha, beta), scale_by_learning_rate(learning_rate))`:

    $$\theta_t = \theta_{t-1} - \eta\big((\alpha + \beta) g_t - \beta g_{t-1}\big)$$

    with $g_0 = g_1$. `alpha` and `beta` are numbers (optax also takes schedules for them).

    Args:
        learning_rate: a number or a schedule.
        alpha: the weight of the current gradient.
        beta: the weight of the gradient's change.

    State:
        `previous_gradient/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.optimistic_gradient_descent(0.1)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))
        ['count/w', 'previous_gradient/w']

    References:
        Mokhtari et al., "A Unified Analysis of Extra-gradient and Optimistic Gradient Methods
        for Saddle Point Problems: Proximal Point Approach", 2019.
    """
    return optimizer(
        "optimistic_gradient_descent",
        scale_by_optimistic_gradient(alpha, beta),
        scale_by_learning_rate(learning_rate),
    )


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
        learning_rate: a number or a schedule.
        b1: decay of the momentum.
        b2: decay of the second moment.
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.
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
    return optimizer(
        "novograd",
        scale_by_novograd(b1, b2, eps, eps_root, weight_decay, mu_dtype),
        scale_by_learning_rate(learning_rate),
    )


class _FromageStep(ElementwiseTransform):
    """`u = -(lr g + (1 - sqrt(1 + lr^2)) param) / sqrt(1 + lr^2)`, lr a number or schedule."""

    name: ClassVar[str] = "fromage_step"
    needs_params: ClassVar[bool] = True
    learning_rate: Any = hyperparam()

    def state_keys(self) -> tuple[str, ...]:
        """`schedule_count` when the learning rate is a schedule, else nothing."""
        return ("schedule_count",) if _is_schedule(self.learning_rate) else ()

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A zero step count when the learning rate is a schedule."""
        return {"schedule_count": jnp.zeros((), jnp.int32)} if self.state_keys() else {}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """The Fromage step relative to the parameter, shrunk by `1 / sqrt(1 + lr^2)`."""
        dtype = compute_dtype(g, param)
        changed = {}
        if self.state_keys():
            count = slots["schedule_count"]
            lr = hyperparam_at(self.learning_rate, count)
            changed = {"schedule_count": count + 1}
        else:
            lr = self.learning_rate
        lr = lr.astype(dtype)
        root = jnp.sqrt(1 + lr * lr)
        # 1 / root - 1 without cancellation (it is about -lr^2 / 2 for small lr)
        shrink = -(lr * lr) / (root * (1 + root))
        u = -(lr / root) * g.astype(dtype) + shrink * param.astype(dtype)
        return u.astype(g.dtype), changed


def fromage(learning_rate: ScalarOrSchedule, min_norm: float = 1e-6) -> Any:
    r"""Fromage: steps relative to each array's norm, for compositional (deep) functions.

    Per array (path), with $\eta$ the learning rate:

    $$\theta_t = \frac{1}{\sqrt{1+\eta^2}}\left(\theta_{t-1} - \eta\,
      \frac{\max(\lVert\theta_{t-1}\rVert, n)}{\max(\lVert g_t\rVert, n)}\, g_t\right)$$

    with $n$ = `min_norm`. Built as a chain of `scale_by_trust_ratio(min_norm)` and the Fromage step
    (which needs the params); optax's chain of `scale_by_trust_ratio`,
    `scale_by_learning_rate` and `add_decayed_weights` gives the same updates.

    Args:
        learning_rate: a number or a schedule.
        min_norm: the smallest norm used for a parameter or gradient array.

    State:
        None with a constant learning rate; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.fromage(0.01)
        >>> params = {"w": jnp.array([3.0, 4.0])}
        >>> u, _ = tx.update({"w": jnp.array([1.0, 0.0])}, tx.init(params), params)
        >>> u["w"].round(4)
        Array([-0.0501, -0.0002], dtype=float32)

    References:
        Bernstein et al., "On the distance between two neural networks and the stability of
        learning", 2020.
    """
    # The trust ratio with coefficient 1 and eps 0: max(||param||, n) / max(||g||, n).
    return optimizer(
        "fromage", scale_by_trust_ratio(min_norm=min_norm), _FromageStep(learning_rate)
    )


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
    return optimizer(
        "nesterov",
        trace(momentum, nesterov=True, accumulator_dtype=accumulator_dtype),
        scale_by_learning_rate(learning_rate),
    )
