"""Gradient accumulation: run the inner transformation on the mean of every k gradients.

`accumulate` takes a fixed k; `multi_steps` (optax's `MultiSteps`) also takes k as a schedule
of the optimizer step and a predicate that skips micro-steps (`gradtx.skip_not_finite`,
`gradtx.skip_large_updates`); `has_updated` says whether a call took the inner step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gradtx._combinators.conditional import choose, zeros_unless
from gradtx._combinators.wrapper import Wrapper
from gradtx._core.elementwise_steps import is_elementwise, keeps_no_arrays, trace_once
from gradtx._core.lift import check_state_keys, compute_dtype, init_slots, update_slots, zeros_for
from gradtx._core.module import Module, field, static
from gradtx._core.protocol import Params, State, Updates, merge_descriptions
from gradtx._core.widening import is_narrow, shaped_like
from gradtx._layouts.step_counts import next_count, split_where_absent
from gradtx._paths.subset import present_paths

# `accumulator_dtype="param"`: keep each accumulator in its parameter's own dtype.
PARAM_DTYPE = "param"

# `describe` counts the cycles of a scheduled k one by one up to this many calls.
_DESCRIBE_LIMIT = 100_000


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


def check_flag(value: Any, name: str, owner: str) -> None:
    """Raise unless `value` (the argument `name` of `owner`) is True or False."""
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: `{name}` must be True or False, got {value!r}")


def _k_at(schedule: Any, gradient_step: Any) -> jax.Array:
    """The number of calls per optimizer step that `schedule` gives: an int32 of at least 1."""
    k = jnp.asarray(schedule(gradient_step))
    if jnp.issubdtype(k.dtype, jnp.floating):
        k = jnp.round(k)
    return jnp.maximum(k.astype(jnp.int32), jnp.int32(1))


class Accumulate(Wrapper):
    """Gradient accumulation over `every` calls (see `accumulate` and `multi_steps`)."""

    name: ClassVar[str] = "accumulate"
    every: Any = static()
    accumulator_dtype: Any = static(None, converter=_accumulator_dtype)
    # k as a function of the optimizer step (a schedule pytree, or a plain function kept
    # static); `every` is None then.
    every_k_schedule: Any = field(default=None)
    should_skip_update_fn: Any = static(None)
    use_grad_mean: bool = static(True)

    def __check__(self) -> None:
        if self.every_k_schedule is None:
            check_count(self.every, "accumulate: every", 1)
        elif self.every is not None:
            raise ValueError("accumulate: give `every` or `every_k_schedule`, not both.")
        elif not callable(self.every_k_schedule):
            raise TypeError(
                "multi_steps: `every_k_schedule` must be an int or a function of the optimizer "
                f"step (a schedule), got {self.every_k_schedule!r}"
            )
        fn = self.should_skip_update_fn
        if fn is not None and not callable(fn):
            raise TypeError(
                "multi_steps: `should_skip_update_fn` must be a function "
                f"`(updates, gradient_step, params) -> (bool, dict)` or None, got {fn!r}"
            )
        check_flag(self.use_grad_mean, "use_grad_mean", "multi_steps")

    @property
    def counts_steps(self) -> bool:
        """Whether the state keeps `gradient_step` (a scheduled k or a skip predicate)."""
        return self.every_k_schedule is not None or self.should_skip_update_fn is not None

    def state_keys(self) -> tuple[str, ...]:
        """`micro_step`, `acc` and `inner`; `gradient_step` and `skip_state` as needed.

        `gradient_step` is kept with a scheduled k or a skip predicate, `skip_state` with a
        skip predicate.
        """
        keys = ("micro_step", "acc", "inner")
        if self.counts_steps:
            keys += ("gradient_step",)
        if self.should_skip_update_fn is not None:
            keys += ("skip_state",)
        return keys

    def _dtype_for(self, param: Any) -> Any:
        if self.accumulator_dtype == PARAM_DTYPE:
            return param.dtype
        if self.accumulator_dtype is None:
            return jnp.float32 if is_narrow(param) else param.dtype
        return self.accumulator_dtype

    def _cycles(self, calls: int) -> tuple[int, int]:
        """`(optimizer steps completed, k in force)` after `calls` calls without skips."""
        if self.every_k_schedule is None:
            return calls // self.every, self.every
        done = 0
        k = int(_k_at(self.every_k_schedule, np.int32(0)))
        while calls >= k and done < _DESCRIBE_LIMIT:
            calls -= k
            done += 1
            k = int(_k_at(self.every_k_schedule, np.int32(done)))
        return done, k

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """`accumulate` on every trainable path, then the inner steps.

        The inner steps are described at the optimizer step that `step` calls reach
        (`step // every` for a fixed k).
        """
        frozen = self.inner.frozen_paths(params)
        inner_step, k = self._cycles(int(step))
        entry = (self.name, {"every": k})
        own = {path: [entry] for path in present_paths(params) if path not in frozen}
        return merge_descriptions(own, self.inner.describe(params, inner_step))

    def init_state(self, params: Params) -> dict:
        """Zero accumulators for the trainable paths, `micro_step = 0` and the inner state."""
        frozen = self.inner.frozen_paths(params)
        where = {p for p in present_paths(params) if p not in frozen} if frozen else None

        def leaf_init(param: Any) -> dict[str, Any]:
            return {"acc": zeros_for(param, self._dtype_for(param))}

        slots = init_slots(params, leaf_init, ("acc",), where=where)
        state = {
            "micro_step": jnp.zeros((), jnp.int32),
            "acc": slots["acc"],
            "inner": self.inner.init_state(params),
        }
        if self.counts_steps:
            state["gradient_step"] = jnp.zeros((), jnp.int32)
        if self.should_skip_update_fn is not None:
            state["skip_state"] = self._initial_skip_state(params)
        return state

    def _initial_skip_state(self, params: Params) -> Any:
        """Zeros shaped like the predicate's auxiliary output for zero updates."""
        step = jax.ShapeDtypeStruct((), jnp.int32)  # the params stand in for the updates
        skip, aux = jax.eval_shape(self.should_skip_update_fn, params, step, params)
        self._check_skip(skip)
        return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), aux)

    def _check_skip(self, skip: Any) -> None:
        dtype, shape = getattr(skip, "dtype", None), getattr(skip, "shape", None)
        if dtype != jnp.bool_ or shape != ():
            raise ValueError(
                "multi_steps: `should_skip_update_fn` must return `(should_skip, aux)` with "
                f"`should_skip` a bool scalar array, got dtype {dtype} and shape {shape}."
            )

    def _skip(self, updates: Updates, state: dict, params: Params) -> tuple[jax.Array, Any]:
        """The predicate's verdict on `updates`, and its auxiliary output in the old dtypes."""
        skip, aux = self.should_skip_update_fn(updates, state["gradient_step"], params)
        skip = jnp.asarray(skip)
        self._check_skip(skip)
        old = state["skip_state"]
        if jax.tree.structure(aux) != jax.tree.structure(old):
            raise ValueError(
                "multi_steps: `should_skip_update_fn` returned auxiliary output shaped "
                f"{jax.tree.structure(aux)}, but at `init` it was {jax.tree.structure(old)}."
            )
        aux = jax.tree.map(lambda new, x: jnp.asarray(new).astype(x.dtype), aux, old)
        return skip, aux

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Add the gradient; on the k-th call of a cycle run the inner step on the mean.

        A call that the skip predicate rejects changes nothing but `skip_state`.
        """
        check_state_keys(self.name, state, self.state_keys())
        acc_paths = set(present_paths(state["acc"]))
        if params is not None:
            self._check_paths(updates, acc_paths, params)
        skip = aux = None
        if self.should_skip_update_fn is not None:
            skip, aux = self._skip(updates, state, params)

        def summed(keep: Any = None) -> dict:
            """The accumulators plus this call's gradient; zeros where `keep` is false."""

            def add(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
                acc = slots["acc"]
                dtype = compute_dtype(g, acc)
                total = acc.astype(dtype) + g.astype(dtype)
                if skip is not None:  # a rejected micro-step adds nothing (not even its NaNs)
                    total = jnp.where(skip, acc.astype(dtype), total)
                if keep is not None:
                    total = jnp.where(keep, total, jnp.zeros_like(total))
                return g, {"acc": total}

            acc = {"acc": state["acc"]}
            # Only the new sums are used: the passed-through gradients must not count as
            # updates that read the accumulators (which would widen them in a chain).
            return update_slots(
                add, updates, acc, owner=self.name, where=acc_paths, element_slots=()
            )[1]

        taken = jnp.int32(1) if skip is None else jnp.where(skip, jnp.int32(0), jnp.int32(1))
        micro_step = state["micro_step"] + taken
        fixed = self.every_k_schedule is None
        k = jnp.int32(self.every) if fixed else _k_at(self.every_k_schedule, state["gradient_step"])
        fire = micro_step >= k
        if skip is not None:
            fire = fire & jnp.logical_not(skip)

        def mean(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            total = slots["acc"]
            dtype = compute_dtype(g, total)
            averaged = total.astype(dtype)
            if self.use_grad_mean:
                # with a scheduled k, the calls this cycle accumulated (k, as it fires)
                count = jnp.asarray(self.every, dtype) if fixed else micro_step.astype(dtype)
                averaged = averaged / count
            # Rounded once to the gradient's dtype: the inner step sees a gradient like the
            # ones it would be given without accumulation, so its updates have their dtype.
            return averaged.astype(g.dtype), {}

        # The accumulators are summed and reset outside the cond, so that XLA writes them in
        # place: returned by a branch, they would be copied on every call. The cond says
        # whether to keep the sum, so that the reset reads the old accumulators after it.
        def step(inner_state: State) -> tuple[Any, Any, Any]:
            # Frozen paths (no accumulator) pass their raw gradient: the inner zeroes them.
            averaged, _ = update_slots(
                mean, updates, summed(), owner=self.name, where=acc_paths, element_slots=()
            )
            new_updates, new_inner = self.inner.step(averaged, inner_state, params, **extra)
            return new_updates, new_inner, jnp.bool_(False)

        # Both branches return the layout a partial update gives the step counts.
        inner = split_where_absent(state["inner"], updates)
        traced, shapes, replayed = trace_once(step, inner)
        stepped = shapes[0]  # the update dtypes (state may widen)

        def wait(inner_state: State) -> tuple[Any, Any, Any]:
            # The gradients stand in for the updates, which are zeroed after the cond: zeros
            # made in the branch were one more kernel per leaf to compile
            # (benchmarks/combinators.py).
            return shaped_like(updates, stepped), inner_state, jnp.bool_(True)

        if keeps_no_arrays(inner) and is_elementwise(traced):
            # A step as cheap as plain SGD runs on every call and is selected: XLA fuses it
            # with the sum and the apply, where a cond adds kernels and a pass over memory.
            both = zip(replayed(inner), wait(inner))
            new_updates, inner_state, keep = (choose(fire, a, b) for a, b in both)
        else:
            new_updates, inner_state, keep = lax.cond(fire, replayed, wait, inner)
        new_updates = zeros_unless(jnp.logical_not(keep), new_updates)
        new_state = {
            "micro_step": jnp.where(fire, jnp.int32(0), micro_step),
            "acc": summed(keep)["acc"],
            "inner": inner_state,
        }
        if self.counts_steps:
            old = state["gradient_step"]
            new_state["gradient_step"] = jnp.where(fire, next_count(old), old)
        if aux is not None:
            new_state["skip_state"] = aux
        return new_updates, new_state

    def _check_paths(self, updates: Updates, acc_paths: set[str], params: Params) -> None:
        """A present, trainable path must have an accumulator (else the params changed)."""
        missing = [p for p in present_paths(updates) if p not in acc_paths]
        if missing:  # the frozen paths are asked for only then
            frozen = self.inner.frozen_paths(params)
            missing = [p for p in missing if p not in frozen]
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
    step counts and schedules count optimizer steps, not micro-steps. An inner step that
    only does elementwise math and keeps no per-element state (plain SGD, a scale, a
    schedule) is instead computed on every call and its results selected, which XLA fuses
    with the sum and the apply; the updates and states are the same as under the cond.

    Accumulators are kept only for the paths that `tx` trains: `None` leaves of the params and
    the paths of `tx.frozen_paths(params)` (parameters frozen inside `tx`) have none, and a
    frozen path's raw gradient is passed to `tx` (which zeroes it). A `None` gradient leaf adds
    nothing and leaves that path's accumulator and inner state as they are; every present path
    takes its inner step on the $k$-th call. The mean, summed in the accumulators' dtype, is
    rounded once to the gradient's dtype and passed to `tx`, so the updates (and the zeros of
    the other calls) have the dtype that `tx` gives them without accumulation: bfloat16 for
    `adam` on bfloat16 params, float32 with float32 moments.

    `multi_steps` is the same with optax's options: $k$ as a schedule of the optimizer step,
    a predicate that skips micro-steps, and the sum instead of the mean.

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


ShouldSkipUpdateFn = Callable[[Any, Any, Any], tuple[Any, Any]]


def multi_steps(
    tx: Any,
    every_k_schedule: int | Module | Callable[[Any], Any] | None = None,
    *,
    use_grad_mean: bool = True,
    should_skip_update_fn: ShouldSkipUpdateFn | None = None,
    accumulator_dtype: Any = None,
    every: int | None = None,
) -> Accumulate:
    r"""Gradient accumulation with optax's `MultiSteps` options (see `accumulate`).

    Each call adds its gradient to an accumulator and returns zero updates, until the
    $k$-th accepted call of the cycle, which runs `tx` on the mean (or, with
    `use_grad_mean=False`, the sum) of the cycle's gradients and returns its updates. $k$ is
    `every_k_schedule`: an int, or a function of the optimizer step $t$ (the number of inner
    steps taken so far), so the effective batch size can change over training,
    $k_t = \mathrm{every\_k\_schedule}(t)$, rounded to the nearest integer and at least 1.

    `should_skip_update_fn(updates, gradient_step, params) -> (should_skip, aux)` is asked
    about every call's gradient before it is added: where `should_skip` (a bool scalar) is
    true, the call is as if it never happened (accumulators, `micro_step`, `gradient_step` and
    the inner state are kept; the updates are zeros) and only `aux`, a dict of arrays, is
    stored, as `skip_state`, for monitoring. `gradtx.skip_not_finite` and
    `gradtx.skip_large_updates` are such predicates. A plain function is static structure: pass
    the same object (a module-level function, or one `functools.partial` kept in a variable)
    to reuse a compiled step; a gradtx schedule as `every_k_schedule` is a pytree whose numbers
    are leaves.

    `gradtx.has_updated(state)` says whether the call that returned `state` took the inner
    step, as optax's `MultiSteps.has_updated`.

    Args:
        tx: the transformation to apply to the accumulated gradient (optax ones are wrapped).
        every_k_schedule: the number of calls per optimizer step: an int $\ge 1$, or a
            schedule or function of the optimizer step (an int32 scalar) returning it.
        use_grad_mean: pass `tx` the mean of the cycle's gradients (default) or their sum.
        should_skip_update_fn: None, or a predicate as above that rejects micro-steps.
        accumulator_dtype: dtype of the accumulators (see `accumulate`).
        every: gradtx's name for an int `every_k_schedule` (as in `accumulate`); give one of
            the two.

    State:
        As `accumulate`'s: `micro_step`, `acc/<path>` and `inner/...`. With a scheduled
        $k$ or a skip predicate also `gradient_step` (int32 scalar: the inner steps taken),
        and with a skip predicate `skip_state/...` (the predicate's last `aux`).

    Examples:
        >>> tx = gradtx.multi_steps(
        ...     gradtx.sgd(1.0),
        ...     every_k_schedule=lambda step: jnp.where(step < 1, 1, 2),
        ...     should_skip_update_fn=gradtx.skip_not_finite,
        ... )
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> for g in ([4.0, 4.0], [float("nan"), 0.0], [1.0, 2.0], [3.0, 4.0]):
        ...     u, state = tx.update({"w": jnp.array(g)}, state)
        ...     print(u["w"], bool(gradtx.has_updated(state)), int(state["gradient_step"]))
        [-4. -4.] True 1
        [0. 0.] True 1
        [0. 0.] False 1
        [-2. -3.] True 2
        >>> int(state["skip_state"]["num_not_finite"])
        0
    """
    if every is not None and every_k_schedule is not None:
        raise TypeError("multi_steps: give `every_k_schedule` or `every`, not both.")
    k = every if every_k_schedule is None else every_k_schedule
    if k is None:
        raise TypeError("multi_steps: missing `every_k_schedule` (an int or a schedule).")
    if callable(k):
        return Accumulate(tx, None, accumulator_dtype, k, should_skip_update_fn, use_grad_mean)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        name = "every" if every_k_schedule is None else "every_k_schedule"
        raise ValueError(f"multi_steps: `{name}` must be an integer >= 1 or a schedule, got {k!r}")
    return Accumulate(tx, int(k), accumulator_dtype, None, should_skip_update_fn, use_grad_mean)


def has_updated(state: State) -> jax.Array:
    """Whether the `accumulate` / `multi_steps` call that returned `state` took the inner step.

    True when `micro_step` is back at 0 and, where the state keeps `gradient_step` (a
    scheduled k or a skip predicate), at least one inner step has been taken: optax's
    `MultiSteps.has_updated`. As there, a skipped micro-step right after an inner step keeps
    it true. A fixed-k state without a skip predicate keeps no `gradient_step`, so for the
    state that `init` returns (before any call) it is true as well.

    Args:
        state: the state of an `accumulate` or `multi_steps` transformation (inside a chain,
            its entry, e.g. `state["accumulate"]`).

    Returns:
        A bool scalar array (works under `jit`).

    Examples:
        >>> tx = gradtx.multi_steps(gradtx.sgd(0.1), every_k_schedule=2)
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> _, state = tx.update({"w": jnp.ones(2)}, state)
        >>> bool(gradtx.has_updated(state))
        False
        >>> _, state = tx.update({"w": jnp.ones(2)}, state)
        >>> bool(gradtx.has_updated(state))
        True
    """
    if not isinstance(state, Mapping) or "micro_step" not in state:
        found = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise KeyError(
            "has_updated: expected the state of `accumulate` or `multi_steps` (a dict with "
            f"'micro_step'), got {found}. Inside a chain, pass that step's entry, for example "
            "`state['accumulate']`."
        )
    done = jnp.asarray(state["micro_step"]) == 0
    if "gradient_step" in state:
        done = done & (jnp.asarray(state["gradient_step"]) > 0)
    return done
