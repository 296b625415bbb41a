"""Gradient accumulation: run the inner transformation on the mean of every k gradients."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from gradtx._core.lift import compute_dtype, init_slots, update_slots, zeros_for
from gradtx._core.module import field, static
from gradtx._core.protocol import Transformation, as_transformation, check_state_keys
from gradtx._core.widening import is_narrow
from gradtx._layouts.step_counts import split_where_absent
from gradtx._paths.paths import flatten, is_unit
from gradtx._paths.subset import present_paths

__all__ = ["Accumulate", "accumulate", "multi_steps"]

# `accumulator_dtype="param"`: keep each accumulator in its parameter's own dtype.
PARAM_DTYPE = "param"


def _accumulator_dtype(value: Any, name: str) -> Any:
    if value is None or value == PARAM_DTYPE:
        return value
    try:
        return jnp.dtype(value)
    except TypeError as e:
        raise TypeError(f"`{name}` must be a dtype, None or {PARAM_DTYPE!r}, got {value!r}") from e


def check_count(value: Any, name: str, minimum: int) -> None:
    """Raise unless `value` is a Python int of at least `minimum` (it defines structure)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}")


def _slot_paths(slots: dict[str, Any]) -> set[str]:
    """The parameter paths that hold a slot (the paths inside packed units included)."""
    out: set[str] = set()
    for path, value in slots.items():
        if is_unit(value):
            out.update(value.paths(path))
        else:
            out.add(path)
    return out


