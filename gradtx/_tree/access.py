"""Reading and replacing one leaf of a tree by its path (`gradtx.tree.get`, `set`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from gradtx._layouts.packed import join_path
from gradtx._paths.paths import flatten, is_unit, path_of, unbox
from gradtx._tree.arithmetic import _sample


def _children(node: Any) -> tuple[list[tuple[str, Any]], Any] | None:
    """`([(key string, child), ...], one-level treedef)`, or None if `node` is a leaf."""
    if node is None:
        return None
    keyed, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if treedef.num_nodes == 1 and len(keyed) == 1 and keyed[0][0] == ():
        return None  # a leaf
    return [(path_of(kp), child) for kp, child in keyed], treedef


class _PathNotFound(KeyError):
    """No leaf or subtree at a path (a `KeyError` whose message reads as text)."""

    def __str__(self) -> str:
        return str(self.args[0])


def _walk(node: Any, rest: str, replace: Callable[[Any], Any] | None) -> tuple[Any, Any]:
    """`(subtree at rest, node with it replaced by replace(subtree) if given)`."""
    boxed = unbox(node)
    if boxed is not None:  # a Flax NNX Variable: its value has the Variable's own path
        value, box = boxed
        found, new_value = _walk(value, rest, replace)
        return found, (box.unflatten([new_value]) if replace is not None else node)
    if rest == "":
        return node, (replace(node) if replace is not None else node)
    if is_unit(node):  # a state's per-path values (`count/enc/w`), read by the paths it holds
        for key, value in node.items(""):
            if key == rest:
                if replace is not None:
                    raise TypeError(
                        f"tree.set: {rest!r} is one path inside a {type(node).__name__}, "
                        "which stores several paths together; set the whole of it."
                    )
                return value, node
        raise _PathNotFound(rest)
    split = _children(node)
    if split is not None:
        children, treedef = split
        for i, (key, child) in enumerate(children):
            # An empty key adds no segment (a state's slot of params packed whole).
            if key == "" or rest == key or rest.startswith(key + "/"):
                try:
                    found, new_child = _walk(child, rest[len(key) + 1 :] if key else rest, replace)
                except _PathNotFound:
                    if key == "":
                        continue
                    raise
                if replace is None:
                    return found, node
                new = [c for _, c in children]
                new[i] = new_child
                return found, treedef.unflatten(new)
    raise _PathNotFound(rest)


def _node_paths(node: Any, prefix: str, out: list[str]) -> None:
    """Append the path of every subtree and leaf below `node` (at `prefix`), in tree order."""
    boxed = unbox(node)
    if boxed is not None:
        _node_paths(boxed[0], prefix, out)
        return
    if prefix and (not out or out[-1] != prefix):
        out.append(prefix)
    if is_unit(node):
        out.extend(node.paths(prefix))
        return
    split = _children(node)
    if split is not None:
        for key, child in split[0]:
            _node_paths(child, join_path(prefix, key), out)


def _by_name(fn: str, tree: Any, name: str) -> str | None:
    """The one path of `tree` that ends in the key (or keys) `name`, as optax finds a field.

    Raises listing every such path when there are several.
    """
    found: list[str] = []
    _node_paths(tree, "", found)
    ends = [p for p in dict.fromkeys(found) if p.endswith("/" + name)]
    if len(ends) > 1:
        listed = ", ".join(repr(p) for p in ends)
        raise _PathNotFound(
            f"tree.{fn}: {name!r} is no path of the tree, and {len(ends)} paths end in it: "
            f"{listed}. Pass the full path of the one you mean."
        )
    return ends[0] if ends else None


def _at(fn: str, tree: Any, path: str, replace: Callable[[Any], Any] | None = None) -> tuple:
    if not isinstance(path, str):
        raise TypeError(f"tree.{fn}: `path` must be a string like 'enc/w', got {path!r}.")
    try:
        return _walk(tree, path, replace)
    except _PathNotFound:
        pass
    full = _by_name(fn, tree, path) if path else None
    if full is not None:
        return _walk(tree, full, replace)
    raise _PathNotFound(
        f"tree.{fn}: no leaf or subtree at path {path!r}, and no path ends in it. The tree's "
        f"paths are {_sample(flatten(tree)[0])}."
    )


def get(tree: Any, path: str) -> Any:
    """The leaf, or the subtree, at `path`.

    Args:
        tree: a tree.
        path: a path as rendered by `gradtx.paths.paths` (`"enc/layers/0/w"`), or the path of
            a subtree (`"enc"`); `""` is the whole tree. A path that is not in the tree but
            ends exactly one path of it, key by key, means that path, as optax looks a
            state field up by name: `"count"` finds `adam/count` in a chain's state.
            Per-path values a state stores together (step counts) are read by their
            `state_dict` keys (`adam/count/enc/w`).

    Returns:
        The leaf or subtree (a `None` leaf is returned as `None`).

    Raises:
        KeyError: if no leaf or subtree has that path or ends in it (the message lists the
            tree's paths), or if several paths end in it (the message lists every one).

    Examples:
        >>> params = {"enc": {"layers": [{"w": jnp.ones(2)}]}}
        >>> gradtx.tree.get(params, "enc/layers/0/w")
        Array([1., 1.], dtype=float32)
        >>> gradtx.tree.get(params, "enc/layers")
        [{'w': Array([1., 1.], dtype=float32)}]
        >>> state = gradtx.chain(gradtx.clip(1.0), gradtx.adam(0.1)).init(params)
        >>> int(gradtx.tree.get(state, "count")["enc/layers/0/w"])  # the one `.../count`
        0
    """
    return _at("get", tree, path)[0]


def set(tree: Any, path: str, value: Any) -> Any:
    """A new tree with the leaf (or subtree) at `path` replaced by `value`.

    The input is never modified: the containers along `path` are rebuilt and everything else
    is shared.

    Args:
        tree: a tree.
        path: the path of an existing leaf or subtree (`""` replaces the whole tree), or
            the end of exactly one such path, as for `get`.
        value: the new leaf or subtree (any shape, dtype or structure).

    Returns:
        The new tree.

    Raises:
        KeyError: if no leaf or subtree has that path or ends in it, or several end in it.
        TypeError: for one path inside a unit of several (a state's step counts).

    Examples:
        >>> params = {"enc": {"w": jnp.ones(2)}, "head": [jnp.ones(1)]}
        >>> new = gradtx.tree.set(params, "head/0", jnp.zeros(1))
        >>> new["head"], params["head"]
        ([Array([0.], dtype=float32)], [Array([1.], dtype=float32)])
    """
    return _at("set", tree, path, lambda _: value)[1]
