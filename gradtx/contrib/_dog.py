"""DoG and DoWG: step sizes from the distance travelled over the gradients seen."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp
from jax import lax

from gradtx._core.lift import compute_dtype, map_updates
from gradtx._core.module import hyperparam, non_negative, static
from gradtx._core.per_array import PerArrayTransform
from gradtx._core.protocol import Params, Transformation, Updates
from gradtx._optimizers.descent import descent
from gradtx._transforms.distance_over_gradients import dog_step_size, initial_distance
from gradtx._transforms.scale import ScalarOrSchedule, scaled
from gradtx._transforms.weight_decay import add_decayed_weights
from gradtx._tree.reductions import global_sum, sum_of_squares
from gradtx.contrib._reductions import copies_of, needs_params_error, paired_arrays, scalar_copy

_INIT_STEPS = ("distance", "learning_rate", "heuristic")


def _init_kind(value: Any, name: str) -> str:
    if value not in _INIT_STEPS:
        raise ValueError(
            f"`init_step` must be a pair (kind, value) with kind one of {list(_INIT_STEPS)}, "
            f"got kind {value!r}"
        )
    return value


def _sq_distance(params: Params, start: dict) -> Any:
    """`||params - start||^2` over every path of the params, in float32."""
    total = jnp.zeros((), jnp.float32)
    for p, p0 in paired_arrays(params, start):
        dtype = compute_dtype(p, p0)
        total = total + sum_of_squares(p.astype(dtype) - p0.astype(dtype)).astype(jnp.float32)
    return total


class ScaleByDog(PerArrayTransform):
    """Scale by the DoG step size (see `scale_by_dog`)."""

    name: ClassVar[str] = "scale_by_dog"
    needs_params: ClassVar[bool] = True
    init_step_value: Any = hyperparam(1e-6)
    eps: Any = hyperparam(1e-8, check=non_negative)
    init_step_kind: str = static("heuristic", converter=_init_kind)

    def state_keys(self) -> tuple[str, ...]:
        """The starting point per path; the global flag, distance and gradient sum."""
        return ("init_params", "is_init_step", "max_dist", "sum_sq_norm_grads")

    def init_state(self, params: Params) -> dict:
        """A copy of the params and the global scalars.

        `init` needs the real params (it copies them); `jax.ShapeDtypeStruct` leaves give
        zeros, to restore a checkpoint into.
        """
        start = self.init_step_value if self.init_step_kind == "distance" else 0.0
        return {
            "init_params": copies_of(params),
            "is_init_step": jnp.asarray(True),
            "max_dist": scalar_copy(start),
            "sum_sq_norm_grads": jnp.zeros((), jnp.float32),
        }

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Multiply every present update by `max_dist / sqrt(sum_sq_norm_grads + eps)`."""
        self.check_state(state)
        if params is None:
            raise needs_params_error(self.name)
        first = state["is_init_step"]
        max_dist = state["max_dist"]
        if self.init_step_kind == "heuristic":
            # r_eps = value * (1 + ||x_0||), from the params of the first update (= x_0). A
            # `cond` reads every param for it on that step alone: with `where`, every step did,
            # which slowed every step on large leaves (benchmarks/lab/kernels.py).
            def start() -> Any:
                norm = jnp.sqrt(global_sum(params))
                return initial_distance(self.init_step_value, norm).astype(max_dist.dtype)

            max_dist = lax.cond(first, start, lambda: max_dist)
        max_dist = jnp.maximum(max_dist, jnp.sqrt(_sq_distance(params, state["init_params"])))
        total = state["sum_sq_norm_grads"] + global_sum(updates)
        step = dog_step_size(max_dist, total, self.eps)
        if self.init_step_kind == "learning_rate":
            step = jnp.where(first, self.init_step_value, step)
        new_updates = map_updates(lambda g, _: scaled(g, step), updates, owner=self.name)
        return new_updates, {
            **state,
            "is_init_step": jnp.asarray(False),
            "max_dist": max_dist,
            "sum_sq_norm_grads": total,
        }


def scale_by_dog(
    init_step: tuple[str, float] = ("heuristic", 1e-6), eps: float = 1e-8
) -> ScaleByDog:
    r"""Scale the updates by the DoG (Distance over Gradients) step size.

    Over all paths together, with $x_0$ the params at `init`:

    $$\bar r_t = \max\big(r_\epsilon,\ \max_{k \le t}\lVert x_k - x_0\rVert\big),\qquad
      G_t = \sum_{k \le t}\lVert g_k\rVert^2,\qquad
      u_t = \frac{\bar r_t}{\sqrt{G_t + \epsilon}}\, g_t$$

    `init_step = (kind, value)` sets the first step: `"distance"` gives $r_\epsilon$ =
    value; `"heuristic"` gives $r_\epsilon$ = value $\cdot (1 + \lVert x_0\rVert)$ (computed
    from the params of the first update, which are $x_0$); `"learning_rate"` uses
    $r_\epsilon = 0$ and the step size value at the first step. The update keeps the
    gradient's direction (`dog` negates it). `gradtx.scale_by_distance_over_gradients` is
    the layer-wise version (L-DoG): a step size per path.

    Args:
        init_step: the pair `(kind, value)` described above; 1e-6 suits most models (1e-4
            with batch normalization).
        eps: added to the sum of squared gradient norms.

    State:
        `init_params/<path>` (a copy of the parameter made by `init`, so `init` needs the
        real params); global, by name: `is_init_step` (bool), `max_dist` ($\bar r$, float32)
        and `sum_sq_norm_grads` ($G$, float32), which advance at every update.

    Examples:
        >>> tx = gradtx.contrib.scale_by_dog(("distance", 0.5))
        >>> params = {"w": jnp.zeros(2)}
        >>> u, _ = tx.update({"w": jnp.array([3.0, 4.0])}, tx.init(params), params)
        >>> u["w"]  # r / ||g|| * g
        Array([0.3, 0.4], dtype=float32)

    References:
        Ivgi et al., "DoG is SGD's Best Friend: A Parameter-Free Dynamic Step Size
        Schedule", ICML 2023.
    """
    kind, value = init_step
    return ScaleByDog(value, eps, kind)