class Accumulate(Transformation):
    """Gradient accumulation over `every` calls (see `accumulate`)."""

    name: ClassVar[str] = "accumulate"
    inner: Any = field(converter=as_transformation)
    every: int = static()
    accumulator_dtype: Any = static(None, converter=_accumulator_dtype)

    def __check__(self) -> None:
        check_count(self.every, "accumulate: every", 1)

    def state_keys(self) -> tuple[str, ...]:
        """`micro_step`, the accumulators `acc` and the inner state `inner`."""
        return ("micro_step", "acc", "inner")

    def _dtype_for(self, param: Any) -> Any:
        if self.accumulator_dtype == PARAM_DTYPE:
            return param.dtype
        if self.accumulator_dtype is None:
            return jnp.float32 if is_narrow(param) else param.dtype
        return self.accumulator_dtype

    def frozen_paths(self, params: Any) -> frozenset[str]:
        """The inner transformation's frozen paths."""
        return self.inner.frozen_paths(params)

    def eval_params(self, state: dict, params: Any) -> Any:
        """The inner transformation's eval weights, from its state."""
        check_state_keys(self.name, state, self.state_keys())
        return self.inner.eval_params(state["inner"], params)

    def describe(self, params: Any, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """`accumulate` on every trainable path, then the inner steps at step `step // every`."""
        frozen = self.inner.frozen_paths(params)
        inner = self.inner.describe(params, int(step) // self.every)
        entry = (self.name, {"every": self.every})
        out: dict[str, list] = {}
        for path in present_paths(params):
            steps = [] if path in frozen else [entry]
            steps = steps + list(inner.get(path, []))
            if steps:
                out[path] = steps
        return out

    def init(self, params: Any) -> dict:
        """Zero accumulators for the trainable paths, `micro_step = 0` and the inner state."""
        frozen = self.inner.frozen_paths(params)
        where = None
        if frozen:
            where = {p for p in present_paths(params) if p not in frozen}

        def leaf_init(param: Any) -> dict[str, Any]:
            return {"acc": zeros_for(param, self._dtype_for(param))}

        slots = init_slots(params, leaf_init, ("acc",), where=where)
        return {
            "micro_step": jnp.zeros((), jnp.int32),
            "acc": slots["acc"],
            "inner": self.inner.init(params),
        }

    def update(self, updates: Any, state: dict, params: Any = None, **extra: Any) -> tuple:
        """Add the gradient; on every `every`-th call run the inner step on the mean."""
        check_state_keys(self.name, state, self.state_keys())
        acc_paths = _slot_paths(state["acc"])
        if params is not None:
            self._check_paths(updates, acc_paths, params)

        def add(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            acc = slots["acc"]
            dtype = compute_dtype(g, acc)
            return g, {"acc": acc.astype(dtype) + g.astype(dtype)}

        _, added = update_slots(
            add, updates, {"acc": state["acc"]}, owner=self.name, where=acc_paths
        )
        acc = added["acc"]
        micro_step = state["micro_step"] + jnp.int32(1)
        fire = micro_step >= jnp.int32(self.every)

        def mean(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            total = slots["acc"]
            dtype = compute_dtype(g, total)
            averaged = total.astype(dtype) / jnp.asarray(self.every, dtype)
            return averaged.astype(g.dtype), {"acc": jnp.zeros_like(total)}

        def step(acc: dict, inner_state: Any) -> tuple[Any, dict, Any]:
            # Frozen paths (no accumulator) pass their raw gradient: the inner zeroes them.
            averaged, reset = update_slots(
                mean, updates, {"acc": acc}, owner=self.name, where=acc_paths
            )
            new_updates, new_inner = self.inner.update(averaged, inner_state, params, **extra)
            return new_updates, reset["acc"], new_inner

        def wait(acc: dict, inner_state: Any) -> tuple[Any, dict, Any]:
            return jax.tree.map(jnp.zeros_like, updates), acc, inner_state

        # Both branches return the layout a partial update gives the step counts.
        inner = split_where_absent(state["inner"], updates)
        new_updates, acc, inner_state = lax.cond(fire, step, wait, acc, inner)
        new_state = {
            "micro_step": jnp.where(fire, jnp.int32(0), micro_step),
            "acc": acc,
            "inner": inner_state,
        }
        return new_updates, new_state

    def _check_paths(self, updates: Any, acc_paths: set[str], params: Any) -> None:
        """A present, trainable path must have an accumulator (else the params changed)."""
        frozen = None
        paths, leaves, _ = flatten(updates)
        for path, g in zip(paths, leaves):
            if g is None or path in acc_paths:
                continue
            inside = g.paths(path) if is_unit(g) else [path]
            if all(p in acc_paths for p in inside):
                continue
            if frozen is None:
                frozen = self.inner.frozen_paths(params)
            missing = [p for p in inside if p not in acc_paths and p not in frozen]
            if missing:
                raise KeyError(
                    f"{self.name}: the state has no accumulator for path {missing[0]!r}. The "
                    "params changed since `init`; call `gradtx.reconcile(tx, state, params)` "
                    "to keep the surviving state and initialise the new paths."
                )


def accumulate(tx: Any, every: int, *, accumulator_dtype: Any = None) -> Accumulate:
    r"""Gradient accumulation: apply `tx` once per `every` calls, to the mean gradient.

    With $k$ = `every`, the calls $j = 1, \ldots, k$ of one cycle receive gradients
    $g_1, \ldots, g_k$ (for example from $k$ micro-batches). Calls $1..k-1$ only add
    $g_j$ to an accumulator and return zero updates; call $k$ returns

    $$u = \mathrm{tx}\Big(\frac{1}{k} \sum_{j=1}^{k} g_j\Big)$$

    and resets the accumulators. For a loss that is a mean over examples, $k$ micro-batches
    of size $b$ then give the step of one batch of size $kb$. The inner step runs under
    `jax.lax.cond`, only on the $k$-th call, and its state does not move on the others: its
    step counts and schedules count optimizer steps, not micro-steps.

    Accumulators are kept only for the paths that `tx` trains: `None` leaves of the params and
    the paths of `tx.frozen_paths(params)` (parameters frozen inside `tx`) have none, and a
    frozen path's raw gradient is passed to `tx` (which zeroes it). A `None` gradient leaf adds
    nothing and leaves that path's accumulator and inner state as they are; every present path
    takes its inner step on the $k$-th call. The mean is passed to `tx` in the gradient's dtype.

    Args:
        tx: the transformation to apply to the mean gradient (optax ones are wrapped).
        every: the number of calls $k \ge 1$ per optimizer step.
        accumulator_dtype: dtype of the accumulators. Default: float32 for bfloat16 and
            float16 params (so many low-precision gradients add up without rounding away),
            otherwise the parameter's dtype; `"param"` keeps every parameter's own dtype.

    State:
        `micro_step` (int32 scalar: calls since the last inner step), `acc/<path>` (the sum of
        this cycle's gradients) and `inner/...` (the state of `tx`).

    Examples:
        >>> tx = gradtx.accumulate(gradtx.sgd(1.0), every=2)
        >>> params = {"w": jnp.zeros(2)}
        >>> state = tx.init(params)
        >>> u, state = tx.update({"w": jnp.array([1.0, 2.0])}, state)
        >>> u["w"], int(state["micro_step"])
        (Array([0., 0.], dtype=float32), 1)
        >>> u, state = tx.update({"w": jnp.array([3.0, 4.0])}, state)
        >>> u["w"], int(state["micro_step"])
        (Array([-2., -3.], dtype=float32), 0)
    """
    return Accumulate(tx, every, accumulator_dtype)


def multi_steps(tx: Any, every: int, *, accumulator_dtype: Any = None) -> Accumulate:
    """Another name for `accumulate` (optax calls it `MultiSteps`).

    Args:
        tx: the transformation to apply to the mean gradient.
        every: the number of calls per optimizer step.
        accumulator_dtype: dtype of the accumulators (see `accumulate`).

    Examples:
        >>> tx = gradtx.multi_steps(gradtx.adam(1e-3), every=4)
        >>> sorted(tx.init({"w": jnp.zeros(2)}))
        ['acc', 'inner', 'micro_step']
    """
    return Accumulate(tx, every, accumulator_dtype)
