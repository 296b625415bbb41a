"""The checks of the user's own call: partial updates said out loud, array leaves, shapes.

A gradient tree that silently lacks paths of the params would freeze those parameters: almost
always a typo in a key, or a subtree left out by mistake. So the outermost `update` call checks
that every parameter path is present in the gradients, as an array or as a `None` leaf ("no
gradient", Equinox's convention), unless the caller declares the update partial:
`tx.update(grads, state, params, partial=True)`. The declaration holds for the whole call (a
chain's children, a partition's groups), since combinators hand them the same paths. The
outermost call also checks that each gradient has its parameter's shape, and, traced as the
body of a loop that carries the state, that the state keeps its structure; its `init` checks
the schedules. All of it runs while tracing: the compiled step holds none of it. The order in
which they run is in gradtx/_core/outermost_call.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from gradtx._core.module import is_schedule
from gradtx._layouts.step_counts import StepCounts
from gradtx._paths.paths import is_unit
from gradtx._paths.subset import present_paths

_local = threading.local()


def partial_allowed() -> bool:
    """Whether the running `update` call was declared partial (False outside any call)."""
    return getattr(_local, "partial", False)


@contextlib.contextmanager
def declared(partial: bool) -> Iterator[bool]:
    """Run an `update` call, partial if it says so or if an enclosing call did; yields that."""
    before = partial_allowed()
    _local.partial = allowed = bool(partial) or before
    try:
        yield allowed
    finally:
        _local.partial = before


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


def check_leaves(owner: str, what: str, paths: Sequence[str], leaves: Sequence[Any]) -> None:
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
        if what == "gradients" and not jnp.issubdtype(dtype, np.inexact):
            name = "float0" if dtype == jax.dtypes.float0 else np.dtype(dtype).name
            raise TypeError(
                f"{owner}: the gradient at {path!r} has dtype {name}: integer and boolean "
                "parameters cannot be trained by gradient steps. Leave them out of the params "
                f"(or freeze or mask them, with `None` as their gradient). {_FILTER_HINT}"
            )


def check_shapes(
    owner: str, paths: Sequence[str], grads: Sequence[Any], params: dict[str, Any]
) -> None:
    """Raise if a gradient's shape differs from its parameter's (`params`: `{path: leaf}`).

    Dtypes may differ (bfloat16 gradients of float32 params); shapes may not. `None`
    leaves on either side are skipped, and packed trees are compared by their layouts where
    the update runs.
    """
    for path, g in zip(paths, grads):
        if g is None or is_unit(g):
            continue
        param = params.get(path)
        if param is None or is_unit(param):
            continue
        have, want = tuple(np.shape(g)), tuple(np.shape(param))
        if have != want:
            raise ValueError(
                f"{owner}: at path {path!r} the update has shape {have} but the parameter has "
                f"shape {want}. Each gradient must have its parameter's shape (only its dtype "
                "may differ): check that the gradients were taken of these params."
            )


# The loops whose body's carry must keep one structure, by the name JAX traces them under.
_LOOPS = {
    "scan": "jax.lax.scan",
    "fori_loop": "jax.lax.fori_loop",
    "while_body": "jax.lax.while_loop",
}


def _carrying_loop(state: Any) -> str | None:
    """The loop whose body is being traced with `state` among its own values, or None.

    JAX names what it traces a function for (`scan`, `jit`, ...); a state whose arrays are
    values of that very trace came in through the body's arguments: the carry (or a slice
    of the loop's inputs). Anything JAX does not say reads as no loop.
    """
    try:
        from jax._src import core

        trace = core.trace_ctx.trace
        loop = _LOOPS.get(trace.frame.debug_info.traced_for)
    except (AttributeError, ImportError):
        return None
    if loop is None:
        return None
    for leaf in jax.tree_util.tree_leaves(state):
        if isinstance(leaf, Tracer):
            return loop if getattr(leaf, "_trace", None) is trace else None
    return None


def _split_counts(state: Any, new_state: Any) -> list[str]:
    """Where in `state` a `StepCounts` is kept in other groups in `new_state` (`adam/count`)."""
    is_counts = lambda x: isinstance(x, StepCounts)  # noqa: E731
    old = jax.tree_util.tree_flatten_with_path(state, is_leaf=is_counts)[0]
    new = dict(jax.tree_util.tree_flatten_with_path(new_state, is_leaf=is_counts)[0])
    out = []
    for key, counts in old:
        after = new.get(key)
        if is_counts(counts) and isinstance(after, StepCounts) and after.layout != counts.layout:
            out.append(jax.tree_util.keystr(key, simple=True, separator="/"))
    return out


def check_stable_carry(owner: str, updates: Any, state: Any, new_state: Any) -> None:
    """Raise if, in a loop body that carries `state`, the update changed its structure.

    A partial update from a state whose step counts all paths share keeps them one per path
    from then on (see gradtx/_layouts/step_counts.py): a new layout, which a loop's carry
    cannot take. JAX would refuse the carry without saying why or what to do.
    """
    loop = _carrying_loop(state)
    if loop is None or jax.tree.structure(new_state) == jax.tree.structure(state):
        return
    split = _split_counts(state, new_state)
    if not split:
        raise TypeError(
            f"{owner}: inside `{loop}`, this update returns a state of another structure than "
            "the state it was given, which the loop's carry cannot take. Start the loop from "
            "the state of one step taken before it."
        )
    present = set(present_paths(updates))
    counts = jax.tree_util.tree_leaves(state, is_leaf=lambda x: isinstance(x, StepCounts))
    absent = sorted({p for c in counts if isinstance(c, StepCounts) for p in c} - present)
    shown = ", ".join(repr(p) for p in absent[:4]) + (", ..." if len(absent) > 4 else "")
    where = ", ".join(repr(w) for w in split[:4]) + (", ..." if len(split) > 4 else "")
    raise TypeError(
        f"{owner}: inside `{loop}`, this update leaves out {shown} (`None` or absent "
        f"gradients), so the step counts at {where}, one value shared by their paths until "
        "now, become one value per path: the state coming out of the loop body is laid out "
        "differently from the state going in, which the loop's carry cannot be. Start the "
        "loop from a state that has taken such a partial step already: run the first step "
        "before the loop (`updates, state = tx.update(grads, state, params)`) and loop over "
        "the rest. From then on the counts stay one per path, whichever paths a step leaves "
        "out."
    )


def check_schedules(tx: Any) -> None:
    """Raise if a hyperparameter given as a schedule does not return one number per step.

    Each schedule (or plain function of the step) is traced once, abstractly, at a scalar
    int32 step: it must return a real numeric scalar (shape `()`). The error names the
    transformation, the argument, and the shape or type it returned.
    """
    for f in dataclasses.fields(tx):
        if not f.metadata.get("hyperparam"):
            continue
        value = getattr(tx, f.name)
        if not is_schedule(value):
            continue
        returned: list[Any] = []

        def probe(step: Any, schedule: Any = value, returned: list = returned) -> Any:
            out = schedule(step)
            returned.append(out)
            return out if isinstance(out, (jax.Array, np.ndarray, np.generic)) else None

        try:
            out = jax.eval_shape(probe, jax.ShapeDtypeStruct((), np.int32))
        except Exception as e:  # noqa: BLE001 - any failure is the schedule's: say whose
            raise TypeError(
                f"{tx.name}: the schedule given as `{f.name}` fails when called with a step "
                f"count (an int32 scalar): {type(e).__name__}: {e}"
            ) from e
        if out is None:
            first = returned[0] if returned else None
            if isinstance(first, (int, float)) and not isinstance(first, bool):
                continue  # a constant Python number: fine
            problem = f"type {type(first).__name__ if returned else 'nothing'}"
        elif out.shape != () or not any(
            jnp.issubdtype(out.dtype, kind) for kind in (np.integer, np.floating)
        ):
            problem = f"shape {out.shape}, dtype {out.dtype}"
        else:
            continue
        raise TypeError(
            f"{tx.name}: the schedule given as `{f.name}` must return a real number per step "
            f"(shape ()), got {problem}."
        )
