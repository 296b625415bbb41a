"""Base class of transformations whose math is written for one array."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax.core import Tracer

from gradtx._core.lift import check_state_keys, init_slots, update_slots
from gradtx._core.module import is_schedule
from gradtx._core.protocol import Params, State, Transformation, Updates
from gradtx._layouts.packed import join_path, reject_packed
from gradtx._paths.cache import BoundedCache
from gradtx._paths.paths import flatten, is_unit


@dataclasses.dataclass(frozen=True)
class Float16Check:
    """Slots that float16 cannot hold, which `init` warns about for float16 params.

    Attributes:
        slots: the slot names, e.g. `("nu",)`.
        what: how the warning calls them, e.g. `"the second moment"`.
        dtype_argument: the transformation's argument that sets their dtype (no warning once
            it is set), or `None` when they always take the parameter's dtype.
        why: what goes wrong in float16, for the warning.
    """

    slots: tuple[str, ...]
    what: str
    dtype_argument: str | None
    why: str = "where squared gradients underflow and updates blow up"


def hyperparam_at(value: Any, count: Any) -> Any:
    """A hyperparameter's float32 value at step `count` (schedules and functions are called)."""
    if is_schedule(value):
        return jnp.asarray(value(count), jnp.float32)
    return value


class PerArrayTransform(Transformation):
    """A transformation defined by per-array math; the tree plumbing is shared.

    Subclasses define:
        state_keys() -> names of the per-path slots (e.g. `("mu", "nu", "count")`)
        init_leaf(param) -> {slot: array}
        update_leaf(g, slots, param) -> (update, {slot: new array})
        selected_paths(updates, params) -> set of paths to transform, or None for all
        masked_update_leaf(g, slots, param, selected) -> (update, {slot: new array}): the
            math on a packed buffer of which only the `selected` elements are transformed;
            needed with `selected_paths` unless `per_leaf_structure` (a selection that splits
            a packed buffer is an error without it)

    State: `{slot: {path: array}}`; stateless transformations have `{}`. The slots named in
    `step_count_slots` are `StepCounts` mappings instead, advanced by the lifting helper.

    `update_leaf` must be a pure function of the transformation and its arguments that
    returns arrays: inside a trace, math of more than a few operations is traced once per
    transformation and leaf signature and called for every leaf of that signature.
    """

    needs_params: ClassVar[bool] = False
    # True when the math needs each leaf's own array (per-leaf norms, matrix shapes): packed
    # params are then processed leaf by leaf instead of buffer by buffer.
    per_leaf_structure: ClassVar[bool] = False
    # Slots that count a path's updates: zero at `init_leaf`, one more per `update_leaf`. They
    # are stored as `StepCounts` (one scalar shared by the paths that count alike), and the
    # lifting helper advances them itself.
    step_count_slots: ClassVar[tuple[str, ...]] = ("count", "schedule_count")
    # Slots of squared gradients (second moments, sums of squares): in float16 they underflow,
    # so `init` warns about float16 params that would keep them in float16.
    float16_check: ClassVar[Float16Check | None] = None
    # Why the math cannot run on packed params (per-array state of its own shape, a random
    # stream per path, ...): `init` refuses packed params with this reason. None: it can.
    unpackable: ClassVar[str | None] = None

    def state_keys(self) -> tuple[str, ...]:
        """Names of the per-path slots this transformation keeps."""
        return ()

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Initial slots for one parameter."""
        return {}

    def update_leaf(self, g: Any, slots: dict[str, Any], param: Any) -> tuple[Any, dict]:
        """Per-array math: the new update and the changed slots."""
        raise TypeError(f"{type(self).__name__} does not define update_leaf")

    def selected_paths(self, updates: Updates, params: Params) -> set[str] | None:
        """Paths to transform (others pass through); `None` means every present path."""
        return None

    # `(g, slots, param, selected) -> (update, changed slots)`: `update_leaf` where the bool
    # array `selected` is true, the inputs unchanged elsewhere, on a packed buffer that
    # `selected_paths` splits (see `AddDecayedWeights`, which reads `g` once that way).
    masked_update_leaf: ClassVar[Callable[..., tuple[Any, dict]] | None] = None

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """Every selected path, with this transformation's hyperparameters at `step`."""
        described = super().describe(params, step)
        chosen = self.selected_paths(params, params)
        if chosen is None:
            return described
        return {path: steps for path, steps in described.items() if path in chosen}

    def check_state(self, state: State) -> None:
        """Raise a clear error if `state` was not made by this transformation's `init`."""
        check_state_keys(self.name, state, self.state_keys())

    def slot_keys(self) -> tuple[str, ...]:
        """The per-path slots among `state_keys()` (all of them unless a subclass says)."""
        return self.state_keys()

    def init_state(self, params: Params) -> dict:
        """Slots for every non-`None` leaf of `params`."""
        check_packable(self, params)
        warn_float16_statistics(self, params, self.selected_paths(params, params))
        keys = self.slot_keys()
        counts = [k for k in keys if k in self.step_count_slots]
        return init_slots(params, self.init_leaf, keys, step_counts=counts)

    def step(
        self, updates: Updates, state: dict, params: Params | None = None, **extra: Any
    ) -> tuple[Updates, dict]:
        """Apply `update_leaf` to every path present in `updates`."""
        self.check_state(state)
        return self.transform_slots(updates, state, params)

    def transform_slots(
        self, updates: Updates, slots: dict, params: Params
    ) -> tuple[Updates, dict]:
        """`update_leaf` on every present path, with the per-path `slots` (not checked)."""
        return update_slots(
            traced_once(self),
            updates,
            slots,
            params,
            owner=self.name,
            needs_params=self.needs_params,
            where=self.selected_paths(updates, params),
            per_leaf=self.per_leaf_structure,
            masked_update=self.masked_update_leaf,
        )


def check_packable(tx: PerArrayTransform, params: Params) -> None:
    """Raise if `params` hold packed buffers that `tx` cannot serve (see `unpackable`)."""
    if tx.unpackable is not None:
        reject_packed(params, tx.name, tx.unpackable)


def warn_float16_statistics(tx: Any, params: Params, where: set[str] | None = None) -> None:
    """Warn when float16 params would keep `tx.float16_check`'s slots in float16.

    A squared gradient underflows there: 1e-3 squares to 1e-6, below float16's smallest
    normal number (6e-5), so a second moment rounds towards zero and `g / sqrt(nu)` blows up
    (a 1e-3 gradient gave a -100 update). bfloat16 has float32's range and is not affected.
    No warning once the slots' dtype argument is set (float16 included: that was asked for).

    Args:
        tx: the transformation, whose class sets `float16_check` (`None`: nothing to check).
        params: the params given to `init`.
        where: the paths that keep the slots (`None`: every path).

    Examples:
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     _ = gradtx.scale_by_rss().init({"w": jnp.zeros(2, jnp.float16)})
        >>> "keep the sum of squares `sum_of_squares` in float16" in str(seen[0].message)
        True
    """
    check = getattr(tx, "float16_check", None)
    if check is None:
        return
    argument = check.dtype_argument
    if argument is not None and getattr(tx, argument) is not None:
        return
    paths, leaves, _ = flatten(params)
    narrow = []
    for path, x in zip(paths, leaves):
        if is_unit(x):  # packed params: the paths of their float16 buffer
            groups = x.layout.groups
            inside = [
                join_path(path, s.path) for s in x.layout.specs if groups[s.group] == "float16"
            ]
            narrow += [p for p in inside if where is None or p in where]
        elif getattr(x, "dtype", None) == jnp.float16 and (where is None or path in where):
            narrow.append(path)
    if not narrow:
        return
    shown = ", ".join(repr(p) for p in narrow[:4]) + (", ..." if len(narrow) > 4 else "")
    names = [f"`{slot}`" for slot in check.slots]
    slots = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    if argument is None:
        fix = "Train these params in float32 or bfloat16 (which has float32's range)."
    else:
        fix = f"Pass `{argument}=jnp.float32`."
    warnings.warn(
        f"{tx.name}: the float16 params at {shown} keep {check.what} {slots} in float16, "
        f"{check.why}. {fix}",
        UserWarning,
        stacklevel=3,
    )


def _run_update_leaf(tx: PerArrayTransform, g: Any, slots: dict, param: Any) -> tuple:
    return tx.update_leaf(g, slots, param)


# Inside a trace, per-array math of some size is a call of one jitted function: JAX traces
# and lowers it once per transformation and leaf signature instead of once per leaf, and XLA
# inlines the calls before fusing, so the compiled step is the same (bit-for-bit) and traces
# and lowers in a fraction of the time (benchmarks/compile_time.py). Math of one or two
# operations (momentum, a constant learning rate) costs less to trace again than to call,
# so it stays inline.
_update_leaf_once = jax.jit(_run_update_leaf)
_CALL_FROM = 6  # operations in one leaf's math
# Whether each (transformation structure, leaf signature) is called or inlined.
_calls: BoundedCache = BoundedCache(4096)


def traced_once(tx: PerArrayTransform) -> Callable[..., tuple[Any, dict]]:
    """`tx.update_leaf`, called through `_update_leaf_once` when tracing math of some size."""
    structure = jax.tree.structure(tx)

    def leaf_update(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        if not isinstance(g, Tracer):
            return tx.update_leaf(g, slots, param)
        key = (structure, _signature(g), _signature(slots), _signature(param))
        call = _calls.get(key)
        if call is None:
            traced = _update_leaf_once.trace(tx, g, slots, param)
            call = _calls.remember(key, len(traced.jaxpr.eqns) >= _CALL_FROM)
        if call:
            return _update_leaf_once(tx, g, slots, param)
        return tx.update_leaf(g, slots, param)

    return leaf_update


def _signature(tree: Any) -> tuple:
    """The dtypes of `tree`'s arrays and which are scalars.

    That is what the size of one leaf's math depends on; a shape does not change it, so
    leaves of every shape share one decision.
    """
    return tuple((jnp.dtype(x.dtype), jnp.ndim(x) == 0) for x in jax.tree.leaves(tree))
