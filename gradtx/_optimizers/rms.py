"""RMSProp, plain or centered, on `scale_by_rms` and `scale_by_stddev`."""

from __future__ import annotations

from typing import Any

from gradtx._combinators.chain import Chain, optimizer
from gradtx._core.protocol import Transformation
from gradtx._transforms.momentum import trace
from gradtx._transforms.rms import scale_by_rms, scale_by_stddev
from gradtx._transforms.scale import ScalarOrSchedule, scale_by_learning_rate
from gradtx._transforms.shared_args import with_shared_args


@with_shared_args
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
        decay: decay of the moving average(s) of the gradients.
        eps: the stabilising constant.
        initial_scale: the initial value of the second moment (PyTorch 0, TensorFlow 1 1).
        eps_in_sqrt: add `eps` inside the square root (optax) or outside (PyTorch).
        centered: divide by the estimated standard deviation rather than the RMS.
        momentum: the momentum coefficient, or `None` for none.
        bias_correction: bias-correct the moving average(s).
        mu_dtype: dtype of the first moment when `centered` (default: the parameter's dtype).

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
    moments = (decay, eps, initial_scale, eps_in_sqrt, bias_correction)
    if centered:
        rescale: Transformation = scale_by_stddev(*moments, mu_dtype=mu_dtype, nu_dtype=nu_dtype)
    else:
        if mu_dtype is not None:
            raise ValueError("rmsprop: `mu_dtype` applies only with centered=True.")
        rescale = scale_by_rms(*moments, nu_dtype=nu_dtype)
    parts = [rescale, scale_by_learning_rate(learning_rate)]
    if momentum is not None:
        parts.append(trace(momentum, nesterov, accumulator_dtype=accumulator_dtype))
    return optimizer("rmsprop", *parts)
