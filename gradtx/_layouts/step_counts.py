"""Per-path step counts stored as one scalar per group of paths that count alike.

A step count advances per path (DESIGN: partial updates advance only the paths present), but
in almost every step all paths advance together. Stored as one int32 scalar per path, every
leaf costs an input and an output buffer and its own scalar kernels for the count and the
bias corrections, which made the step slower to compile and to run than with one shared
count (benchmarks/lab/layouts.py). `StepCounts`
keeps one scalar shared by all paths while they count alike; from the first update that
leaves some paths out, it keeps one scalar per path, as before (so the state's layout
changes once at most, and under `jit` that step is traced again). Loading a checkpoint
groups the paths whose counts are equal. It reads like the `{path: count}` dict it
replaces, and `state_dict` and checkpoints see one entry per path.

Its layout also records the shape of each path's parameter at `init`, as static structure:
a count holds no shape of its own, and a state whose only per-path entry is a count would
otherwise not notice that the params it meets are not those it was made for.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from gradtx._layouts.packed import join_path
from gradtx._paths.cache import BoundedCache
from gradtx._paths.subset import present_paths

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class CountLayout:
    """Which paths share which count: `groups[i]` holds the paths of the i-th value.

    `order` is the paths' tree order, the order in which they are listed. `shapes`, when
    known, holds the shape of each path's parameter at `init`, in `order`.
    """

    groups: tuple[tuple[str, ...], ...]
    order: tuple[str, ...]
    shapes: tuple[Shape, ...] | None = None

    @functools.cached_property
    def index(self) -> dict[str, int]:
        return {path: i for i, paths in enumerate(self.groups) for path in paths}

    @functools.cached_property
    def shape_by_path(self) -> dict[str, Shape]:
        return dict(zip(self.order, self.shapes or ()))

    # Computed once: JAX hashes a pytree's static data on every jitted call.
    @functools.cached_property
    def _hash(self) -> int:
        return hash((self.groups, self.order, self.shapes))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, CountLayout)
            and (self.groups, self.order, self.shapes) == (other.groups, other.order, other.shapes)
        )

    def nnx_keys(self) -> tuple[str, ...]:
        """One key per group for Flax NNX: its first path, and how many paths it holds."""
        return tuple(
            paths[0] if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1})"
            for paths in self.groups
        )

    def __repr__(self) -> str:
        return f"CountLayout({len(self.order)} paths in {len(self.groups)} groups)"


# JAX compares a pytree's static data on every jitted call; one live layout per grouping
# makes that an identity test.
_LAYOUTS: BoundedCache = BoundedCache(1024)


def _layout(
    groups: tuple[tuple[str, ...], ...],
    order: tuple[str, ...],
    shapes: tuple[Shape, ...] | None = None,
) -> CountLayout:
    layout = CountLayout(groups, order, shapes)
    live = _LAYOUTS.get(layout)
    return _LAYOUTS.remember(layout, layout) if live is None else live


def _shapes_in_order(
    order: tuple[str, ...], shapes: Mapping[str, Any] | None
) -> tuple[Shape, ...] | None:
    """`shapes` (`{path: shape}`) as a tuple in `order`; None unless every path has one."""
    if shapes is None or any(path not in shapes for path in order):
        return None
    return tuple(tuple(int(n) for n in shapes[path]) for path in order)


class StepCounts(Mapping):
    """`{path: step count}` stored as one int32 scalar per group of paths with equal counts.

    Read it as a dict: `counts["enc/w"]` is that path's count (a scalar array). Its pytree
    children are the group values, so a jitted step carries one count per group, not one
    per path. `state_dict` expands it to one entry per path. Other per-path scalars that
    change only with the count hold their values this way too (schedule-free's weight sum
    and largest rate, see `updated`).
    """

    __slots__ = ("layout", "scalars")
    __gradtx_unit__ = True

    def __init__(self, layout: CountLayout, values: Iterable[Any]) -> None:
        self.layout = layout
        self.scalars = tuple(values)

    @classmethod
    def shared(
        cls, paths: Iterable[str], value: Any, shapes: Mapping[str, Any] | None = None
    ) -> StepCounts:
        """One count `value` shared by all `paths`.

        `shapes` (`{path: shape}`) records the shape of each path's parameter, as `init`
        saw it; `shape` reads it back.
        """
        _register_with_nnx()
        paths = tuple(paths)
        layout = _layout((paths,) if paths else (), paths, _shapes_in_order(paths, shapes))
        return cls(layout, (value,) if paths else ())

    def shape(self, path: str) -> Shape | None:
        """The shape of `path`'s parameter when the state was made (None if not recorded)."""
        return self.layout.shape_by_path.get(path)

    def __getitem__(self, path: str) -> Any:
        return self.scalars[self.layout.index[path]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.layout.order)

    def __len__(self) -> int:
        return len(self.layout.order)

    def __contains__(self, path: object) -> bool:
        return path in self.layout.index

    def __repr__(self) -> str:
        return f"StepCounts({dict(self.items())!r})"

    def paths(self, prefix: str = "") -> list[str]:
        """The paths it counts for, as state keys under `prefix`."""
        return [join_path(prefix, path) for path in self.layout.order]

    def items(self, prefix: str | None = None) -> Any:  # type: ignore[override]
        """`(path, count)` pairs; with `prefix`, the paths are state keys under it."""
        if prefix is None:
            return super().items()
        return iter([(join_path(prefix, path), self[path]) for path in self.layout.order])

    def advanced(self, present: set[str] | frozenset[str]) -> StepCounts:
        """The counts after an update of the `present` paths: theirs are one more.

        From the first update that leaves some of its paths out, the counts are one per
        path (as they are then kept), so the layout changes at most once in a state's life.
        """
        return self._replaced(present, lambda _, count: next_count(count))

    def updated(self, new: Mapping[str, Any]) -> StepCounts:
        """The values after an update that gave each path in `new` that value.

        The other paths keep theirs. While every path is updated, the groups stay: a group
        takes its first path's new value, so the caller's math must give the paths of one
        group equal values (it reads only the group's own values and shared constants).
        From the first update that leaves some paths out, the values are one per path, as
        `advanced` keeps counts.
        """
        return self._replaced(new, lambda path, _: new[path])

    def _replaced(self, paths: Collection[str], value: Callable[[str, Any], Any]) -> StepCounts:
        """`value(path, old)` for the `paths`; per group while they are all the paths."""
        if all(path in paths for path in self.layout.index):
            pairs = zip((group[0] for group in self.layout.groups), self.scalars)
            return StepCounts(self.layout, [value(path, old) for path, old in pairs])
        per = self.per_path()
        pairs = zip(per.layout.order, per.scalars)
        return StepCounts(per.layout, [value(p, old) if p in paths else old for p, old in pairs])

    def per_path(self) -> StepCounts:
        """The same counts, one value per path."""
        if len(self.layout.groups) == len(self.layout.order):
            return self
        order = self.layout.order
        layout = _layout(tuple((p,) for p in order), order, self.layout.shapes)
        return StepCounts(layout, [self[p] for p in order])


