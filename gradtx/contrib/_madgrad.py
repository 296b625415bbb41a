"""MADGRAD: momentumized, adaptive, dual-averaged gradient steps (Defazio & Jelassi)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._combinators.chain import optimizer
from gradtx._core.lift import as_stored, compute_dtype, zeros_for
from gradtx._core.module import decay_rate, hyperparam, non_negative
from gradtx._core.per_array import Float16Check, PerArrayTransform, hyperparam_at
from gradtx._layouts.step_counts import next_count
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.weight_decay import add_decayed_weights
from gradtx.contrib._reductions import copy_of


class ScaleByMadgrad(PerArrayTransform):
    """MADGRAD's step (see `scale_by_madgrad`)."""

    name: ClassVar[str] = "scale_by_madgrad"
    needs_params: ClassVar[bool] = True
    learning_rate: Any = hyperparam(required=True)
    momentum: Any = hyperparam(0.9, check=decay_rate)
    eps: Any = hyperparam(1e-6, check=non_negative)

    float16_check: ClassVar[Float16Check] = Float16Check(
        ("grad_sum_sq",), "the sum of squared gradients", None
    )

    def state_keys(self) -> tuple[str, ...]:
        """The weighted sums `grad_sum_sq` and `s`, the start `x0` and the path's `count`."""
        return ("grad_sum_sq", "s", "x0", "count")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Zero sums, a copy of the parameter and count 0."""
        return {
            "grad_sum_sq": zeros_for(param),
            "s": zeros_for(param),
            "x0": copy_of(param),
            "count": jnp.zeros((), jnp.int32),
        }

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One MADGRAD step for one array: the sums, the dual point, the move towards it."""
        dtype = compute_dtype(g, param, slots["grad_sum_sq"], slots["s"], slots["x0"])
        grad, x = g.astype(dtype), param.astype(dtype)
        new = next_count(slots["count"])
        count = new - 1  # the old count, read from the new one (see `next_count`)
        eps = self.eps.astype(dtype)
        lr = hyperparam_at(self.learning_rate, count).astype(dtype) + eps
        weight = lr * jnp.sqrt(new.astype(dtype))
        old = slots["grad_sum_sq"]
        nu = as_stored(old.astype(dtype) + weight * grad * grad, old)
        s = as_stored(slots["s"].astype(dtype) + weight * grad, slots["s"])
        # z - x = (x0 - x) - s / (nu^(1/3) + eps): the distance from the start is exact
        # for nearby values, so the step keeps its relative precision.
        gap = (slots["x0"].astype(dtype) - x) - s / (jnp.cbrt(nu) + eps)
        u = (1 - self.momentum.astype(dtype)) * gap
        return u, {"grad_sum_sq": nu, "s": s, "count": new}


def scale_by_madgrad(
    learning_rate: ScalarOrSchedule, momentum: float = 0.9, eps: float = 1e-6
) -> ScaleByMadgrad:
    r"""MADGRAD's step: dual averaging with a cube-root scaling, and momentum by averaging.

    Per path and element, with $k$ the path's number of earlier updates, $x_0$ the params
    at `init`, $\gamma_k$ the learning rate plus $\epsilon$ (as in the authors'
    implementation) and $\lambda_k = \gamma_k \sqrt{k + 1}$:

    $$\nu_{k+1} = \nu_k + \lambda_k g_k^2,\qquad s_{k+1} = s_k + \lambda_k g_k,\qquad
      z_{k+1} = x_0 - \frac{s_{k+1}}{\nu_{k+1}^{1/3} + \epsilon}$$

    $$x_{k+1} = c\, x_k + (1 - c)\, z_{k+1},\qquad
      u_k = x_{k+1} - x_k = (1 - c)\,(z_{k+1} - x_k)$$

    with $c$ = `momentum`. The learning rate is inside the step, so the update is already a
    descent step (`madgrad` adds no `scale_by_learning_rate`).

    Args:
        learning_rate: $\gamma$, a number or a schedule of the path's step count.
        momentum: $c$ in [0, 1), the weight of the current point in the average.
        eps: $\epsilon$, added to the cube root and to the learning rate.

    State:
        Per path, shaped like the parameter: `grad_sum_sq/<path>` ($\nu$), `s/<path>` and
        `x0/<path>` (a copy of the parameter made by `init`, so `init` needs the real
        params; `jax.ShapeDtypeStruct` leaves give zeros, to restore a checkpoint into);
        `count/<path>` (int32).

    Examples:
        >>> tx = gradtx.contrib.scale_by_madgrad(0.1, momentum=0.0, eps=0.0)
        >>> params = {"w": jnp.zeros(2)}
        >>> u, _ = tx.update({"w": jnp.array([8.0, -1.0])}, tx.init(params), params)
        >>> u["w"].round(6)  # -lr g / (lr g^2)^(1/3)
        Array([-0.430887,  0.215443], dtype=float32)

    References:
        Defazio & Jelassi, "Adaptivity without Compromise: A Momentumized, Adaptive, Dual
        Averaged Gradient Method for Stochastic Optimization", JMLR 2022.
    """
    return ScaleByMadgrad(learning_rate, momentum, eps)


def madgrad(
    learning_rate: ScalarOrSchedule,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    eps: float = 1e-6,
) -> Any:
    r"""MADGRAD with an L2 penalty on the gradient.

    `chain(add_decayed_weights(weight_decay), scale_by_madgrad(learning_rate, momentum,
    eps))`: the gradient $g_k + \lambda x_k$ enters MADGRAD's sums (see
    `scale_by_madgrad` for the step).

    Args:
        learning_rate: a number or a schedule (MADGRAD's defaults are larger than Adam's;
            the authors suggest starting from SGD's learning rate).
        momentum: $c$ in [0, 1).
        weight_decay: $\lambda$, the L2 penalty added to the gradient.
        eps: added to the cube root and to the learning rate.

    State:
        `grad_sum_sq/<path>`, `s/<path>`, `x0/<path>`, `count/<path>`.

    Examples:
        >>> tx = gradtx.contrib.madgrad(0.01)
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.ones(2)})))
        ['count/w', 'grad_sum_sq/w', 's/w', 'x0/w']

    References:
        Defazio & Jelassi, "Adaptivity without Compromise: A Momentumized, Adaptive, Dual
        Averaged Gradient Method for Stochastic Optimization", JMLR 2022.
    """
    return optimizer(
        "madgrad", add_decayed_weights(weight_decay), scale_by_madgrad(learning_rate, momentum, eps)
    )
