"""Sign-based rescaling: the sign of the gradient, and Rprop's adaptive per-element steps."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import as_stored, compute_dtype, zeros_for
from gradtx._core.module import hyperparam
from gradtx._core.per_array import PerArrayTransform


class ScaleBySign(PerArrayTransform):
    """`u = sign(g)` (see `scale_by_sign`)."""

    name: ClassVar[str] = "scale_by_sign"

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = sign(g)`: -1, 0 or 1 per element."""
        return jnp.sign(g), {}


class ScaleByRprop(PerArrayTransform):
    """Rprop's sign-driven per-element step sizes (see `scale_by_rprop`)."""

    name: ClassVar[str] = "scale_by_rprop"
    learning_rate: Any = hyperparam(required=True)
    eta_minus: Any = hyperparam(0.5)
    eta_plus: Any = hyperparam(1.2)
    min_step_size: Any = hyperparam(1e-6)
    max_step_size: Any = hyperparam(50.0)

    def state_keys(self) -> tuple[str, ...]:
        """The per-element `step_sizes` and the last update `prev_updates`."""
        return ("step_sizes", "prev_updates")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Step sizes equal to `learning_rate`, a zero previous update (the param's dtype)."""
        zeros = zeros_for(param)
        return {
            "step_sizes": zeros + self.learning_rate.astype(zeros.dtype),
            "prev_updates": zeros,
        }

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Grow or shrink each step size with the sign agreement, then step by it."""
        dtype = compute_dtype(g, slots["step_sizes"], slots["prev_updates"])
        grad = g.astype(dtype)
        agreement = grad * slots["prev_updates"].astype(dtype)
        step = slots["step_sizes"].astype(dtype)
        factor = jnp.where(agreement > 0, self.eta_plus, self.eta_minus).astype(dtype)
        lo, hi = self.min_step_size.astype(dtype), self.max_step_size.astype(dtype)
        # The step sizes and the update as the state keeps them (`as_stored`): with bfloat16
        # state, the update's kernel then reads the new slots, not the old ones, which a
        # donated step would have to copy first. A stored size times a sign loses nothing.
        grown = jnp.where(agreement == 0, step, jnp.clip(step * factor, lo, hi))
        step = as_stored(grown, slots["step_sizes"])
        u = jnp.where(agreement < 0, jnp.zeros_like(grad), step * jnp.sign(grad))
        u = as_stored(u, slots["prev_updates"])
        return u, {"step_sizes": step, "prev_updates": u}


def scale_by_sign() -> ScaleBySign:
    r"""Replace each update element by its sign: $u = \operatorname{sign}(g)$.

    Stateless; zeros stay zero. With a learning rate this is signSGD; after a momentum
    (`trace` or `ema`) it is Signum.

    Examples:
        >>> tx = gradtx.scale_by_sign()
        >>> tx.update({"w": jnp.array([-3.0, 0.0, 0.2])}, {})[0]["w"]
        Array([-1.,  0.,  1.], dtype=float32)

    References:
        Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex Problems", 2018.
    """
    return ScaleBySign()


def scale_by_rprop(
    learning_rate: float,
    eta_minus: float = 0.5,
    eta_plus: float = 1.2,
    min_step_size: float = 1e-6,
    max_step_size: float = 50.0,
) -> ScaleByRprop:
    r"""Rescale updates by Rprop's per-element step sizes (iRprop$^-$).

    Each element keeps a step size $\Delta$ (initially `learning_rate`) and the previous update
    $u_{t-1}$. With $s = g_t\,u_{t-1}$:

    $$\Delta_t = \begin{cases}
      \mathrm{clip}(\eta^+\Delta_{t-1}, \Delta_{min}, \Delta_{max}) & s > 0\\
      \mathrm{clip}(\eta^-\Delta_{t-1}, \Delta_{min}, \Delta_{max}) & s < 0\\
      \Delta_{t-1} & s = 0\end{cases},\qquad
      u_t = \begin{cases} 0 & s < 0\\ \Delta_t \operatorname{sign}(g_t) & \text{else}\end{cases}$$

    The update points uphill like the gradient (`rprop` negates it). A sign change skips the
    step and zeroes the remembered update, so the next step does not shrink the size again.

    Divergence from optax: `optax.scale_by_rprop` (0.2.8) returns the *previous* step's update
    (its first update is zero); this returns the current one, as in the paper and in
    `torch.optim.Rprop`.

    Args:
        learning_rate: the initial step size of every element.
        eta_minus: factor that shrinks a step size after a sign change.
        eta_plus: factor that grows a step size while the sign holds.
        min_step_size: the smallest step size.
        max_step_size: the largest step size.

    State:
        `step_sizes/<path>` and `prev_updates/<path>`, shaped like the parameter.

    Examples:
        >>> tx = gradtx.scale_by_rprop(0.1)
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> u, state = tx.update({"w": jnp.array([1.0, -1.0])}, state)
        >>> u, state = tx.update({"w": jnp.array([2.0, 1.0])}, state)
        >>> u["w"], state["step_sizes"]["w"]
        (Array([0.12, 0.  ], dtype=float32), Array([0.12, 0.05], dtype=float32))

    References:
        Riedmiller & Braun, "A Direct Adaptive Method for Faster Backpropagation Learning: The
        RPROP Algorithm", 1993; Igel & Hüsken, "Improving the Rprop Learning Algorithm", 2000.
    """
    return ScaleByRprop(learning_rate, eta_minus, eta_plus, min_step_size, max_step_size)
