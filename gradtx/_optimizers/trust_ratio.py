"""Layer-wise trust-ratio optimizers: LARS, LAMB and Fromage, on `scale_by_trust_ratio`."""

from __future__ import annotations

from typing import Any

from gradtx._combinators.chain import Chain, optimizer
from gradtx._optimizers.descent import descent
from gradtx._transforms.adam import scale_by_adam
from gradtx._transforms.momentum import trace
from gradtx._transforms.scale import ScalarOrSchedule, scale_by_learning_rate
from gradtx._transforms.shared_args import with_shared_args
from gradtx._transforms.trust_ratio import FromageStep, scale_by_trust_ratio
from gradtx._transforms.weight_decay import add_decayed_weights


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
    return optimizer("fromage", scale_by_trust_ratio(min_norm=min_norm), FromageStep(learning_rate))


@with_shared_args
def lamb(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    eps_root: float = 0.0,
    weight_decay: float = 0.0,
    *,
    mask: Any = None,
    stacked: Any = None,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> Chain:
    r"""LAMB: Adam's direction with decoupled weight decay, scaled per layer by a trust ratio.

    `chain(scale_by_adam(b1, b2, eps, eps_root), add_decayed_weights(weight_decay, mask),
    scale_by_trust_ratio(), scale_by_learning_rate(learning_rate))`. Per leaf, with
    $r = \hat m_t / (\sqrt{\hat v_t + \epsilon_{root}} + \epsilon) + \lambda\theta$:

    $$\theta_{t} = \theta_{t-1} - \eta\, \frac{\lVert\theta_{t-1}\rVert}{\lVert r\rVert}\, r$$

    Args:
        weight_decay: the decoupled decay rate $\lambda$.
        stacked: `{selector: n}` for stacked layers: the trust ratio is taken per slice of the
            first `n` axes.

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.lamb(1e-3, weight_decay=0.01, mask="!**/bias")
        >>> params = {"w": jnp.array([3.0, 4.0]), "bias": jnp.zeros(2)}
        >>> u, _ = tx.update({"w": jnp.ones(2), "bias": jnp.ones(2)}, tx.init(params), params)
        >>> round(float(jnp.linalg.norm(u["w"])), 6)  # lr * ||w||
        0.005
        >>> u["bias"]  # a zero parameter: trust ratio 1, so u = -lr * adam direction
        Array([-0.001, -0.001], dtype=float32)

    References:
        You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes",
        2020.
    """
    return descent(
        "lamb",
        learning_rate,
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype),
        add_decayed_weights(weight_decay, mask),
        scale_by_trust_ratio(stacked=stacked),
    )


@with_shared_args
def lars(
    learning_rate: ScalarOrSchedule,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    trust_coefficient: float = 0.001,
    eps: float = 0.0,
    trust_ratio_mask: Any = None,
    momentum: float = 0.9,
    nesterov: bool = False,
    *,
    stacked: Any = None,
    accumulator_dtype: Any = None,
) -> Chain:
    r"""LARS: SGD with momentum whose step is scaled per layer by a trust ratio.

    `chain(add_decayed_weights(weight_decay, weight_decay_mask),
    scale_by_trust_ratio(trust_coefficient=..., eps=..., mask=trust_ratio_mask),
    scale_by_learning_rate(learning_rate), trace(momentum, nesterov))`, as in optax. Per leaf,
    with $r = g + \lambda\theta$ and $c$ the trust coefficient:

    $$s_t = -\eta\, \frac{c\,\lVert\theta\rVert}{\lVert r\rVert + \epsilon}\, r,\qquad
      t_k = s_k + \mu\, t_{k-1},\qquad u_k = t_k\ \ (\text{Nesterov: } s_k + \mu\, t_k)$$

    Args:
        weight_decay: the decay rate $\lambda$.
        weight_decay_mask: a selector of the paths to decay (default: all).
        trust_coefficient: the multiplier $c$ of the trust ratio.
        eps: added to the update norm in the trust ratio's denominator.
        trust_ratio_mask: a selector of the paths whose step is scaled by the trust ratio
            (default: all); a common choice leaves out biases and norms (`"!**/bias"`).
        momentum: the momentum coefficient $\mu$.
        stacked: `{selector: n}` for stacked layers: the trust ratio is taken per slice of the
            first `n` axes.

    State:
        `trace/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.lars(0.1, trust_coefficient=1.0, momentum=0.0)
        >>> params = {"w": jnp.array([3.0, 4.0])}
        >>> u, _ = tx.update({"w": jnp.array([1.0, 1.0])}, tx.init(params), params)
        >>> u["w"].round(4)  # -lr * (||w|| / ||g||) * g
        Array([-0.3536, -0.3536], dtype=float32)

    References:
        You et al., "Large Batch Training of Convolutional Networks", 2017.
    """
    return optimizer(
        "lars",
        add_decayed_weights(weight_decay, weight_decay_mask),
        scale_by_trust_ratio(
            trust_coefficient=trust_coefficient, eps=eps, mask=trust_ratio_mask, stacked=stacked
        ),
        scale_by_learning_rate(learning_rate),
        trace(momentum, nesterov, accumulator_dtype=accumulator_dtype),
    )