def split_where_absent(state: Any, updates: Any) -> Any:
    """`state` with the `StepCounts` that an update with `updates` splits made per path.

    Both branches of a `lax.cond` around an update then return the same layout.
    """
    present = frozenset(present_paths(updates))

    def split(x: Any) -> Any:
        if isinstance(x, StepCounts) and any(p not in present for p in x.layout.index):
            return x.per_path()
        return x

    return _aligned(jax.tree.map(split, state, is_leaf=lambda x: isinstance(x, StepCounts)))


def aligned(slots: dict[str, Any]) -> dict[str, Any]:
    """`slots` with the `StepCounts` of the same paths made per path where their groups differ.

    Math that reads several shared slots of a path together (schedule-free's count, weight
    sum and largest rate) keeps them in one grouping: a group's paths then read equal
    values of all of them. Loading a checkpoint groups each slot by its own values, so
    their groups can differ; per path they agree again.
    """
    layouts: dict[tuple[str, ...], set[CountLayout]] = {}
    for value in slots.values():
        if isinstance(value, StepCounts):
            layouts.setdefault(value.layout.order, set()).add(value.layout)
    apart = {order for order, found in layouts.items() if len(found) > 1}
    if not apart:
        return slots
    return {
        k: v.per_path() if isinstance(v, StepCounts) and v.layout.order in apart else v
        for k, v in slots.items()
    }


def _aligned(tree: Any) -> Any:
    """`aligned` applied to every dict of `tree` (a state), each dict kept of its own type."""
    if isinstance(tree, dict) and not isinstance(tree, StepCounts):
        out = aligned({k: _aligned(v) for k, v in tree.items()})
        return out if type(tree) is dict else type(tree)(out)
    return tree


