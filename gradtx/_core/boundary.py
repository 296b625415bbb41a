"""Checks at the boundary of the user's own call: partial updates said out loud, array leaves.

A gradient tree that silently lacks paths of the params would freeze those parameters: almost
always a typo in a key, or a subtree left out by mistake. So the outermost `update` call checks
that every parameter path is present in the gradients, as an array or as a `None` leaf ("no
gradient", Equinox's convention), unless the caller declares the update partial:
`tx.update(grads, state, params, partial=True)`. Inner calls (a chain's children, a partition's
groups) inherit the outermost call's declaration, since combinators hand them the same paths.
"""

from __future__ import annotations

import contextlib
import difflib
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import jax
import numpy as np

from gradtx._paths.paths import is_unit

__all__ = ["check_complete", "check_leaves", "declared", "outermost", "partial_allowed"]

_local = threading.local()


def _stack() -> list[bool]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def partial_allowed() -> bool:
    """Whether the running `update` call was declared partial (False outside any call)."""
    stack = _stack()
    return bool(stack) and stack[-1]


def outermost() -> bool:
    """Whether the running `update` call is the outermost one (the user's own call)."""
    return len(_stack()) == 1


@contextlib.contextmanager
def declared(partial: bool) -> Iterator[bool]:
    """Run an `update` call, partial if it says so or if an enclosing call did; yields that."""
    stack = _stack()
    allowed = bool(partial) or (bool(stack) and stack[-1])
    stack.append(allowed)
    try:
        yield allowed
    finally:
        stack.pop()


def check_complete(owner: str, present: Iterable[str], known: Iterable[str]) -> None:
    """Raise if paths of `known` (the params', or the state's) are absent from the gradients.

    Args:
        owner: the transformation's name, for the message.
        present: every path of the gradient tree, `None` leaves included.
        known: the paths the gradients must cover.
    """
    if partial_allowed():
        return
    present = list(present)
    seen = set(present)
    known = list(known)
    # A path is covered by itself, or by a leaf at one of its prefixes (`{"head": None}`
    # says "no gradient for the whole head").
    missing = [path for path in known if path not in seen and not _under(path, seen)]
    if not missing:
        return
    # A gradient path that is no parameter path, close to a missing one, is likely a typo.
    expected = set(known)
    extra = [path for path in present if path not in expected]
    hints = []
    for path in missing[:3]:
        near = difflib.get_close_matches(path, extra, n=1, cutoff=0.6)
        if near:
            hints.append(f"{near[0]!r} instead of {path!r}?")
    shown = ", ".join(repr(p) for p in missing[:6]) + (", ..." if len(missing) > 6 else "")
    raise ValueError(
        f"{owner}: the gradients have no entry for {len(missing)} parameter path(s): {shown}."
        + (f" A typo in the gradients' keys: {' '.join(hints)}" if hints else "")
        + " A missing path would silently freeze its parameter. If the update is partial on "
        "purpose, say so: put `None` at those paths (no gradient), or call "
        "`tx.update(grads, state, params, partial=True)`."
    )


def _under(path: str, seen: set[str]) -> bool:
    parts = path.split("/")
    return any("/".join(parts[:i]) in seen for i in range(1, len(parts)))


_FILTER_HINT = (
    "Pass only the arrays to optimize, with `None` elsewhere: for an Equinox module, "
    "`eqx.filter(model, eqx.is_inexact_array)` (and the same filter for its gradients)."
)


def check_leaves(owner: str, what: str, paths: list[str], leaves: list[Any]) -> None:
    """Raise if a leaf of the user's `what` tree ("gradients", "params") is no float array.

    `None` leaves and packed params pass; Python and NumPy numbers pass as params. A function,
    a string or an Equinox module's other fields raise naming the path; so do integer,
    boolean and `float0` gradients (from `allow_int=True`), which no optimizer can apply.
    """
    for path, leaf in zip(paths, leaves):
        if leaf is None or is_unit(leaf):
            continue
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or not hasattr(leaf, "shape"):
            if what != "gradients" and isinstance(leaf, (bool, int, float, complex, np.generic)):
                continue
            raise TypeError(
                f"{owner}: the {what} leaf at {path!r} is a {type(leaf).__name__}, not an "
                f"array. {_FILTER_HINT}"
            )
        if what == "gradients" and not jax.dtypes.issubdtype(dtype, np.inexact):
            name = "float0" if dtype == jax.dtypes.float0 else np.dtype(dtype).name
            raise TypeError(
                f"{owner}: the gradient at {path!r} has dtype {name}: integer and boolean "
                "parameters cannot be trained by gradient steps. Leave them out of the params "
                f"(or freeze or mask them, with `None` as their gradient). {_FILTER_HINT}"
            )
