"""Mechanic: a learned scale for any optimizer's accumulated updates (Cutkosky et al.)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import check_state_keys, compute_dtype, update_slots
from gradtx._core.module import field, hyperparam, non_negative, static
from gradtx._core.protocol import Params, Transformation, Updates, own_hyperparams
from gradtx._layouts.step_counts import next_count
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.subset import present_paths
from gradtx.contrib._reductions import copies_of, flat_dot, needs_params_error, positive_int

_GLOBAL = ("count", "r", "m", "v", "s")


class Mechanize(Transformation):
    """Mechanic around a base optimizer (see `mechanize`)."""

    name: ClassVar[str] = "mechanize"
    base_optimizer: Any = field(converter=as_transformation)
    weight_decay: Any = hyperparam(1e-2, check=non_negative)
    eps: Any = hyperparam(1e-8, check=non_negative)
    s_init: Any = hyperparam(1e-6, check=non_negative)
    num_betas: int = static(6, converter=positive_int("mechanize"))

    def state_keys(self) -> tuple[str, ...]:
        """The base optimizer's state, the start `x0` per path and the global tuner state."""
        return ("base_optimizer", "x0", *_GLOBAL)

    def frozen_paths(self, params: Params) -> frozenset[str]:
        """None: a path the base optimizer freezes still moves with the learned scale."""
        return frozenset()

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """The base optimizer's steps, then this one with its own hyperparameters."""
        entry = (self.name, {"num_betas": self.num_betas, **own_hyperparams(self, step)})
        base = self.base_optimizer.describe(params, step)
        return {path: [*base.get(path, []), entry] for path in present_paths(params)}

    def init_state(self, params: Params) -> dict:
        """The base state, a copy of the params, and zero sums with the scales at `s_init`."""
        n = self.num_betas
        return {
            "base_optimizer": self.base_optimizer.init_state(params),
            "x0": copies_of(params),
            "count": jnp.zeros((), jnp.int32),
            "r": jnp.zeros((n,), jnp.float32),
            "m": jnp.zeros((n,), jnp.float32),
            "v": jnp.zeros((n,), jnp.float32),
            "s": jnp.full((n,), self.s_init, jnp.float32),
        }

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """The base step, then the new scales, then the move to `x0 - sum(s) * delta`."""
        check_state_keys(self.name, state, self.state_keys())
        if params is None:
            raise needs_params_error(self.name)
        base_updates, base_state = self.base_optimizer.step(
            updates, state["base_optimizer"], params, **extra
        )
        count, eps = state["count"], self.eps
        first = count == 0
        grad_gap, param_gap, grad_sq, param_sq = [], [], [], []

        def start(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            # The start is the params of the first update (so `init` may get abstract params).
            x0 = jnp.where(first, param, slots["x0"])
            dtype = compute_dtype(g, param, x0)
            grad, x = g.astype(dtype), param.astype(dtype)
            gap = x0.astype(dtype) - x
            grad_gap.append((grad, gap))
            param_gap.append((x, gap))
            grad_sq.append((grad, grad))
            param_sq.append((x, x))
            return g, {"x0": x0}

        slots = {"x0": state["x0"]}
        _, slots = update_slots(start, updates, slots, params, owner=self.name, needs_params=True)

        s_old = state["s"]
        total = jnp.sum(s_old)
        grad_norm = jnp.sqrt(flat_dot(grad_sq))
        param_norm = jnp.sqrt(flat_dot(param_sq))
        decay = self.weight_decay * total * grad_norm / (param_norm + eps)
        # h = <g + decay x, delta> with delta = (x0 - x) / (sum(s) + eps)
        h = (flat_dot(grad_gap) + decay * flat_dot(param_gap)) / (total + eps)
        m_old = state["m"]
        clipped = jnp.clip(h, -m_old, m_old)
        betas = jnp.asarray(1 - 0.1 ** np.arange(1, self.num_betas + 1), jnp.float32)
        m = jnp.maximum(betas * m_old, jnp.abs(h) + eps)
        v = betas * betas * state["v"] + h * h
        r = betas * state["r"] + clipped * s_old
        wealth = (self.s_init / self.num_betas) * m + jnp.maximum(r, 0.0)
        s = wealth / (jnp.sqrt(v) + eps)
        new_total = jnp.sum(s)

        def move(u: Any, leaf: dict, param: Any) -> tuple[Any, dict]:
            dtype = compute_dtype(u, param, leaf["x0"])
            gap = leaf["x0"].astype(dtype) - param.astype(dtype)
            delta = gap / (total + eps).astype(dtype) - u.astype(dtype)
            # x_new - x = (x0 - x) - sum(s_new) * delta
            return gap - new_total.astype(dtype) * delta, {}

        new_updates, _ = update_slots(
            move, base_updates, slots, params, owner=self.name, needs_params=True
        )
        tuner = {"count": next_count(count), "r": r, "m": m, "v": v, "s": s}
        return new_updates, {"base_optimizer": base_state, **slots, **tuner}


def mechanize(
    base_optimizer: Any,
    weight_decay: float = 1e-2,
    eps: float = 1e-8,
    s_init: float = 1e-6,
    num_betas: int = 6,
) -> Mechanize:
    r"""Mechanic: learn the scale of a base optimizer's updates while training.

    The base optimizer's updates $u_t$ add up to $\Delta_t$; the params are kept at
    $x_t = x_0 - S_t \Delta_t$ (in optax's sign convention, $\Delta$ = minus the summed
    updates) with $S_t = \sum_i s_{t,i}$ a scale learned by online betting, one bettor per
    decay $\beta_i = 1 - 10^{-i}$, $i = 1..n$. Over all present paths together, at each
    update:

    $$\Delta_{t-1} = \frac{x_0 - x_t}{S_t + \epsilon},\qquad
      h_t = \Big\langle g_t + \lambda S_t \frac{\lVert g_t\rVert}{\lVert x_t\rVert +
      \epsilon}\, x_t,\ \Delta_{t-1}\Big\rangle$$

    $$m_t = \max(\beta m_{t-1}, |h_t| + \epsilon),\quad v_t = \beta^2 v_{t-1} + h_t^2,\quad
      r_t = \beta r_{t-1} + \mathrm{clip}(h_t, \pm m_{t-1})\, s_t$$

    $$s_{t+1} = \frac{\frac{s_{init}}{n} m_t + \max(r_t, 0)}{\sqrt{v_t} + \epsilon},\qquad
      x_{t+1} = x_0 - S_{t+1}\,(\Delta_{t-1} - u_t)$$

    elementwise over the $n$ bettors, and the update is $x_{t+1} - x_t$. $x_0$ is the
    params of the first update. The base optimizer keeps its learning rate, whose schedule
    Mechanic still follows (set its peak to 1 and let Mechanic find the scale); `**extra`
    arguments go on to it. The weight decay $\lambda$ only enters the bet, not the base
    optimizer. $\Delta$ is read back from the params, as optax does (no second copy of the
    params in the state), so changing the params between steps changes what is accumulated.

    Args:
        base_optimizer: the optimizer whose updates are scaled (a gradtx transformation or
            an optax-style `(init, update)` pair).
        weight_decay: $\lambda$, Mechanic's own decay in the bet.
        eps: $\epsilon$.
        s_init: the initial scale of each bettor, and the base of its wealth.
        num_betas: $n$, the number of bettors (decays $0.9, 0.99, \dots$).

    State:
        `base_optimizer/...` (the base optimizer's state) and `x0/<path>` (a copy of the
        parameter; the params of the first update replace it); global, by name: `count`
        (int32) and `r`, `m`, `v`, `s` (float32, one entry per bettor).

    Examples:
        >>> tx = gradtx.contrib.mechanize(gradtx.sgd(1.0))
        >>> params = {"w": jnp.ones(2)}
        >>> u, state = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
        >>> u["w"]  # nothing to bet on yet: the base step times sum(s) = s_init
        Array([-1.e-06, -1.e-06], dtype=float32)

    References:
        Cutkosky, Defazio & Mehta, "Mechanic: A Learning Rate Tuner", NeurIPS 2023.
    """
    return Mechanize(base_optimizer, weight_decay, eps, s_init, num_betas)
