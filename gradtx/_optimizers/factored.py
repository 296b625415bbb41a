"""The Adafactor optimizer, on `scale_by_factored_rms`."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from gradtx._combinators.chain import Chain, optimizer
from gradtx._core.lift import dtype_or_none
from gradtx._transforms.averaging import ema
from gradtx._transforms.block_rms import clip_by_block_rms, scale_by_param_block_rms
from gradtx._transforms.factored import scale_by_factored_rms
from gradtx._transforms.scale import ScalarOrSchedule, scale, scale_by_learning_rate
from gradtx._transforms.weight_decay import add_decayed_weights


def adafactor(
    learning_rate: ScalarOrSchedule | None = None,
    min_dim_size_to_factor: int = 128,
    decay_rate: float = 0.8,
    decay_offset: int = 0,
    multiply_by_parameter_scale: bool = True,
    clipping_threshold: float | None = 1.0,
    momentum: float | None = None,
    dtype_momentum: Any = jnp.float32,
    weight_decay_rate: float | None = None,
    eps: float = 1e-30,
    factored: bool = True,
    weight_decay_mask: Any = None,
    *,
    stacked: Any = None,
    v_dtype: Any = None,
) -> Chain:
    r"""Adafactor: factored second moments, update clipping and relative step sizes.

    A flat chain, as in optax: `scale_by_factored_rms(factored, decay_rate, decay_offset,
    min_dim_size_to_factor, eps)`, then `clip_by_block_rms(clipping_threshold)` (unless
    `None`), `scale_by_learning_rate(learning_rate, flip_sign=False)` (unless `None`),
    `scale_by_param_block_rms()` (with `multiply_by_parameter_scale`), `ema(momentum,
    debias=False)` (with `momentum`), `add_decayed_weights(weight_decay_rate,
    weight_decay_mask)` (with `weight_decay_rate`) and `scale(-1)`. Per leaf, without momentum
    or decay:

    $$u = -\eta\,\max(\mathrm{rms}(\theta), 10^{-3})\,
      \frac{r}{\max(1, \mathrm{rms}(r)/d)},\qquad r = g / \sqrt{\hat V}$$

    with $\hat V$ the (factored) second moment of `scale_by_factored_rms` and $d$ the clipping
    threshold. The weight decay is added after the learning rate, so it is not scaled by it.

    Args:
        learning_rate: a number or a schedule, or `None` for no learning-rate factor.
        min_dim_size_to_factor: factor only arrays whose second largest dimension is this
            large.
        decay_rate: the exponent of the second-moment decay schedule $1 - t^{-c}$.
        decay_offset: the step at which the decay schedule starts (for fine-tuning).
        multiply_by_parameter_scale: scale steps by each array's parameter RMS.
        clipping_threshold: the largest RMS of an array's normalised update (`None`: no
            clipping).
        momentum: the decay of an (undebiased) moving average of the updates, or `None`.
        dtype_momentum: dtype of the momentum buffer (`None`: the parameter's dtype).
        weight_decay_rate: the decay rate, or `None` for no decay.
        eps: added to the squared gradients.
        factored: use factored second moments where an array qualifies.
        weight_decay_mask: a selector of the paths to decay (default: all).
        stacked: `{selector: n}` for stacked layers: the moments, the clipping and the
            parameter scale are per slice of the first `n` axes.
        v_dtype: dtype of the second moments (default: the parameter's dtype; float16 params
            need float32 here, since squared gradients underflow in float16).

    State:
        `v_row/<path>`, `v_col/<path>`, `v/<path>`, `count/<path>` (see
        `scale_by_factored_rms`); `schedule_count/<path>` with a schedule; `ema/<path>` with
        momentum. Packed params are refused.

    Examples:
        >>> tx = gradtx.adafactor(1e-2)
        >>> params = {"w": jnp.full((2, 2), 0.5)}
        >>> u, _ = tx.update({"w": jnp.ones((2, 2))}, tx.init(params), params)
        >>> u["w"]  # -lr * rms(w) * g / |g|
        Array([[-0.005, -0.005], [-0.005, -0.005]], dtype=float32)

    References:
        Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018.
    """
    parts: list = [
        scale_by_factored_rms(
            factored,
            decay_rate,
            decay_offset,
            min_dim_size_to_factor,
            eps,
            stacked=stacked,
            v_dtype=v_dtype,
        )
    ]
    if clipping_threshold is not None:
        parts.append(clip_by_block_rms(clipping_threshold, stacked=stacked))
    if learning_rate is not None:
        parts.append(scale_by_learning_rate(learning_rate, flip_sign=False))
    if multiply_by_parameter_scale:
        parts.append(scale_by_param_block_rms(stacked=stacked))
    if momentum is not None:
        parts.append(ema(momentum, debias=False, accumulator_dtype=dtype_or_none(dtype_momentum)))
    if weight_decay_rate is not None:
        parts.append(add_decayed_weights(weight_decay_rate, weight_decay_mask))
    parts.append(scale(-1.0))
    return optimizer("adafactor", *parts)
