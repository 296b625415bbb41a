"""Skipping steps whose gradient or update is not finite (NaN or infinity)."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from gradtx._combinators.accumulate import check_count, check_flag
from gradtx._combinators.conditional import choose, run_or_skip, traced_step, zeros_unless
from gradtx._combinators.wrapper import Wrapper
from gradtx._core.elementwise_steps import is_elementwise
from gradtx._core.lift import check_state_keys
from gradtx._core.module import static
from gradtx._core.protocol import Params, Updates
from gradtx._core.statistics import statistics
from gradtx._core.widening import promoted
from gradtx._layouts.packed import LARGE_LEAF
from gradtx._layouts.step_counts import next_count
from gradtx._paths.subset import present_paths


def all_finite(tree: Any) -> jax.Array:
    """True if every element of every array leaf of `tree` is finite (`None` leaves skipped)."""
    result = jnp.ones((), jnp.bool_)
    for leaf in jax.tree.leaves(tree):
        if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
            # x * 0 is 0, or NaN where x is not finite: one sum, which XLA computes as it
            # reads x. `all(isfinite(x))` wrote a boolean array and reduced it in five more
            # kernels (benchmarks/combinators.py).
            result = result & jnp.isfinite(jnp.sum(leaf * 0))
    return result


# A leaf of `LARGE_LEAF` elements or more is bound by memory, a smaller one by its kernels.
# An elementwise step's updates, computed once more for the check, are:
# - on a large leaf, checked through a byte mask as XLA computes them, and computed again
#   in the branch: XLA's CPU compiler splits the mask's kernel across the cores and reduces
#   the bytes vectorised, where a sum of the computed values ran on one core, so the mask
#   checks faster (benchmarks/combinators.py);
# - on a small leaf, written once, summed for the check and taken as the step's updates,
#   so that the branch computes the state alone: one kernel with the step's math per leaf
#   instead of two (benchmarks/combinators.py). A mask there cost a second kernel per leaf
#   to compile.


@jax.jit
def _leaf_finite(g: jax.Array, u: jax.Array) -> jax.Array:
    """Whether `g * 0 + u * 0` (0, or NaN where either is not finite) is finite throughout.

    Jitted, so that it is traced and lowered once per leaf signature rather than once per
    leaf, as the per-array math of a transformation is; XLA inlines it before fusing, so
    the compiled program is the same.
    """
    dtype = promoted(g.dtype, u.dtype)
    zero = g.astype(dtype) * 0 + u.astype(dtype) * 0  # one mask of it checks both
    if zero.size < LARGE_LEAF:
        return jnp.isfinite(jnp.sum(zero))
    return jnp.max(jnp.logical_not(jnp.isfinite(zero)).astype(jnp.uint8)) == 0


def _check_computed(updates: Updates, checked: Any) -> jax.Array:
    """Whether the gradients and an elementwise step's updates computed from them are finite.

    `updates` and `checked` have one structure; their `None` leaves are skipped.
    """
    flags = jax.tree.leaves(jax.tree.map(_leaf_finite, updates, checked))
    return functools.reduce(lax.bitwise_and, flags, jnp.ones((), jnp.bool_))


def _taken_from_check(accept: Any, checked: Any, ran: Any) -> Any:
    """A leaf's updates: on a small leaf those computed for the check, else the branch's."""
    return zeros_unless(accept, checked) if checked.size < LARGE_LEAF else ran


class ApplyIfFinite(Wrapper):
    """Skip a step whose gradient or update is not finite (see `apply_if_finite`)."""

    name: ClassVar[str] = "apply_if_finite"
    max_consecutive_errors: int = static()
    check_updates: bool = static(True)

    def __check__(self) -> None:
        check_count(self.max_consecutive_errors, "apply_if_finite: max_consecutive_errors", 0)
        check_flag(self.check_updates, "check_updates", "apply_if_finite")

    def state_keys(self) -> tuple[str, ...]:
        """The inner state and the statistics of non-finite steps."""
        return ("inner", "notfinite_count", "total_notfinite", "last_finite")

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """This wrapper's entry, then the inner steps, for every present path."""
        entry = (
            self.name,
            {
                "max_consecutive_errors": self.max_consecutive_errors,
                "check_updates": self.check_updates,
            },
        )
        inner = self.inner.describe(params, step)
        return {path: [entry, *inner.get(path, [])] for path in present_paths(params)}

    def init_state(self, params: Params) -> dict:
        """The inner state, zero counts and `last_finite = True`."""
        return statistics(
            inner=self.inner.init_state(params),
            notfinite_count=jnp.zeros((), jnp.int32),
            total_notfinite=jnp.zeros((), jnp.int32),
            last_finite=jnp.ones((), jnp.bool_),
        )

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Run the inner step; keep its result only if it is finite (or too many were not)."""
        check_state_keys(self.name, state, self.state_keys())
        # Traced once and replayed wherever it runs: traced four times, the inner step took
        # most of the time spent building the wrapper's step on many leaves.
        old_inner, traced = traced_step(self.inner, updates, state["inner"], params, extra)
        jaxpr, _, replayed = traced
        if not self.check_updates or is_elementwise(jaxpr):
            # The verdict comes before the inner step, which a `cond` runs or skips: its new
            # state is written in place, as without the wrapper, and nothing is kept aside.
            # To check its updates too, an elementwise step is computed once more, for the
            # check (a large leaf's updates are computed again in the branch, a small
            # leaf's are taken from the check: see the note on `_leaf_finite`).
            if self.check_updates:
                checked = replayed(old_inner)[0]
                finite = _check_computed(updates, checked)
            else:
                finite = all_finite(updates)
            count, accept = self._verdict(finite, state)
            new_updates, inner = run_or_skip(accept, traced, updates, old_inner, zero=True)
            if self.check_updates:
                new_updates = jax.tree.map(
                    lambda c, r: _taken_from_check(accept, c, r), checked, new_updates
                )
        else:
            # Any other step runs once; its new state and updates are kept aside until the
            # check, then chosen against the old ones.
            new_updates, new_inner = replayed(old_inner)
            finite = all_finite(updates) & all_finite(new_updates)
            count, accept = self._verdict(finite, state)
            new_updates = zeros_unless(accept, new_updates)
            inner = choose(accept, new_inner, old_inner)
        total = jnp.where(finite, state["total_notfinite"], next_count(state["total_notfinite"]))
        return new_updates, statistics(
            inner=inner, notfinite_count=count, total_notfinite=total, last_finite=finite
        )

    def _verdict(self, finite: Any, state: dict) -> tuple[Any, Any]:
        """The run of non-finite steps after this one, and whether to take this step."""
        count = jnp.where(finite, jnp.int32(0), next_count(state["notfinite_count"]))
        return count, finite | (count > jnp.int32(self.max_consecutive_errors))


def apply_if_finite(
    tx: Any, max_consecutive_errors: int, check_updates: bool = True
) -> ApplyIfFinite:
    r"""Skip the steps whose gradient or update holds a NaN or an infinity.

    Each call runs `tx`. If every element of the incoming gradients and of `tx`'s output
    updates is finite, the step is taken as usual. Otherwise the output updates are zeros and
    `tx`'s whole state is kept exactly as it was (step counts and schedule counts included),
    as if that batch had never been seen; the choice is made on device, with no host
    synchronisation. Once `max_consecutive_errors` steps in a row have been skipped, the
    next non-finite step is applied as it is (optax's `apply_if_finite` rule), so a run that
    has truly diverged does not silently stall.

    Checking the updates as well catches a step that overflows inside `tx` (a second moment
    that reaches infinity) from finite gradients. An elementwise `tx` (Adam, SGD, Lion: no
    reduction or loop over an array) has its updates computed for the check, before a
    `jax.lax.cond` runs it, writing its state in place; a leaf of fewer than 65536 elements
    takes those updates, a larger one has them computed again in the branch
    (benchmarks/combinators.py). Any other `tx` keeps its new state and updates aside until
    the check, which then chooses them or the old ones, one more pass over the state. With
    `check_updates=False` only the gradients are checked, as optax does: they decide before
    `tx` runs, which a `jax.lax.cond` then runs or skips, writing its state in place
    (benchmarks/combinators.py).

    Args:
        tx: the transformation to guard (optax ones are wrapped).
        max_consecutive_errors: how many consecutive non-finite steps to skip ($\ge 0$).
        check_updates: also check `tx`'s output updates (default); `False` checks only the
            incoming gradients.

    State:
        `inner/...` (the state of `tx`); the statistics `notfinite_count` (consecutive
        non-finite steps, int32), `total_notfinite` (all non-finite steps so far, int32) and
        `last_finite` (bool: whether the last step was finite).

    Examples:
        >>> tx = gradtx.apply_if_finite(gradtx.adam(0.1), max_consecutive_errors=3)
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> u, state = tx.update({"w": jnp.array([1.0, jnp.nan])}, state)
        >>> u["w"], int(state["inner"]["count"]["w"]), int(state["total_notfinite"])
        (Array([0., 0.], dtype=float32), 0, 1)
        >>> u, state = tx.update({"w": jnp.array([1.0, 1.0])}, state)
        >>> u["w"], bool(state["last_finite"]), int(state["notfinite_count"])
        (Array([-0.1, -0.1], dtype=float32), True, 0)
    """
    return ApplyIfFinite(tx, max_consecutive_errors, check_updates)
