"""The familiar optimizers, each a short flat chain of transformations."""

from __future__ import annotations

from typing import Any

from gradtx._combinators.chain import Chain
from gradtx._core.protocol import Transformation
from gradtx._transforms.adam import scale_by_adam
from gradtx._transforms.scale import ScalarOrSchedule, scale_by_learning_rate
from gradtx._transforms.trace import trace
from gradtx._transforms.weight_decay import add_decayed_weights

__all__ = ["adam", "adamw", "sgd"]


def optimizer(label: str, *transforms: Transformation) -> Chain:
    """A named optimizer: a chain whose children's states share one namespace."""
    return Chain(tuple(transforms), tuple(t.name for t in transforms), label, flat=True)


def sgd(
    learning_rate: ScalarOrSchedule,
    momentum: float | None = None,
    nesterov: bool = False,
    *,
    accumulator_dtype: Any = None,
) -> Chain:
    """Stochastic gradient descent, optionally with (Nesterov) momentum.

    `chain(trace(momentum, nesterov), scale_by_learning_rate(learning_rate))`; without
    momentum, just the learning-rate step.

    Args:
        learning_rate: a number or a schedule.
        momentum: the momentum coefficient, or `None` for plain SGD.
        nesterov: use Nesterov momentum.
        accumulator_dtype: dtype of the momentum buffer (default: the parameter's dtype).

    State:
        `trace/<path>` with momentum; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.sgd(0.1, momentum=0.9)
        >>> params = {"w": jnp.ones(2)}
        >>> u, state = tx.update({"w": jnp.ones(2)}, tx.init(params))
        >>> u["w"]
        Array([-0.1, -0.1], dtype=float32)
    """
    parts: list[Transformation] = []
    if momentum is not None:
        parts.append(trace(momentum, nesterov, accumulator_dtype=accumulator_dtype))
    elif nesterov:
        raise ValueError("sgd: nesterov=True needs a `momentum` value.")
    parts.append(scale_by_learning_rate(learning_rate))
    return optimizer("sgd", *parts)


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
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the second moment.
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.
        mu_dtype: dtype of the first moment (default: the parameter's dtype).
        nu_dtype: dtype of the second moment (default: the parameter's dtype).
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
    return optimizer(
        "adam",
        scale_by_adam(
            b1, b2, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype, nesterov=nesterov
        ),
        scale_by_learning_rate(learning_rate),
    )


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

    Args:
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the second moment.
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.
        weight_decay: the decoupled decay rate.
        mask: selector of the paths to decay (for example `"!**/bias"`); default: all.
        mu_dtype: dtype of the first moment (default: the parameter's dtype).
        nu_dtype: dtype of the second moment (default: the parameter's dtype).
        nesterov: use Nesterov momentum.

    Examples:
        >>> tx = gradtx.adamw(1e-3, weight_decay=0.01, mask="**/kernel")

    References:
        Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019.
    """
    return optimizer(
        "adamw",
        scale_by_adam(
            b1, b2, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype, nesterov=nesterov
        ),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )
