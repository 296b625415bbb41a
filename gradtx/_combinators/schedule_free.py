"""Schedule-Free learning (Defazio et al., 2024): interpolation and averaging, no decay needed."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from gradtx._core.lift import (
    as_stored,
    check_state_keys,
    compute_dtype,
    dtype_or_none,
    init_slots,
    update_slots,
    zeros_for,
)
from gradtx._core.module import field, hyperparam, static
from gradtx._core.per_array import hyperparam_at
from gradtx._core.protocol import Params, Transformation, Updates, own_hyperparams
from gradtx._layouts.step_counts import aligned, next_count
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.subset import present_paths
from gradtx._transforms.scale import ScalarOrSchedule


def own_copy(param: Any, dtype: Any = None) -> jax.Array:
    """`param` in `dtype` (default: its own) in a buffer of its own.

    The copy lets a jitted step donate both the params and the state. A
    `jax.ShapeDtypeStruct` has no values and gives zeros, to restore a checkpoint into.
    """
    if isinstance(param, jax.ShapeDtypeStruct):
        return zeros_for(param, dtype)
    return jnp.array(param, dtype=param.dtype if dtype is None else dtype, copy=True)


def check_number(value: Any, name: str, owner: str) -> None:
    """Raise unless `value` is a number (a schedule has no meaning there).

    `value` has been through `as_float`: a NumPy float32 scalar or a JAX array.
    """
    if not isinstance(value, (jax.Array, np.generic)):
        raise TypeError(
            f"{owner}: `{name}` must be a number, got {type(value).__name__}: {value!r}; "
            "to schedule it, use `gradtx.inject_hyperparams`."
        )


# Per path: the sequence z, the sum of the averaging weights, the largest rate so far and the
# step count. Kept per path like every slot, a path without a gradient keeps all four. The
# three scalars change only with the count, so like it they are stored once per group of
# paths that step together (`StepCounts`): on a tree of 150 leaves, per-path scalars were
# 300 more arrays in and out of a step and a scalar kernel per leaf, where optax has one.
_SLOTS = ("z", "weight_sum", "max_lr", "count")
_SHARED = ("weight_sum", "max_lr", "count")


class ScheduleFree(Transformation):
    """A base optimizer made schedule-free (see `schedule_free`)."""

    base: Any = field(converter=as_transformation)
    learning_rate: Any = hyperparam(required=True)
    b1: Any = hyperparam(0.9)
    weight_lr_power: Any = hyperparam(2.0)
    state_dtype: Any = static(None, converter=dtype_or_none)
    label: str = static("schedule_free")

    @property
    def name(self) -> str:  # type: ignore[override]
        """The key of this step's state inside a chain."""
        return self.label

    def __check__(self) -> None:
        check_number(self.b1, "b1", self.label)
        b1 = None if isinstance(self.b1, Tracer) or np.ndim(self.b1) else float(self.b1)
        if b1 is not None and not 0.0 < b1 <= 1.0:
            raise ValueError(
                f"{self.label}: `b1` must be in (0, 1], got {b1:g}; the averaged weights are "
                "recovered from the params by dividing by `b1`."
            )
        check_number(self.weight_lr_power, "weight_lr_power", self.label)

    def state_keys(self) -> tuple[str, ...]:
        """The base state, the sequence `z`, and the scalars of the averaging weights."""
        return ("base", "z", "weight_sum", "max_lr", "count")

    def frozen_paths(self, params: Params) -> frozenset[str]:
        """The base optimizer's frozen paths: their `z` stays at the params, so `x` does too."""
        return self.base.frozen_paths(params)

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """The base optimizer's steps, then this one with `b1` and `weight_lr_power`."""
        # The rate is the base optimizer's, shown there: `explain` multiplies the rates it
        # finds along a path.
        shown = own_hyperparams(self, step)
        shown.pop("learning_rate", None)
        entry = (self.name, shown)
        base = self.base.describe(params, step)
        return {path: [*base.get(path, []), entry] for path in present_paths(params)}

    def init_state(self, params: Params) -> dict:
        """The base state; per path, `z` a copy of the param and zero scalars and count."""
        if params is None:
            raise ValueError(f"{self.name}: `init` needs the params, got None.")

        def leaf_init(param: Any) -> dict[str, Any]:
            return {  # every scalar a buffer of its own: params and state may be donated
                "z": own_copy(param, self.state_dtype),
                "weight_sum": jnp.zeros((), jnp.float32),
                "max_lr": jnp.zeros((), jnp.float32),
                "count": jnp.zeros((), jnp.int32),
            }

        slots = init_slots(params, leaf_init, _SLOTS, step_counts=_SHARED)
        return {"base": self.base.init_state(params), **slots}

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Step `z` by the base update; move the params to the new interpolation point."""
        check_state_keys(self.name, state, self.state_keys())
        if params is None:
            raise ValueError(
                f"{self.name} needs the params: call `tx.update(updates, state, params)` with "
                "the params the gradients were taken at."
            )
        base_updates, base_state = self.base.step(updates, state["base"], params, **extra)
        weights = _GroupWeights(self.learning_rate, self.weight_lr_power)
        b1 = self.b1

        def step(u: Any, slots: dict, y: Any) -> tuple[Any, dict]:
            count, max_lr, weight_sum, c = weights(slots)
            dtype = compute_dtype(u, y, slots["z"])
            z, du, yy = slots["z"].astype(dtype), u.astype(dtype), y.astype(dtype)
            ck, beta = c.astype(dtype), b1.astype(dtype)
            # y' - y with x eliminated: x' = (1-c) x + c z', y' = b1 x' + (1-b1) z' and
            # x = (y - (1-b1) z) / b1 give c (z' - y) + (1-b1) (1-c) u. Written with the new
            # z, the update does not read the old one, so XLA's CPU compiler (one output per
            # kernel) writes z' and then the params in place. Read from the old z as well, as
            # optax's is, the update is a difference of large terms, and XLA copies z to keep
            # it for the params (one more param's worth of memory; on 2000 packed leaves one
            # kernel fewer, the copy instead). The params are as precise either way
            # (tests/combinators/test_schedule_free.py); the update may lose u's last bits.
            # z' as stored (`as_stored`): the update reads the new z as the state keeps it,
            # so with bfloat16 params it does not recompute z' from the old z, which a donated
            # step would then copy; and the params stay in step with the z that is kept.
            new_z = as_stored(z + du, slots["z"])
            out = ck * (new_z - yy) + ((1 - beta) * (1 - ck)) * du
            new = {"z": new_z, "weight_sum": weight_sum, "max_lr": max_lr}
            return out, {**new, "count": count}

        # The lifting helper keeps one value per group of the scalars `step` returns
        # (`shared_values`).
        new_updates, slots = update_slots(
            step,
            base_updates,
            aligned({name: state[name] for name in _SLOTS}),
            params,
            owner=self.name,
            needs_params=True,
            element_slots=("z",),
            shared_values=_SHARED,
        )
        return new_updates, {"base": base_state, **slots}

    def eval_params(self, state: dict, params: Params) -> Any:
        """The average $x = (y - (1 - b_1) z) / b_1$, from the params $y$ and `z`.

        Args:
            state: this transformation's state after the last update.
            params: the params $y$ after that update was applied.

        Returns:
            A tree shaped like `params`, each leaf in its parameter's dtype.
        """
        check_state_keys(self.name, state, self.state_keys())
        b1 = self.b1

        def average(y: Any, slots: dict, _: Any) -> tuple[Any, dict]:
            dtype = compute_dtype(y, slots["z"])
            yy, z = y.astype(dtype), slots["z"].astype(dtype)
            # x = y + (1 - b1) / b1 (y - z): y itself plus a correction, exact where y = z.
            ratio = ((1 - b1) / b1).astype(dtype)
            return (yy + ratio * (yy - z)).astype(y.dtype), {}

        owner = f"{self.name}.eval_params"
        x, _ = update_slots(average, params, {"z": state["z"]}, owner=owner, element_slots=())
        return x  # in the params' own dtypes


class _GroupWeights:
    """The averaging weight of each group of paths, traced once per group.

    The paths of a group read the same scalar arrays (`StepCounts`), so their identity
    names the group: the schedule and the scalar math are traced once for it instead of
    once per leaf, which shortens tracing and lowering on trees of many leaves
    (benchmarks/compile_time.py).
    """

    def __init__(self, learning_rate: Any, power: Any) -> None:
        self.learning_rate, self.power = learning_rate, power
        self.done: dict[tuple[int, int, int], tuple] = {}

    def __call__(self, slots: dict) -> tuple:
        """`(count, max_lr, weight_sum, c)` after this step, for the group of `slots`."""
        key = (id(slots["count"]), id(slots["max_lr"]), id(slots["weight_sum"]))
        if key not in self.done:  # (the state holds the arrays: their ids stay theirs)
            # Read as the new count less one, so that the donated count has one reader.
            count = next_count(slots["count"])
            rate = jnp.asarray(hyperparam_at(self.learning_rate, count - 1), jnp.float32)
            max_lr = jnp.maximum(slots["max_lr"], rate)
            weight = max_lr**self.power
            weight_sum = slots["weight_sum"] + weight
            # Nothing to average yet (every rate so far 0): keep x. A NaN still propagates.
            empty = weight_sum == 0
            c = jnp.where(empty, jnp.float32(0), weight / jnp.where(empty, 1.0, weight_sum))
            self.done[key] = (count, max_lr, weight_sum, c)
        return self.done[key]


def schedule_free(
    base: Any,
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    weight_lr_power: float = 2.0,
    state_dtype: Any = None,
) -> ScheduleFree:
    r"""Make `base` schedule-free: interpolate and average instead of decaying the rate.

    Schedule-Free learning keeps three sequences per parameter: $z$, stepped by the base
    optimizer; $x$, a weighted average of the $z$ iterates, the weights to evaluate; and
    $y$, the point where gradients are taken, which is what the params hold. At step $t$
    (counted from 1), with the base update $u_t$ computed from the gradient at $y_t$ and
    $\gamma_t$ = `learning_rate` at that step:

    $$z_{t+1} = z_t + u_t,\qquad
      x_{t+1} = (1 - c_{t+1})\,x_t + c_{t+1}\,z_{t+1},\qquad
      y_{t+1} = \beta_1\,x_{t+1} + (1 - \beta_1)\,z_{t+1}$$

    $$c_{t+1} = \frac{\gamma_{\max,t}^{\,p}}{\sum_{i=1}^{t} \gamma_{\max,i}^{\,p}},\qquad
      \gamma_{\max,t} = \max_{i \le t} \gamma_i$$

    with $\beta_1$ = `b1` and $p$ = `weight_lr_power` (the weights of the average grow with
    the rate, so the small steps of a warm-up count little; $p = 0$ gives the plain average).
    The update returned is $y_{t+1} - y_t$, and $x_1 = z_1 = y_1$ are the params at `init`.
    Only $z$ is kept: $x = (y - (1 - \beta_1) z) / \beta_1$ is recovered from the params;
    read it with `gradtx.eval_params(tx, state, params)` to evaluate or save the model.

    Switch off the base optimizer's momentum ($\beta_1$ plays its part): for example
    `schedule_free(gradtx.adam(lr, b1=0.0), lr)`. A warm-up belongs in `learning_rate`, as a
    schedule given to both: `s = gradtx.schedules.warmup_constant(lr / 100, lr, 99)` and
    `schedule_free(gradtx.sgd(s), s)`; no decay is needed. The schedule is called with the
    number of earlier updates (0 at the first), as in every gradtx transformation, so the
    weight of a step uses the rate the base optimizer used at that step.

    The scalars (the weight sum, $\gamma_{\max}$ and the step count) are kept per path, like
    a step count: a path without a gradient at a step (`None`) keeps its `z`, its scalars
    and its params, so alternating updates of two models from one optimizer give what two
    separate optimizers give. Like a step count, each is stored once for the paths that step
    together, so a step passes three scalars whatever the number of leaves. The update is
    computed as $c_{t+1} (z_{t+1} - y_t) + (1 - \beta_1)(1 - c_{t+1})\,u_t$, which needs
    no $x$ (no division by $\beta_1$) and no old $z$. The params after `apply_updates` come
    out as precise as with the update written from the old $z$ (a test measures both against
    a float64 run); read alone, the update may differ from $u_t$ in its last bits at the
    first step, where it is $u_t$ in exact arithmetic. It reads $z_{t+1}$ as the state keeps
    it: with $z$ in bfloat16 (bfloat16 params), the update is the step to a point the
    bfloat16 params can hold, within their spacing of the float32 step, and a donated step
    writes $z$ in place instead of copying it first.

    Args:
        base: the base optimizer, without momentum (gradtx or optax-style); its update is
            the step of $z$.
        learning_rate: the rate $\gamma_t$ the base optimizer uses (a number or a schedule),
            read for the averaging weights.
        b1: the interpolation $\beta_1 \in (0, 1]$ between $x$ and $z$.
        weight_lr_power: the power $p$ of the rate in the averaging weights.
        state_dtype: dtype of `z` (default: the parameter's dtype).

    Returns:
        A transformation whose `update` needs the params, and whose `eval_params` gives $x$.

    State:
        `base/...` (the base optimizer's state), `z/<path>` (a copy of the parameter made by
        `init`, in its own buffer, so a jitted step may donate both params and state;
        `jax.ShapeDtypeStruct` leaves give zeros, to restore a checkpoint into), and the
        scalars `weight_sum/<path>` (float32), `max_lr/<path>` (float32) and `count/<path>`
        (int32).

    Examples:
        >>> tx = gradtx.schedule_free(gradtx.sgd(1.0), 1.0, b1=0.5)
        >>> params = {"w": jnp.zeros(1)}
        >>> state = tx.init(params)
        >>> for g in (1.0, 1.0):
        ...     u, state = tx.update({"w": jnp.array([g])}, state, params)
        ...     params = gradtx.apply_updates(params, u)
        ...     print(params["w"], state["z"]["w"], gradtx.eval_params(tx, state, params)["w"])
        [-1.] [-1.] [-1.]
        [-1.75] [-2.] [-1.5]

    References:
        Defazio, Yang, Mehta, Mishchenko, Khaled & Cutkosky, "The Road Less Scheduled",
        NeurIPS 2024 (arXiv:2405.15682).
    """
    base = as_transformation(base, "schedule_free(base)")
    return ScheduleFree(base, learning_rate, b1, weight_lr_power, state_dtype)