class ScaleByDowg(PerArrayTransform):
    """Scale by the DoWG step size (see `scale_by_dowg`)."""

    name: ClassVar[str] = "scale_by_dowg"
    needs_params: ClassVar[bool] = True
    init_estim_sq_dist: Any = hyperparam(None)
    eps: Any = hyperparam(1e-4, check=non_negative)

    def state_keys(self) -> tuple[str, ...]:
        """The starting point per path; the global weighted gradient sum and distance."""
        return ("init_params", "estim_sq_dist", "weighted_sq_norm_grads")

    def init_state(self, params: Params) -> dict:
        """A copy of the params and the global scalars (`init` needs the real params)."""
        start = self.eps if self.init_estim_sq_dist is None else self.init_estim_sq_dist
        return {
            "init_params": copies_of(params),
            "estim_sq_dist": scalar_copy(start),
            "weighted_sq_norm_grads": jnp.zeros((), jnp.float32),
        }

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Multiply every present update by `r^2 / (sqrt(weighted_sq_norm_grads) + eps)`."""
        self.check_state(state)
        if params is None:
            raise needs_params_error(self.name)
        r2 = jnp.maximum(state["estim_sq_dist"], _sq_distance(params, state["init_params"]))
        weighted = state["weighted_sq_norm_grads"] + r2 * global_sum(updates)
        step = r2 / (jnp.sqrt(weighted) + self.eps)
        new_updates = map_updates(lambda g, _: scaled(g, step), updates, owner=self.name)
        return new_updates, {**state, "estim_sq_dist": r2, "weighted_sq_norm_grads": weighted}


def scale_by_dowg(init_estim_sq_dist: float | None = None, eps: float = 1e-4) -> ScaleByDowg:
    r"""Scale the updates by the DoWG (Distance over Weighted Gradients) step size.

    Over all paths together, with $x_0$ the params at `init`:

    $$\bar r_t^2 = \max\big(\bar r_{t-1}^2,\ \lVert x_t - x_0\rVert^2\big),\qquad
      v_t = v_{t-1} + \bar r_t^2 \lVert g_t\rVert^2,\qquad
      u_t = \frac{\bar r_t^2}{\sqrt{v_t} + \epsilon}\, g_t$$

    with $\bar r_0^2$ = `init_estim_sq_dist` (default `eps`) and $v_0 = 0$.

    Args:
        init_estim_sq_dist: the initial guess of the squared distance to the solution.
        eps: added to the denominator; also the default initial squared distance.

    State:
        `init_params/<path>` (a copy of the parameter made by `init`); global, by name:
        `estim_sq_dist` and `weighted_sq_norm_grads` (float32).

    Examples:
        >>> tx = gradtx.contrib.scale_by_dowg(init_estim_sq_dist=0.25, eps=0.0)
        >>> params = {"w": jnp.zeros(2)}
        >>> u, _ = tx.update({"w": jnp.array([3.0, 4.0])}, tx.init(params), params)
        >>> u["w"]  # r^2 / (r ||g||) * g = r g / ||g||
        Array([0.3, 0.4], dtype=float32)

    References:
        Khaled et al., "DoWG Unleashed: An Efficient Universal Parameter-Free Gradient
        Descent Method", NeurIPS 2023.
    """
    return ScaleByDowg(init_estim_sq_dist, eps)


def _with_decay(weight_decay: Any, mask: Any) -> list[Transformation]:
    return [] if weight_decay is None else [add_decayed_weights(weight_decay, mask)]


def dog(
    learning_rate: ScalarOrSchedule = 1.0,
    init_step: tuple[str, float] = ("heuristic", 1e-6),
    eps: float = 1e-8,
    weight_decay: float | None = None,
    mask: Any = None,
) -> Any:
    r"""DoG: SGD with the Distance-over-Gradients step size.

    `chain(add_decayed_weights(weight_decay, mask)` (only with a `weight_decay`)`,
    scale_by_dog(init_step, eps), scale_by_learning_rate(learning_rate))`:

    $$x_{t+1} = x_t - \gamma_t \frac{\bar r_t}{\sqrt{G_t + \epsilon}}\, g_t$$

    with $\bar r_t$ and $G_t$ as in `scale_by_dog` and $\gamma_t$ the learning rate (1 for
    the method as published, or a schedule).

    Args:
        learning_rate: a multiplier on the DoG step (a number or a schedule).
        init_step: `(kind, value)`, see `scale_by_dog`.
        eps: added to the sum of squared gradient norms.
        weight_decay: an L2 penalty added to the gradient, or `None` for none.
        mask: selector of the paths to decay; default: all.

    State:
        The state of `scale_by_dog`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.contrib.dog()
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.ones(2)})))
        ['init_params/w', 'is_init_step', 'max_dist', 'sum_sq_norm_grads']

    References:
        Ivgi et al., "DoG is SGD's Best Friend: A Parameter-Free Dynamic Step Size
        Schedule", ICML 2023.
    """
    dog_step = scale_by_dog(init_step, eps)
    return descent("dog", learning_rate, *_with_decay(weight_decay, mask), dog_step)


def dowg(
    learning_rate: ScalarOrSchedule = 1.0,
    init_estim_sq_dist: float | None = None,
    eps: float = 1e-4,
    weight_decay: float | None = None,
    mask: Any = None,
) -> Any:
    r"""DoWG: SGD with the Distance-over-Weighted-Gradients step size.

    `chain(add_decayed_weights(weight_decay, mask)` (only with a `weight_decay`)`,
    scale_by_dowg(init_estim_sq_dist, eps), scale_by_learning_rate(learning_rate))`:

    $$x_{t+1} = x_t - \gamma_t \frac{\bar r_t^2}{\sqrt{v_t} + \epsilon}\, g_t$$

    with $\bar r_t^2$ and $v_t$ as in `scale_by_dowg`.

    Args:
        learning_rate: a multiplier on the DoWG step (a number or a schedule).
        init_estim_sq_dist: the initial guess of the squared distance to the solution.
        eps: added to the denominator; also the default initial squared distance.
        weight_decay: an L2 penalty added to the gradient, or `None` for none.
        mask: selector of the paths to decay; default: all.

    Examples:
        >>> tx = gradtx.contrib.dowg()
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.ones(2)})))
        ['estim_sq_dist', 'init_params/w', 'weighted_sq_norm_grads']

    References:
        Khaled et al., "DoWG Unleashed: An Efficient Universal Parameter-Free Gradient
        Descent Method", NeurIPS 2023.
    """
    dowg_step = scale_by_dowg(init_estim_sq_dist, eps)
    return descent("dowg", learning_rate, *_with_decay(weight_decay, mask), dowg_step)
