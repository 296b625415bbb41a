"""Layer-wise DoG: each array's step is its distance travelled over its gradients' norms."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from gradtx._core.lift import as_stored, compute_dtype, dtype_or_none, zeros_for
from gradtx._core.module import hyperparam, non_negative, static
from gradtx._core.per_array import PerArrayTransform
from gradtx._transforms.block_rms import block_norm
from gradtx._tree.reductions import sum_of_squares


def initial_distance(reps_rel: Any, norm: Any) -> Any:
    """DoG's starting distance `r_eps = reps_rel * (1 + ||x_0||)`: never a zero first step."""
    return reps_rel * (1 + norm)


def dog_step_size(max_dist: Any, sum_sq: Any, eps: Any) -> Any:
    """DoG's step size `max_dist / sqrt(sum_sq + eps)`: distance over the gradients' norms."""
    return max_dist / jnp.sqrt(sum_sq + eps)


class ScaleByDistanceOverGradients(PerArrayTransform):
    """Per-array DoG step sizes (see `scale_by_distance_over_gradients`)."""

    name: ClassVar[str] = "scale_by_distance_over_gradients"
    unpackable: ClassVar[str] = "keeps a distance and a gradient sum per array"
    needs_params: ClassVar[bool] = True
    per_leaf_structure: ClassVar[bool] = True
    reps_rel: Any = hyperparam(1e-6)
    eps: Any = hyperparam(1e-8, check=non_negative)
    param_dtype: Any = static(None, converter=dtype_or_none)
    global_scale: Any = hyperparam(1.0)

    def state_keys(self) -> tuple[str, ...]:
        """The starting point, the largest distance and the gradients' sum of squares."""
        return ("init_params", "max_dist", "grad_sum_of_squares")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """`x_0` (in `param_dtype`; zeros for `ShapeDtypeStruct`s), its distance, a zero sum."""
        dtype = param.dtype if self.param_dtype is None else self.param_dtype
        if isinstance(param, jax.ShapeDtypeStruct):
            start = zeros_for(param, dtype)
        else:
            start = jnp.array(param, dtype=dtype, copy=True)  # a buffer of its own
        wide = compute_dtype(start)
        norm = block_norm(start, wide)
        return {
            "init_params": start,
            "max_dist": initial_distance(self.reps_rel.astype(wide), norm).astype(dtype),
            "grad_sum_of_squares": jnp.zeros((), dtype),
        }

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Grow the distance and the sum of squares, then scale `g` by their ratio."""
        start = slots["init_params"]
        dtype = compute_dtype(g, param, start)
        moved = param.astype(dtype) - start.astype(dtype)
        distance = block_norm(moved, dtype)
        max_dist = as_stored(
            jnp.maximum(slots["max_dist"].astype(dtype), distance), slots["max_dist"]
        )
        total = slots["grad_sum_of_squares"].astype(dtype) + sum_of_squares(g).astype(dtype)
        total = as_stored(total, slots["grad_sum_of_squares"])
        step = self.global_scale.astype(dtype) * dog_step_size(
            max_dist, total, self.eps.astype(dtype)
        )
        return step * g.astype(dtype), {"max_dist": max_dist, "grad_sum_of_squares": total}


def scale_by_distance_over_gradients(
    reps_rel: float = 1e-6,
    eps: float = 1e-8,
    param_dtype: Any = None,
    global_scale: float = 1.0,
) -> ScaleByDistanceOverGradients:
    r"""Scale each array's update by its layer-wise DoG step size (L-DoG).

    DoG (Ivgi et al., 2023) needs no learning rate: the step is the distance travelled from
    the starting point over the root of the sum of squared gradient norms. This is the
    layer-wise version (L-DoG in the paper, optax's `scale_by_distance_over_gradients`): each
    path $l$ keeps its own, from its own array:

    $$\bar r_{l,t} = \max\big(\bar r_{l,t-1},\ \lVert x_{l,t} - x_{l,0}\rVert\big),\qquad
      G_{l,t} = G_{l,t-1} + \lVert g_{l,t}\rVert^2,\qquad
      u_{l,t} = s\,\frac{\bar r_{l,t}}{\sqrt{G_{l,t} + \epsilon}}\, g_{l,t}$$

    with $\bar r_{l,0} = r_\epsilon (1 + \lVert x_{l,0}\rVert)$ ($r_\epsilon$ = `reps_rel`),
    $G_{l,0} = 0$ and $s$ = `global_scale`. The update keeps the gradient's direction: put
    `scale_by_learning_rate(1.0)` after it (or pass `global_scale=-1.0`) to descend.
    `gradtx.contrib.scale_by_dog` is the global DoG: one step size for all paths, from the
    distance and the gradients of the whole tree. The authors recommend averaging the
    iterates (for example `gradtx.ema_params`).

    Args:
        reps_rel: $r_\epsilon$, the first step's relative size: 1e-6 suits most models, 1e-4
            those with batch normalization.
        eps: added to the sum of squared gradient norms.
        param_dtype: the dtype of the stored starting point and of the two per-path scalars
            (default: the parameter's dtype; optax keeps them in float32).
        global_scale: $s$, a factor on every step (1 or -1 typically).

    State:
        `init_params/<path>` (a copy of the parameter made by `init`, so `init` needs the real
        params), `max_dist/<path>` ($\bar r_l$) and `grad_sum_of_squares/<path>` ($G_l$),
        scalars; all in `param_dtype`. Packed params are refused.

    Examples:
        >>> tx = gradtx.scale_by_distance_over_gradients(reps_rel=0.1)
        >>> params = {"w": jnp.array([3.0, 4.0]), "b": jnp.zeros(2)}
        >>> state = tx.init(params)
        >>> state["max_dist"]  # 0.1 * (1 + ||x_0||) per path
        {'b': Array(0.1, dtype=float32), 'w': Array(0.6, dtype=float32)}
        >>> u, state = tx.update({"w": jnp.array([0.0, 2.0]), "b": jnp.ones(2)}, state, params)
        >>> u["w"]  # 0.6 / ||g|| * g
        Array([0. , 0.6], dtype=float32)

    References:
        Ivgi et al., "DoG is SGD's Best Friend: A Parameter-Free Dynamic Step Size
        Schedule", ICML 2023.
    """
    return ScaleByDistanceOverGradients(reps_rel, eps, param_dtype, global_scale)