def next_count(count: Any) -> Any:
    """`count + 1` for an integer counter, staying at its dtype's largest value.

    Every step count advances through here, and math that needs the old count reads it as
    `next_count(count) - 1` (the same short of saturation, after 2**31 - 1 steps). Then the
    donated count has one reader, the kernel that writes the new count in place, and every
    other kernel reads the new count. When several kernels read the old count (a plain
    `count + 1` is cheap enough that XLA fuses a copy of it into each reader), XLA first
    copies the count: one more kernel per count and step (Adam's 7 kernels against 6). The
    select of the saturating add is what keeps XLA from copying the add into the readers.

    Examples:
        >>> int(next_count(jnp.int32(4)))
        5
        >>> int(next_count(jnp.int32(2**31 - 1)))
        2147483647
    """
    top = jnp.asarray(np.iinfo(count.dtype).max, count.dtype)
    return jnp.where(count < top, count + jnp.asarray(1, count.dtype), top)


jax.tree_util.register_pytree_node(
    StepCounts,
    lambda counts: (counts.scalars, counts.layout),
    lambda layout, values: StepCounts(layout, values),
)


def group_counts(by_path: dict[str, Any], like: StepCounts | None = None) -> StepCounts:
    """`StepCounts` holding `by_path`'s counts, paths with equal known values grouped.

    Values that are not known (traced) each keep a group of their own. The parameters'
    shapes are those `like` recorded (a loaded state's template, made by `init`), if any.
    """
    _register_with_nnx()
    groups: dict[Any, list[str]] = {}
    values: dict[Any, Any] = {}
    for path, value in by_path.items():
        if isinstance(value, jax.ShapeDtypeStruct):
            key: tuple = ("abstract", value.shape, str(value.dtype))
        elif isinstance(value, Tracer):
            key = ("path", path)
        else:
            key = ("value", np.asarray(value).item(), str(jnp.result_type(value)))
        groups.setdefault(key, []).append(path)
        values.setdefault(key, value)
    order = tuple(by_path)
    shapes = None
    if like is not None and like.layout.shapes is not None:
        shapes = _shapes_in_order(order, like.layout.shape_by_path)
    layout = _layout(tuple(tuple(paths) for paths in groups.values()), order, shapes)
    return StepCounts(layout, [values[key] for key in groups])


# Flax NNX writes a new optimizer state into `nnx.Optimizer.opt_state` in place, key by key
# (`nnx.update`), and cannot do so into a node it does not know how to change. Registered
# with NNX, a `StepCounts` node is keyed by group (its first path, and how many paths it
# holds), so a state whose counts are grouped otherwise fails there with a message naming
# the fix: keyed by position, as NNX keys other pytrees, it would fail with "Cannot set key",
# or, where only the number of groups agrees, write counts to the wrong paths.
_nnx_registered = False

_NNX_FIX = (
    "Put the whole state in instead: `optimizer.opt_state = jax.tree.map(nnx.OptArray, state)`."
)


def _nnx_flatten(counts: StepCounts) -> tuple[list[tuple[str, Any]], CountLayout]:
    return sorted(zip(counts.layout.nnx_keys(), counts.scalars)), counts.layout


def _nnx_unflatten(nodes: Iterable[tuple[str, Any]], layout: CountLayout) -> StepCounts:
    by_key = dict(nodes)
    return StepCounts(layout, [by_key[key] for key in layout.nnx_keys()])


def _nnx_set_key(counts: StepCounts, key: Any, value: Any) -> None:
    keys = counts.layout.nnx_keys()
    shown = ", ".join(repr(k) for k in keys[:4]) + (", ..." if len(keys) > 4 else "")
    raise ValueError(
        f"nnx.update cannot write these step counts in place: they are kept in {len(keys)} "
        f"group(s) ({shown}), and the state written has no group {key!r}. Its counts are "
        "grouped otherwise (a restored checkpoint keeps one count per group of equal counts), "
        f"or it is a plain gradtx state rather than `nnx.state(state)`. {_NNX_FIX}"
    )


def _register_with_nnx() -> None:
    """Register `StepCounts` with Flax NNX once NNX is in use (see the comment above)."""
    global _nnx_registered
    if _nnx_registered or "flax.nnx" not in sys.modules:
        return
    _nnx_registered = True
    try:
        from flax.nnx import graphlib
    except ImportError:  # a Flax without the NNX graph registry: its own errors then
        return
    register = getattr(graphlib, "register_pytree_node_type", None)
    if register is not None and StepCounts not in getattr(graphlib, "PYTREE_REGISTRY", {}):
        register(StepCounts, _nnx_flatten, _nnx_unflatten, set_key=_nnx_set_key)
