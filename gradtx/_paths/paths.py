"""Paths: a leaf's identity is its key path joined with '/'.

`{"enc": {"layers": [{"w": x}]}}` gives `enc/layers/0/w`. Dict keys, attribute names
(dataclasses, NamedTuples, Equinox modules) and sequence indices all work. `None` is kept as a
leaf, so Equinox-style trees with `None` gradients keep their structure.

A *path-transparent* node, a box around a single value such as a Flax NNX `Variable`
(`nnx.Param`, `nnx.BatchStat`, ...: an `nnx.State` holds one per parameter) or a Flax Linen
`nn.Partitioned`, gives its value its own path: the kernel of `nnx.state(model)` is
`l1/kernel`, not `l1/kernel/value`, just as in the model. Flax is never imported here: a
node is recognised by its type's module and name (or by a `__gradtx_path_transparent__ =
True` class attribute), and then only when it flattens to the single child `value`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

import jax

from gradtx._paths.cache import BoundedCache

_CACHE: BoundedCache = BoundedCache(4096)


class DuplicatePathError(ValueError):
    """Two leaves of one tree render to the same path string."""


def _per_type(known: BoundedCache, test: Callable[[type], bool]) -> Callable[[Any], bool]:
    """`test` of a value's type, kept in `known` per type.

    `flatten` asks it of every node of every tree it flattens; looked up by type it costs
    half as much (benchmarks/lab/host_overhead.py).
    """

    def check(x: Any) -> bool:
        cls = type(x)
        try:
            return known[cls]
        except KeyError:
            return known.remember(cls, test(cls))

    return check


# True for a container gradtx treats as one unit holding many paths (`gradtx.Packed`).
_UNIT_TYPES: BoundedCache = BoundedCache(4096)
is_unit = _per_type(_UNIT_TYPES, lambda cls: bool(getattr(cls, "__gradtx_unit__", False)))


def _is_leaf(x: Any) -> bool:
    """Where `flatten` stops: `None` (kept as a leaf) and units."""
    return x is None or is_unit(x)


def _view(unit: Any) -> Any:
    """The tree a unit stands for: packed params' own structure, else `{path: value}`."""
    structure = getattr(unit, "structure", None)
    if callable(structure):
        return structure()
    # Units of per-path values (a state's `StepCounts`) list them; a dict keyed by path
    # gives each value its path under the unit's (`count/enc/w`), as `state_dict` does.
    return dict(unit.items(""))


def virtual(tree: Any) -> Any:
    """`tree` with every unit replaced by the tree it stands for.

    Packed params become their original tree (`ShapeDtypeStruct` leaves), and a unit of
    per-path values in a state (a step count per path) becomes `{path: value}`. Selectors look
    at this view, so a glob selects the same paths in packed and unpacked params, and in any
    state gradtx builds.
    """
    if not any(is_unit(x) for x in jax.tree_util.tree_leaves(tree, is_leaf=is_unit)):
        return tree  # the very same object: a selector function sees the user's params
    return jax.tree_util.tree_map(_virtual_node, tree, is_leaf=_is_unit_or_slot)


def _virtual_node(x: Any) -> Any:
    unit = x[""] if _is_whole_slot(x) else x
    return _view(unit) if is_unit(unit) else x


def _is_whole_slot(x: Any) -> bool:
    """A state's slot of params packed whole: `{"": unit}`, the key being the root's path.

    It is viewed whole, so its paths are `mu/enc/w`, as `state_dict` reads them, not
    `mu//enc/w`.
    """
    return type(x) is dict and len(x) == 1 and is_unit(x.get(""))


def _is_unit_or_slot(x: Any) -> bool:
    return is_unit(x) or _is_whole_slot(x)


def path_of(key_path: tuple) -> str:
    """Render a JAX key path as a gradtx path string (`enc/layers/0/w`)."""
    return jax.tree_util.keystr(key_path, simple=True, separator="/")


def map_with_old(fn: Callable[[tuple, Any, Any], Any], new_tree: Any, old_tree: Any) -> Any:
    """`new_tree` with each leaf replaced by `fn(key_path, leaf, old)`.

    `old` is the leaf of `old_tree` at the same path, or `None` where it has none: a state
    against the state of the step before, matched by path even where the nodes around a
    leaf changed (a step count's group split per path).
    """
    old = {path_of(kp): leaf for kp, leaf in jax.tree_util.tree_flatten_with_path(old_tree)[0]}
    found, treedef = jax.tree_util.tree_flatten_with_path(new_tree)
    return jax.tree.unflatten(treedef, [fn(kp, x, old.get(path_of(kp))) for kp, x in found])


def owning_path(key: str, paths: Collection[str]) -> str | None:
    """The longest of `paths` that ends the state key `key` (`adam/mu/enc/w` -> `enc/w`).

    `paths` should be a set or dict: each tail of `key` is looked up once, longest first.
    """
    parts = key.split("/")
    for i in range(len(parts)):
        tail = "/".join(parts[i:])
        if tail in paths:
            return tail
    return None


# The Flax boxes around one value, by (class name, module prefix): NNX's `Variable` (and so
# `Param`, `BatchStat`, user subclasses) and the `VariableState` that an `nnx.State` holds in
# earlier Flax versions; Linen's `AxisMetadata` (`nn.Partitioned`, `nn.LogicallyPartitioned`:
# the sharding annotations `nn.with_partitioning` leaves in the params).
_FLAX_BOXES = frozenset(
    {
        ("Variable", "flax.nnx"),
        ("VariableState", "flax.nnx"),
        ("AxisMetadata", "flax.core.meta"),
    }
)


