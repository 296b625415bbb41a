"""Running the inner transformation only at the steps a function of the step count picks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gradtx._combinators.wrapper import Wrapper
from gradtx._core.elementwise_steps import trace_once
from gradtx._core.lift import check_state_keys
from gradtx._core.module import field, static
from gradtx._core.protocol import Params, State, Transformation, Updates
from gradtx._core.widening import shaped_like
from gradtx._layouts.step_counts import next_count, split_where_absent
from gradtx._paths.subset import present_paths


def choose(flag: Any, yes: Any, no: Any) -> Any:
    """`yes` where the scalar `flag` holds, else `no`, leaf by leaf (`None` leaves kept)."""
    return jax.tree.map(lambda a, b: jnp.where(flag, a, b), yes, no)


def zeros_unless(flag: Any, tree: Any) -> Any:
    """`tree` where the scalar `flag` holds, else zeros of its shapes and dtypes."""
    return jax.tree.map(lambda x: jnp.where(flag, x, jnp.zeros_like(x)), tree)


def traced_step(
    inner: Transformation, updates: Updates, state: State, params: Params, extra: dict
) -> tuple[Any, tuple[Any, Any, Callable]]:
    """`state` split where `updates` lack paths, and `inner`'s step on it traced once.

    Both branches of a `lax.cond` return the layout a partial update gives the step counts,
    hence the split. What `trace_once` returns comes second (the jaxpr, the output shapes and
    the step replayed), so a combinator that looks at the step, checks it and runs it in a
    branch pays for one trace.
    """
    state = split_where_absent(state, updates)

    def run(inner_state: State) -> tuple[Any, Any]:
        return inner.step(updates, inner_state, params, **extra)

    return state, trace_once(run, state)


def run_or_skip(
    active: Any, traced: tuple[Any, Any, Callable], updates: Updates, state: State, zero: bool
) -> tuple[Any, Any]:
    """The step `traced` (from `traced_step`, with its split `state`) where `active`, else skip.

    A skipped step gives the updates (zeros if `zero`) and `state`. One `lax.cond`, so the
    inner step runs only where it is chosen and writes its state in place; a skipped step's
    updates take the dtypes the inner step's would have (its state may widen them).
    """
    _, shapes, replayed = traced

    def skip(inner_state: State) -> tuple[Any, Any]:
        kept = jax.tree.map(jnp.zeros_like, updates) if zero else updates
        return shaped_like(kept, shapes[0]), inner_state

    return lax.cond(active, replayed, skip, state)


def _check_condition(fn: Any, name: str) -> Any:
    if not callable(fn):
        raise TypeError(f"`{name}` must be a function of the step count, got {fn!r}")
    return fn


class ConditionallyTransform(Wrapper):
    """The inner transformation at the chosen steps, else the updates as they are.

    See `conditionally_transform`.
    """

    name: ClassVar[str] = "conditionally_transform"
    # What the updates become at a skipped step: unchanged here, zeros in ConditionallyMask.
    zero_skipped: ClassVar[bool] = False
    should_transform_fn: Any = field(converter=_check_condition)
    forward_extra_args: bool = static(False)

    def state_keys(self) -> tuple[str, ...]:
        """The call counter `step` and the inner state `inner`."""
        return ("step", "inner")

    def _active(self, step: Any) -> bool | None:
        try:
            value = self.should_transform_fn(jnp.int32(step))
            return bool(np.asarray(value))
        except Exception:  # needs extra arguments, or cannot run on a concrete step
            return None

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """The inner steps at `step` where the condition holds, after this wrapper's entry."""
        active = self._active(step)
        entry = (self.name, {} if active is None else {"active": active})
        inner = self.inner.describe(params, step) if active is not False else {}
        return {path: [entry, *inner.get(path, [])] for path in present_paths(params)}

    def init_state(self, params: Params) -> dict:
        """`step = 0` and the inner state."""
        return {"step": jnp.zeros((), jnp.int32), "inner": self.inner.init_state(params)}

    def _condition(self, step: Any, extra: dict) -> Any:
        kwargs = extra if self.forward_extra_args else {}
        value = jnp.asarray(self.should_transform_fn(step, **kwargs))
        if value.shape != ():
            raise ValueError(
                f"{self.name}: `should_transform_fn` must return one boolean, got an array of "
                f"shape {value.shape}."
            )
        if value.dtype != jnp.bool_:
            value = value != 0
        return value

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """The inner update if `should_transform_fn(step)`, else the skipped-step updates."""
        check_state_keys(self.name, state, self.state_keys())
        active = self._condition(state["step"], extra)
        inner, traced = traced_step(self.inner, updates, state["inner"], params, extra)
        new_updates, inner = run_or_skip(active, traced, updates, inner, self.zero_skipped)
        return new_updates, {"step": next_count(state["step"]), "inner": inner}


