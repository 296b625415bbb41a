"""COCOB-Backprop: learning-rate-free descent by continuous coin betting (Orabona & Tommasi)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._combinators.chain import optimizer
from gradtx._core.lift import as_stored, compute_dtype, zeros_for
from gradtx._core.module import hyperparam, non_negative
from gradtx._core.per_array import PerArrayTransform
from gradtx._transforms.scale import ScalarOrSchedule, scale_by_learning_rate
from gradtx._transforms.weight_decay import add_decayed_weights
from gradtx.contrib._reductions import copy_of


class ScaleByCocob(PerArrayTransform):
    """COCOB-Backprop's betting step (see `scale_by_cocob`)."""

    name: ClassVar[str] = "scale_by_cocob"
    needs_params: ClassVar[bool] = True
    alpha: Any = hyperparam(100.0)
    eps: Any = hyperparam(1e-8, check=non_negative)

    def state_keys(self) -> tuple[str, ...]:
        """The starting point, the gradient sums, the scale and the reward of each path."""
        return ("init_particles", "cumulative_gradients", "scale", "subgradients", "reward")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A copy of the parameter, zero sums and reward, and the scale `eps`."""
        return {
            "init_particles": copy_of(param),
            "cumulative_gradients": zeros_for(param),
            "scale": (zeros_for(param, jnp.float32) + self.eps).astype(param.dtype),
            "subgradients": zeros_for(param),
            "reward": zeros_for(param),
        }

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One betting step: the new parameter is the start plus the bet; `u` moves there."""
        dtype = compute_dtype(g, param, *slots.values())
        grad, p = g.astype(dtype), param.astype(dtype)
        p0 = slots["init_particles"].astype(dtype)
        scale = as_stored(jnp.maximum(slots["scale"].astype(dtype), jnp.abs(grad)), slots["scale"])
        sub = as_stored(slots["subgradients"].astype(dtype) + jnp.abs(grad), slots["subgradients"])
        gained = slots["reward"].astype(dtype) - grad * (p - p0)
        # max(gained, 0), bit for bit (-0 and NaN included), as a select: XLA's CPU compiler
        # recomputed a `maximum` in the update's kernel from the old reward and the old
        # params, and a donated step then copied both (benchmarks/lab/kernels.py).
        reward = as_stored(jnp.where(gained <= 0, 0, gained), slots["reward"])
        cum = as_stored(
            slots["cumulative_gradients"].astype(dtype) - grad, slots["cumulative_gradients"]
        )
        alpha = self.alpha.astype(dtype)
        bet = cum / (scale * jnp.maximum(sub + scale, alpha * scale)) * (scale + reward)
        u = (p0 - p) + bet
        new = {"cumulative_gradients": cum, "scale": scale, "subgradients": sub, "reward": reward}
        return u, new


def scale_by_cocob(alpha: float = 100.0, eps: float = 1e-8) -> ScaleByCocob:
    r"""Replace the update by COCOB-Backprop's bet (coin betting on each coordinate).

    Per path and element, with $x_0$ the parameter at `init` and $g_t$ the incoming update
    (the gradient, already scaled by `cocob`'s learning rate):

    $$L_t = \max(L_{t-1}, |g_t|),\quad G_t = G_{t-1} + |g_t|,\quad
      R_t = \max(R_{t-1} - g_t (x_t - x_0),\ 0),\quad C_t = C_{t-1} - g_t$$

    $$x_{t+1} = x_0 + \frac{C_t}{L_t \max(G_t + L_t,\ \alpha L_t)}\,(L_t + R_t),\qquad
      u_t = x_{t+1} - x_t$$

    with $L_0 = \epsilon$ and $G_0 = R_0 = C_0 = 0$. The update is already a descent step:
    apply it as is.

    Args:
        alpha: the cap $\alpha$ on the betting fraction in the first steps.
        eps: the initial scale $L_0$ (avoids dividing by zero).

    State:
        `init_particles/<path>` (a copy of the parameter made by `init`, so `init` needs the
        real params; `jax.ShapeDtypeStruct` leaves give zeros, to restore a checkpoint into),
        `cumulative_gradients/<path>`, `scale/<path>`, `subgradients/<path>` and
        `reward/<path>`, all shaped like the parameter.

    Examples:
        >>> tx = gradtx.contrib.scale_by_cocob()
        >>> params = {"w": jnp.array([1.0, 1.0])}
        >>> u, _ = tx.update({"w": jnp.array([0.5, -2.0])}, tx.init(params), params)
        >>> u["w"]  # -g / (alpha |g|) on the first step
        Array([-0.01,  0.01], dtype=float32)

    References:
        Orabona & Tommasi, "Training Deep Networks without Learning Rates Through Coin
        Betting", NeurIPS 2017.
    """
    return ScaleByCocob(alpha, eps)


def cocob(
    learning_rate: ScalarOrSchedule = 1.0,
    alpha: float = 100.0,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    mask: Any = None,
) -> Any:
    r"""COCOB-Backprop: learning-rate-free descent by coin betting.

    `chain(add_decayed_weights(weight_decay, mask), scale_by_learning_rate(learning_rate,
    flip_sign=False), scale_by_cocob(alpha, eps))`: the (decayed, scaled) gradient
    $g_t = \eta\,(\nabla f(x_t) + \lambda x_t)$ feeds the betting step of `scale_by_cocob`,
    whose output moves the parameters to $x_{t+1}$.

    Args:
        learning_rate: a factor on the gradients (1 for the method as published), or a
            schedule.
        alpha: the cap on the betting fraction in the first steps.
        eps: the initial scale (avoids dividing by zero).
        weight_decay: an L2 penalty $\lambda$ added to the gradient.
        mask: selector of the paths to decay (for example `"!**/bias"`); default: all.

    State:
        The slots of `scale_by_cocob`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.contrib.cocob()
        >>> params = {"w": jnp.array([1.0, 1.0])}
        >>> sorted(gradtx.state_dict(tx.init(params)))[:2]
        ['cumulative_gradients/w', 'init_particles/w']

    References:
        Orabona & Tommasi, "Training Deep Networks without Learning Rates Through Coin
        Betting", NeurIPS 2017.
    """
    return optimizer(
        "cocob",
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate, flip_sign=False),
        scale_by_cocob(alpha, eps),
    )