def _transparent_type(cls: type) -> bool:
    if getattr(cls, "__gradtx_path_transparent__", False):
        return True
    return any(
        getattr(base, "__module__", "").startswith(prefix)
        for base in cls.__mro__
        for name, prefix in _FLAX_BOXES
        if base.__name__ == name
    )


# True for a box whose single value takes the box's own path (a Flax NNX `Variable`). The
# type alone decides here; `flatten` further requires that the box flattens to one child
# keyed `value`, so a box holding anything else keeps its full paths.
_TRANSPARENT_TYPES: BoundedCache = BoundedCache(4096)
is_path_transparent = _per_type(_TRANSPARENT_TYPES, _transparent_type)


def _stops(x: Any) -> bool:
    return _is_leaf(x) or is_path_transparent(x)


def _one_level(node: Any) -> tuple[list[tuple[tuple, Any]], Any]:
    """`([(key path, child), ...], one-level treedef)` of a node's direct children."""
    return jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)


def unbox(node: Any) -> tuple[Any, Any] | None:
    """`(value, one-level treedef)` of a path-transparent box, or None for any other node.

    The value takes the box's path; `treedef.unflatten([new_value])` rebuilds the box.
    """
    if _is_leaf(node) or not is_path_transparent(node):
        return None
    children, treedef = _one_level(node)
    keys = [getattr(key, "name", None) for key_path, _ in children for key in key_path]
    return (children[0][1], treedef) if keys == ["value"] else None


def _key_paths(tree: Any) -> Iterator[tuple]:
    """The key path of every leaf of `tree` (`None` leaves included), in tree order.

    The `value` key of a path-transparent box is left out, so its value has the box's path.
    """
    found, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_stops)
    for key_path, node in found:
        if _is_leaf(node) or not is_path_transparent(node):
            yield key_path
            continue
        boxed = unbox(node)
        children = [((), boxed[0])] if boxed is not None else _one_level(node)[0]
        for child_key, child in children:
            for rest in _key_paths(child):
                yield key_path + child_key + rest


def _compute_paths(tree: Any) -> tuple[str, ...]:
    first: dict[str, tuple] = {}
    for kp in _key_paths(tree):
        path = path_of(kp)
        if path in first:
            raise DuplicatePathError(
                f"Two leaves have the same path {path!r}: {jax.tree_util.keystr(first[path])}"
                f" and {jax.tree_util.keystr(kp)}. gradtx identifies parameters by path; "
                "rename one of the keys (for example, a dict key containing '/', or the "
                "string key '0' next to the index 0)."
            )
        first[path] = kp
    return tuple(first)


def flatten(tree: Any) -> tuple[tuple[str, ...], list[Any], Any]:
    """Flatten a pytree into `(paths, leaves, treedef)`, keeping `None` as a leaf.

    A packed unit (`gradtx.Packed`) is one leaf here; the lifting helper expands it.

    Paths are computed once per tree structure and cached, so repeated calls (one per traced
    `update`) cost a C++ flatten.

    Examples:
        >>> flatten({"a": 1, "b": [2, None]})[0]
        ('a', 'b/0', 'b/1')
    """
    leaves_, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_leaf)
    try:
        rendered = _CACHE[treedef]
    except KeyError:
        rendered = _CACHE.remember(treedef, _compute_paths(tree))
    return rendered, leaves_, treedef


def leaves(tree: Any) -> dict[str, Any]:
    """`{path: leaf}` for every leaf of `tree`, in tree order (`None` leaves included).

    Examples:
        >>> leaves({"enc": {"layers": [{"w": 1.0}]}, "b": None})
        {'b': None, 'enc/layers/0/w': 1.0}
    """
    rendered, values, _ = flatten(tree)
    return dict(zip(rendered, values))


def paths(tree: Any) -> list[str]:
    """The paths of `tree`'s leaves in tree order (`None` leaves included)."""
    return list(flatten(tree)[0])


def unflatten(like: Any, flat: dict[str, Any]) -> Any:
    """Rebuild a tree shaped like `like` from `{path: leaf}` (inverse of `leaves`).

    Args:
        like: a tree (or a `jax.tree_util.PyTreeDef` from `flatten`) giving the structure.
        flat: one value per path of `like`; `None` values are kept as `None` leaves.

    Examples:
        >>> tree = {"a": 1.0, "b": [2.0, None]}
        >>> unflatten(tree, leaves(tree)) == tree
        True
    """
    if isinstance(like, jax.tree_util.PyTreeDef):  # its paths: those of a tree of `None`s
        like = like.unflatten([None] * like.num_leaves)
    rendered, _, treedef = flatten(like)
    missing = [p for p in rendered if p not in flat]
    known = set(rendered)
    extra = [p for p in flat if p not in known]
    if missing or extra:
        raise KeyError(
            "unflatten: the paths do not match the structure. "
            f"Missing: {missing[:5]}{'...' if len(missing) > 5 else ''}; "
            f"unexpected: {extra[:5]}{'...' if len(extra) > 5 else ''}."
        )
    return treedef.unflatten([flat[p] for p in rendered])
