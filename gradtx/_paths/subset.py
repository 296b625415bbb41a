"""Views of a tree restricted to some paths: how combinators hand a group to its inner step.

A restricted tree keeps the structure and puts `None` ("no gradient", "no parameter") at every
path outside the group, so the inner transformation keeps state only for the group's paths and
moves nothing else. Packed params (`gradtx.pack`) go to a group whole or not at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gradtx._paths.paths import flatten, is_unit


def _inside(leaf: Any, path: str, chosen: set[str] | frozenset[str], owner: str) -> bool:
    """Whether the leaf at `path` is in the group: packed params all or none of their paths."""
    if not is_unit(leaf):
        return path in chosen
    inner = leaf.paths(path)
    hits = {p in chosen for p in inner}
    if len(hits) > 1:
        inside = [p for p in inner if p in chosen][:3]
        raise ValueError(
            f"{owner}: the selection takes {inside} of the packed params at {path!r} but not "
            "all of them; a packed buffer belongs to one group. Pack each group's parameters "
            "separately (gradtx.pack per group)."
        )
    return hits == {True}


def restrict(tree: Any, chosen: set[str] | frozenset[str], owner: str) -> Any:
    """`tree` with `None` at every leaf whose path is not in `chosen` (same structure).

    Args:
        tree: params or updates (`None` leaves stay `None`), or `None`.
        chosen: the group's paths (the paths inside packed params, as selectors see them).
        owner: the combinator's name, for the error raised when a group splits packed params.
    """
    if tree is None:
        return None
    paths, leaves, treedef = flatten(tree)
    out = [x if _inside(x, p, chosen, owner) else None for p, x in zip(paths, leaves)]
    return treedef.unflatten(out)


def any_present(tree: Any) -> bool:
    """True if `tree` has at least one non-`None` leaf."""
    return any(leaf is not None for leaf in flatten(tree)[1])


def present_paths(tree: Any) -> list[str]:
    """Paths of the non-`None` leaves, packed params by the paths they hold."""
    out: list[str] = []
    for path, leaf in zip(*flatten(tree)[:2]):
        if is_unit(leaf):
            out.extend(leaf.paths(path))
        elif leaf is not None:
            out.append(path)
    return out


def merge_by_path(base: Any, parts: Iterable[tuple[Any, Any]]) -> Any:
    """`base` with the leaves each group's inner step transformed replaced by its output.

    Args:
        base: the full updates tree.
        parts: `(group_input, group_output)` pairs: the restricted updates a group's inner
            step received and what it returned, both with `base`'s structure.
    """
    _, out, treedef = flatten(base)
    out = list(out)
    for given, result in parts:
        _, inputs, _ = flatten(given)
        _, outputs, result_def = flatten(result)
        if result_def != treedef:
            raise ValueError(
                "an inner transformation changed the structure of the updates "
                f"(expected {treedef}, got {result_def})."
            )
        for i, (x, y) in enumerate(zip(inputs, outputs)):
            if x is not None:
                out[i] = y
    return treedef.unflatten(out)
