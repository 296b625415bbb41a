"""Reading and replacing one leaf of a tree by its path (`gradtx.tree.get`, `set`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from gradtx._core.tree_math import _sample
from gradtx._paths.paths import flatten, path_of, unbox

__all__ = ["get", "set"]


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
    split = _children(node)
    if split is not None:
        children, treedef = split
        for i, (key, child) in enumerate(children):
            if rest == key or rest.startswith(key + "/"):
                found, new_child = _walk(child, rest[len(key) + 1 :], replace)
                if replace is None:
                    return found, node
                new = [c for _, c in children]
                new[i] = new_child
                return found, treedef.unflatten(new)
    raise _PathNotFound(rest)


def _at(fn: str, tree: Any, path: str, replace: Callable[[Any], Any] | None = None) -> tuple:
    if not isinstance(path, str):
        raise TypeError(f"tree.{fn}: `path` must be a string like 'enc/w', got {path!r}.")
    try:
        return _walk(tree, path, replace)
    except _PathNotFound:
        raise _PathNotFound(
            f"tree.{fn}: no leaf or subtree at path {path!r}. The tree's paths are "
            f"{_sample(flatten(tree)[0])}."
        ) from None


def get(tree: Any, path: str) -> Any:
    """The leaf, or the subtree, at `path`.

    Args:
        tree: a tree.
        path: a path as rendered by `gradtx.paths.paths` (`"enc/layers/0/w"`), or the path of
            a subtree (`"enc"`); `""` is the whole tree.

    Returns:
        The leaf or subtree (a `None` leaf is returned as `None`).

    Raises:
        KeyError: if no leaf or subtree has that path; the message lists the tree's paths.

    Examples:
        >>> params = {"enc": {"layers": [{"w": jnp.ones(2)}]}}
        >>> gradtx.tree.get(params, "enc/layers/0/w")
        Array([1., 1.], dtype=float32)
        >>> gradtx.tree.get(params, "enc/layers")
        [{'w': Array([1., 1.], dtype=float32)}]
    """
    return _at("get", tree, path)[0]


def set(tree: Any, path: str, value: Any) -> Any:
    """A new tree with the leaf (or subtree) at `path` replaced by `value`.

    The input is never modified: the containers along `path` are rebuilt and everything else
    is shared.

    Args:
        tree: a tree.
        path: the path of an existing leaf or subtree (`""` replaces the whole tree).
        value: the new leaf or subtree (any shape, dtype or structure).

    Returns:
        The new tree.

    Raises:
        KeyError: if no leaf or subtree has that path.

    Examples:
        >>> params = {"enc": {"w": jnp.ones(2)}, "head": [jnp.ones(1)]}
        >>> new = gradtx.tree.set(params, "head/0", jnp.zeros(1))
        >>> new["head"], params["head"]
        ([Array([0.], dtype=float32)], [Array([1.], dtype=float32)])
    """
    return _at("set", tree, path, lambda _: value)[1]
