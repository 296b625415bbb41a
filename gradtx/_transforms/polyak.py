"""The Polyak step size: the loss gap over the squared gradient norm."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import map_updates
from gradtx._core.module import hyperparam, non_negative, static
from gradtx._core.per_array import PerArrayTransform
from gradtx._core.protocol import Params, Updates
from gradtx._transforms.scale import scaled
from gradtx._tree.reductions import global_sum

_VARIANTS = ("sps", "sps+")
# Below this squared norm the step is zero (the gradient vanishes): float64's machine epsilon.
_TINY = float(jnp.finfo(jnp.float64).eps)


def _variant(value: Any, name: str) -> str:
    if value not in _VARIANTS:
        raise ValueError(f"`variant` must be one of {list(_VARIANTS)}, got {value!r}")
    return value


class ScaleByPolyak(PerArrayTransform):
    """Scale all updates by the Polyak step size (see `scale_by_polyak`)."""

    name: ClassVar[str] = "scale_by_polyak"
    f_min: Any = hyperparam(0.0)
    max_learning_rate: Any = hyperparam(1.0)
    eps: Any = hyperparam(0.0, check=non_negative)
    variant: str = static("sps", converter=_variant)

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Multiply every present update by `min((value - f_min) / (||g||^2 + eps), max_lr)`."""
        self.check_state(state)
        value = extra.get("value")
        if value is None:
            raise TypeError(
                f"{self.name} needs the loss: pass it as the `value` argument, "
                "`tx.update(grads, state, params, value=loss)` (for example from "
                "`loss, grads = jax.value_and_grad(loss_fn)(params)`)."
            )
        squared = global_sum(updates)
        gap = jnp.asarray(value, jnp.float32) - self.f_min
        if self.variant == "sps+":
            gap = jnp.maximum(gap, 0.0)
        denominator = squared + self.eps
        step = jnp.where(
            denominator <= _TINY,
            jnp.float32(0),
            jnp.minimum(gap / denominator, self.max_learning_rate),
        )
        return map_updates(lambda g, _: scaled(g, step), updates, owner=self.name), state


def scale_by_polyak(
    f_min: float = 0.0,
    max_learning_rate: float = 1.0,
    eps: float = 0.0,
    variant: str = "sps",
) -> ScaleByPolyak:
    r"""Scale the updates by the Polyak step size, computed from the loss value.

    With the loss $f(x_t)$ passed as `value` and the global norm taken over every present leaf:

    $$u_t = \gamma_t\, g_t,\qquad
      \gamma_t = \min\left(\frac{f(x_t) - f^\star}{\lVert g_t\rVert_2^2 + \epsilon},\
      \gamma_{max}\right)$$

    and $\gamma_t = 0$ where $\lVert g_t\rVert^2 + \epsilon$ is below float64's machine epsilon.
    With `variant="sps+"` the gap $f(x_t) - f^\star$ is first clipped at zero. The update keeps
    the gradient's direction (`polyak_sgd` negates it).

    Call it as `tx.update(grads, state, params, value=loss)`; without `value` it raises a
    `TypeError` that says so.

    Args:
        f_min: a lower bound $f^\star$ on the loss (0 for interpolating models).
        max_learning_rate: the largest step size $\gamma_{max}$.
        eps: added to the squared norm.
        variant: `"sps"` or `"sps+"`.

    State:
        None (an empty dict).

    Examples:
        >>> tx = gradtx.scale_by_polyak()
        >>> grads = {"w": jnp.array([3.0, 4.0])}
        >>> tx.update(grads, tx.init(grads), value=5.0)[0]["w"]
        Array([0.6, 0.8], dtype=float32)

    References:
        Loizou et al., "Stochastic Polyak Step-size for SGD: An Adaptive Learning Rate for Fast
        Convergence", 2021; Berrada et al., "Training Neural Networks for and by
        Interpolation", 2020.
    """
    return ScaleByPolyak(f_min, max_learning_rate, eps, variant)