class ConditionallyMask(ConditionallyTransform):
    """The inner transformation at the chosen steps, else zero updates.

    See `conditionally_mask`.
    """

    name: ClassVar[str] = "conditionally_mask"
    zero_skipped: ClassVar[bool] = True


def conditionally_transform(
    tx: Any, should_transform_fn: Any, forward_extra_args: bool = False
) -> ConditionallyTransform:
    r"""Apply `tx` only at the calls where `should_transform_fn(step)` is true.

    `step` counts the calls of `update` so far (0 at the first call, an int32 scalar, one
    counter for all paths). Where `should_transform_fn(step)` is true the result is `tx`'s
    update; where it is false the updates pass through unchanged and `tx`'s state does not
    move. The choice is made with `jax.lax.cond`, so `tx` only runs at the chosen steps, also
    under `jit`. See `conditionally_mask` to return zeros instead.

    Args:
        tx: the transformation to apply (optax ones are wrapped).
        should_transform_fn: `step -> bool` (a scalar). A plain function is kept static, so
            pass the same function object to avoid recompiling; a `gradtx` schedule-like
            module keeps its numbers as leaves.
        forward_extra_args: also pass the `update` call's extra keyword arguments:
            `should_transform_fn(step, **extra)`.

    State:
        `step` (int32 scalar, stops at the largest int32) and `inner/...` (the state of `tx`).

    Examples:
        >>> tx = gradtx.conditionally_transform(gradtx.sgd(0.1), lambda step: step >= 1)
        >>> state = tx.init({"w": jnp.zeros(1)})
        >>> u, state = tx.update({"w": jnp.ones(1)}, state)
        >>> u["w"]
        Array([1.], dtype=float32)
        >>> u, state = tx.update({"w": jnp.ones(1)}, state)
        >>> u["w"], int(state["step"])
        (Array([-0.1], dtype=float32), 2)
    """
    return ConditionallyTransform(tx, should_transform_fn, forward_extra_args)


def conditionally_mask(
    tx: Any, should_transform_fn: Any, forward_extra_args: bool = False
) -> ConditionallyMask:
    r"""Apply `tx` only at the calls where `should_transform_fn(step)` is true, else zeros.

    As `conditionally_transform`, except that at the calls where `should_transform_fn(step)`
    is false the updates are zeros (same structure, shapes and dtypes; `None` leaves stay
    `None`), so the parameters do not move; `tx`'s state does not move either.

    Args:
        tx: the transformation to apply (optax ones are wrapped).
        should_transform_fn: `step -> bool` (a scalar), `step` counting the calls so far.
        forward_extra_args: also pass the `update` call's extra keyword arguments:
            `should_transform_fn(step, **extra)`.

    State:
        `step` (int32 scalar) and `inner/...` (the state of `tx`).

    Examples:
        >>> warmup_done = lambda step: step >= 2
        >>> tx = gradtx.conditionally_mask(gradtx.adam(0.1), warmup_done)
        >>> state = tx.init({"w": jnp.zeros(1)})
        >>> for _ in range(3):
        ...     u, state = tx.update({"w": jnp.ones(1)}, state)
        ...     print(u["w"], int(state["inner"]["count"]["w"]))
        [0.] 0
        [0.] 0
        [-0.1] 1
    """
    return ConditionallyMask(tx, should_transform_fn, forward_extra_args)
