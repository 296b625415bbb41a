"""Stacked layers: leaves that hold a stack of independent arrays along their leading axes.

Models often stack identical layers along a leading axis and scan over them, so one leaf
`layers/w` of shape `(L, d_in, d_out)` holds `L` weight matrices. A transformation whose math
needs each leaf's own shape (per-leaf norms, factored moments, unit-wise clipping) would see
one big array; with `stacked={"layers/**": 1}` it treats each of the `L` slices as a leaf of
its own, exactly as if the model kept `L` separate leaves (the per-leaf math is vmapped over the
declared leading axes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import init_slots, update_slots
from gradtx._core.per_array import PerArrayTransform, check_packable, warn_float16_statistics
from gradtx._core.protocol import Params, Updates
from gradtx._paths.paths import flatten, virtual
from gradtx._paths.selectors import Selector, SelectorError, as_selector, select

Stacked = tuple[tuple[Selector, int], ...]


def as_stacked(value: Any, name: str = "stacked") -> Stacked:
    """`{selector: n_leading_axes}` (or `None`) -> a hashable tuple of `(Selector, n)` pairs."""
    if value is None:
        return ()
    if isinstance(value, tuple) and all(
        isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], Selector)
        for pair in value
    ):
        return value  # already converted (`Module.replace` runs converters again)
    if not isinstance(value, Mapping):
        raise TypeError(
            f"`{name}` must be a dict {{selector: number of leading stack axes}}, for example "
            f'{{"layers/**": 1}}; got {type(value).__name__}: {value!r}'
        )
    pairs = []
    for selector, n in value.items():
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise TypeError(
                f"`{name}[{selector!r}]` must be a non-negative int (the number of leading "
                f"stack axes), got {n!r}"
            )
        pairs.append((as_selector(selector, f"{name}[{selector!r}]"), int(n)))
    return tuple(pairs)


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    paths, leaves, _ = flatten(virtual(tree))
    return {p: tuple(np.shape(x)) for p, x in zip(paths, leaves) if x is not None}


def resolve_stacked(
    stacked: Stacked, tree: Any, owner: str, *, strict: bool = True
) -> dict[str, int]:
    """`{path: n}` for the leaves of `tree` that `stacked` declares stacked (`n > 0`).

    Args:
        stacked: the converted `stacked=` argument (see `as_stacked`).
        tree: params or updates (packed params are seen by the paths they hold).
        owner: the transformation's name, for error messages.
        strict: raise when a selector matches no path (at `init`; an `update` that covers
            only some paths may leave a selector without a match).

    Raises:
        SelectorError: a selector matches nothing (with `strict`).
        ValueError: a leaf has fewer dimensions than declared, or two selectors declare
            different numbers of stack axes for one leaf.
    """
    if not stacked:
        return {}
    shapes = _shapes(tree)
    depth: dict[str, int] = {}
    owner_of: dict[str, Selector] = {}
    for selector, n in stacked:
        argument = f"{owner}(stacked={{{selector!r}: {n}}})"
        try:
            chosen = select(tree, selector, strict=strict, argument=argument)
        except SelectorError as e:
            raise SelectorError(
                f"{owner}: the stacked selector {selector!r} matches no path. {e}"
            ) from e
        for path in chosen:
            shape = shapes[path]
            if len(shape) < n:
                raise ValueError(
                    f"{owner}: the stacked selector {selector!r} declares {n} leading stack "
                    f"axes, but the leaf at {path!r} has shape {shape} ({len(shape)} dims)."
                )
            if path in depth and depth[path] != n:
                raise ValueError(
                    f"{owner}: the leaf at {path!r} is declared stacked with {depth[path]} axes "
                    f"by {owner_of[path]!r} and with {n} by {selector!r}."
                )
            depth[path], owner_of[path] = n, selector
    return {p: n for p, n in depth.items() if n > 0}


def vmap_leading(fn: Callable, n: int, in_axes: Any = 0, out_axes: Any = 0) -> Callable:
    """`fn` vmapped over the first `n` axes of its (selected) arguments, the outermost first."""
    for _ in range(n):
        fn = jax.vmap(fn, in_axes=in_axes, out_axes=out_axes)
    return fn


class StackedTransform(PerArrayTransform):
    """Per-leaf math with a `stacked` field: selected leaves run as stacks of leaves.

    A subclass declares a static field `stacked` (converted by `as_stacked`), writes
    `update_leaf` for one leaf as usual, and lists in `unstacked_slots` the slots that stay
    one value per path (a step count) instead of one per stacked slice. Slots of a stacked leaf
    start at zero, shaped `stack_shape + slot_shape`.
    """

    per_leaf_structure: ClassVar[bool] = True
    unstacked_slots: ClassVar[tuple[str, ...]] = ("count",)
    if TYPE_CHECKING:  # each subclass's own field: declared here, it would be the first argument
        stacked: ClassVar[Stacked]

    def slot_groups(
        self, tree: Any, depth: dict[str, int]
    ) -> tuple[tuple[tuple[str, ...], set[str] | None], ...]:
        """`((slot_names, paths), ...)`: which slots each path keeps (`None`: every path).

        `depth` gives the stacked paths' numbers of stack axes. The default: every path keeps
        every slot of `state_keys()`.
        """
        return ((self.state_keys(), None),)

    def init_state(self, params: Params) -> dict:
        """Slots for every non-`None` leaf; stacked leaves get one slice per stacked index."""
        check_packable(self, params)
        warn_float16_statistics(self, params)
        depth = resolve_stacked(self.stacked, params, self.name, strict=True)
        if not self.state_keys():
            return {}
        state: dict = {}
        for names, where in self.slot_groups(params, depth):
            for n, paths in _by_depth(params, depth, where):
                leaf_init = self._stacked_init(n) if n else self.init_leaf
                part = init_slots(params, leaf_init, names, where=paths)
                for name, values in part.items():
                    state.setdefault(name, {}).update(values)
        for name in self.state_keys():
            state.setdefault(name, {})
        return state

    def _stacked_init(self, n: int) -> Callable[[Any], dict]:
        def leaf_init(param: Any) -> dict[str, Any]:
            stack, inner = tuple(param.shape[:n]), tuple(param.shape[n:])
            struct = jax.ShapeDtypeStruct(inner, param.dtype)
            shapes = jax.eval_shape(self.init_leaf, struct)
            return {
                k: jnp.zeros(s.shape if k in self.unstacked_slots else stack + s.shape, s.dtype)
                for k, s in shapes.items()
            }

        return leaf_init

    def step(
        self, updates: Updates, state: dict, params: Params | None = None, **extra: Any
    ) -> tuple[Updates, dict]:
        """Apply the per-leaf math to every present path, stacked leaves slice by slice."""
        self.check_state(state)
        depth = resolve_stacked(self.stacked, updates, self.name, strict=False)
        selected = self.selected_paths(updates, params)
        for names, where in self.slot_groups(updates, depth):
            slots = {k: state[k] for k in names}
            chosen = (
                where if selected is None else (selected if where is None else where & selected)
            )
            for n, paths in _by_depth(updates, depth, chosen):
                leaf_update = self._stacked_update(n) if n else self.update_leaf
                updates, slots = update_slots(
                    leaf_update,
                    updates,
                    slots,
                    params,
                    owner=self.name,
                    needs_params=self.needs_params,
                    where=paths,
                    per_leaf=True,
                )
            state = {**state, **slots}
        return updates, state

    def _stacked_update(self, n: int) -> Callable:
        leaf_update, unstacked = self.update_leaf, self.unstacked_slots

        def stacked(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            axes = {k: None if k in unstacked else 0 for k in slots}
            u, changed = vmap_leading(leaf_update, n, in_axes=(0, axes, 0))(g, slots, param)
            # An unstacked slot (a count) comes out broadcast along the stack: keep one copy.
            changed = {k: v[(0,) * n] if k in unstacked else v for k, v in changed.items()}
            return u, changed

        return stacked


def _by_depth(
    tree: Any, depth: dict[str, int], where: set[str] | None
) -> list[tuple[int, set[str] | None]]:
    """Split the paths (`where`, or all) into groups of equal stack depth: `[(n, paths)]`."""
    if not depth:
        return [(0, where)]
    paths = set(_shapes(tree)) if where is None else where
    groups: dict[int, set[str]] = {}
    for path in paths:
        groups.setdefault(depth.get(path, 0), set()).add(path)
    return sorted(groups.items())
