"""The one helper that lifts per-array math to trees of paths.

Transformations write their math for one array; these functions do the tree plumbing: paths,
`None` leaves (no gradient: no update, state unchanged), partial updates (only the paths
present in `updates` advance), state dtypes (a slot keeps its dtype), and boundary checks that
name the offending path.

Per-leaf state lives in *slots*: `{slot_name: {path: array}}`, e.g. Adam's
`{"mu": {...}, "nu": {...}, "count": {...}}`.

Packed params (`gradtx.pack`) are one unit here: the per-array math runs once per buffer, and
their slots are `Packed` with the same layout (a step count is one scalar per buffer, since a
packed gradient always covers the whole buffer). A transformation that needs each leaf's own
shape (per-leaf norms, matrices) says so with `per_leaf=True` and runs leaf by leaf.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from gradtx._core.call_checks import check_complete
from gradtx._core.protocol import Params, State, Updates
from gradtx._core.update_sharding import explicit, in_state_layout
from gradtx._core.widening import note_state_read, promoted
from gradtx._layouts.buffer_masks import mask_array
from gradtx._layouts.complex import (
    check_same_kind,
    from_real,
    is_complex,
    reject_complex_packed,
    to_real,
)
from gradtx._layouts.packed import (
    Packed,
    check_same_layout,
    join_leaves,
    join_path,
    reading_views,
    slice_leaf,
)
from gradtx._layouts.step_counts import StepCounts
from gradtx._paths.paths import flatten, is_unit

# `{slot name: {path: value}}`; a slot that counts steps is a `StepCounts`.
Slots = dict[str, Mapping[str, Any]]


def compute_dtype(*arrays: Any) -> Any:
    """The dtype per-leaf math runs in: at least float32, float64 stays float64.

    Hyperparameters are float32, so `b2 = 0.999` never rounds to 1 for bfloat16 params.
    """
    return promoted(jnp.float32, *(a.dtype for a in arrays))


def cast(x: Any, dtype: Any) -> Any:
    """`x` as an array of `dtype`; `x` itself when it already is one.

    A cast that changes nothing still costs several microseconds of tracing, and the inline
    per-array math runs a few of them per leaf on every trace of a step.
    """
    if isinstance(x, jax.Array) and x.dtype == dtype and not jax.typeof(x).weak_type:
        return x
    return jnp.asarray(x).astype(dtype)


def as_stored(value: Any, slot: Any) -> Any:
    """`value` rounded to `slot`'s storage dtype (and back to its own dtype).

    Computing an update from the state exactly as it is kept means the old state is not read
    again after the new one is written, so with donation XLA overwrites state in place instead
    of copying it first; it also makes a restored checkpoint continue bit-for-bit.
    """
    return cast(cast(value, slot.dtype), value.dtype)


def update_dtype(g: Any, slots: dict[str, Any], key: Any = None) -> Any:
    """The dtype of the update at one path.

    It is the promoted dtype of the gradient `g` and of the floating state `slots` it read: a
    bfloat16 gradient with float32 moments gives float32, with bfloat16 moments bfloat16.

    Within a chain, the read is noted under `key` so the chain rounds that path's update to
    the same dtype at its end (see gradtx/_core/widening.py).
    """
    read = [v.dtype for v in slots.values() if _is_float(v)]
    if not read:
        return g.dtype
    read_dtype = promoted(*read)
    if key is not None:
        note_state_read(key, read_dtype)
    return promoted(g.dtype, read_dtype)


def _only(slots: dict[str, Any], names: set[str]) -> dict[str, Any]:
    return {name: value for name, value in slots.items() if name in names}


def _is_float(x: Any) -> bool:
    return jnp.issubdtype(getattr(x, "dtype", np.int32), jnp.floating)


def zeros_for(param: Any, dtype: Any = None) -> jax.Array:
    """Zeros shaped like `param` (an array, tracer or `jax.ShapeDtypeStruct`) with its sharding.

    Under `jit` with automatic sharding a tracer's sharding is unknown at trace time and plain
    zeros would come out replicated, so the zeros are derived from the parameter's data, which
    makes XLA give them the parameter's sharding (init runs once; the extra read is free).
    """
    dtype = param.dtype if dtype is None else jnp.dtype(dtype)
    if isinstance(param, jax.ShapeDtypeStruct):
        sharding = getattr(param, "sharding", None)
        return jnp.zeros(param.shape, dtype, device=sharding)
    if not isinstance(param, Tracer):
        return jnp.zeros_like(param, dtype=dtype)  # copies a concrete array's sharding
    if split_explicitly(param):  # explicit sharding is known while tracing
        return jnp.zeros_like(param, dtype=dtype)
    if param.size == 0 or not jnp.issubdtype(param.dtype, jnp.inexact):
        return jnp.zeros_like(param, dtype=dtype)
    return jnp.abs(jnp.nan_to_num(param * 0, nan=0.0, posinf=0.0, neginf=0.0)).astype(dtype)


def split_explicitly(x: Any) -> bool:
    """Whether `x` is split over devices by an explicit sharding (visible while tracing)."""
    spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", None) or ()
    return any(axis is not None for axis in spec)


def _shape_dtype(x: Any) -> tuple[tuple, Any]:
    return tuple(np.shape(x)), getattr(x, "dtype", None)


def _as_param(param: Any, path: str) -> Any:
    """`param` as a leaf with a shape and a dtype: a Python number becomes an array.

    Anything else (a function or a string field of an Equinox module) raises, naming the path.
    """
    if hasattr(param, "shape") and hasattr(param, "dtype"):
        return param
    if isinstance(param, (bool, int, float, complex)):
        return jnp.asarray(param, jax.dtypes.canonicalize_dtype(np.result_type(param)))
    raise TypeError(
        f"init: the params leaf at {path!r} is a {type(param).__name__}, not an array. Pass "
        "only the arrays to optimize, with `None` elsewhere: for an Equinox module, "
        "`eqx.filter(model, eqx.is_inexact_array)`."
    )


def init_slots(
    params: Params,
    leaf_init: Callable[[Any], dict],
    names: Iterable[str],
    where=None,
    step_counts: Iterable[str] = (),
) -> Slots:
    """Build slots `{name: {path: leaf_init(param)[name]}}` for the non-`None` leaves.

    Args:
        params: the params tree (arrays or `jax.ShapeDtypeStruct` leaves).
        leaf_init: per-array initialiser returning `{slot_name: array}`.
        names: the slot names; every one exists in the result, even for an empty tree.
        where: optional set of paths; others get no slots.
        step_counts: slots that count a path's updates (the same start for every path, one
            more per update of the path): they are kept as `StepCounts`, one scalar shared
            by all paths until a partial update makes them differ, which also record each
            parameter's shape (`update_slots` checks the gradients against it). Packed
            params keep a count per buffer instead.
    """
    slots: dict[str, Any] = {name: {} for name in names}  # dicts, then the counts
    shapes: dict[str, tuple] = {}  # each parameter's own shape, for its step counts
    paths, leaves, _ = flatten(params)
    for path, param in zip(paths, leaves):
        if is_unit(param):
            reject_complex_packed(param.buffers, "init", path)
            if _unit_selected(param, path, where, "init"):
                for name, value in _init_unit(param, leaf_init).items():
                    slots[name][path] = value
            continue
        if param is None or (where is not None and path not in where):
            continue
        param = _as_param(param, path)
        if slots and not jnp.issubdtype(param.dtype, jnp.inexact):  # state for an int param
            raise TypeError(
                f"init: the parameter at {path!r} has dtype {jnp.dtype(param.dtype).name}: "
                "integer and boolean parameters cannot be trained by gradient steps. Leave it "
                "out of the params (`eqx.filter(model, eqx.is_inexact_array)` for an Equinox "
                "module), freeze it (`gradtx.freeze`) or mask it out (`gradtx.masked`)."
            )
        shapes[path] = tuple(param.shape)
        if is_complex(param):  # complex as pairs of reals: state in the real layout
            param = to_real(param)
        for name, value in leaf_init(param).items():
            slots[name][path] = value
    for name in step_counts:
        values = slots[name]
        if not any(is_unit(v) for v in values.values()):
            first = next(iter(values.values()), None)
            slots[name] = StepCounts.shared(values, first, shapes)
    return slots


def _unit_selected(unit: Packed, path: str, where: set[str] | None, owner: str) -> bool:
    if where is None:
        return True
    hits = {p in where for p in unit.paths(path)}
    if len(hits) > 1:
        raise ValueError(
            f"{owner}: the selection covers some paths of the packed params at {path!r} but "
            "not others, so their state cannot share the packed buffers; pack the selected "
            "and unselected parameters separately."
        )
    return hits == {True}


def _init_unit(param: Packed, leaf_init: Callable[[Any], dict]) -> dict[str, Packed]:
    per_buffer = [leaf_init(buffer) for buffer in param.buffers]
    if not per_buffer:
        return {}
    return {name: param.replace(tuple(b[name] for b in per_buffer)) for name in per_buffer[0]}


def _slot_paths(slots: Slots) -> list[str]:
    """The parameter paths that have state, in order."""
    seen: dict[str, None] = {}
    for values in slots.values():
        seen.update(dict.fromkeys(values))
    return list(seen)


def _missing_state(
    owner: str, slot: str, path: str, known: Mapping, by_path: dict[str, Any] | None
) -> KeyError:
    """The error for a gradient path without state.

    It blames the gradients when the params lack the path too (a typo or a renamed key), else
    the params (changed since `init`).
    """
    if by_path is not None and by_path.get(path) is None:
        near = difflib.get_close_matches(path, [p for p in by_path if p not in known], n=1)
        near = near or difflib.get_close_matches(path, list(by_path), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return KeyError(
            f"{owner}: the gradients have an entry at {path!r}{hint}, but the params have no "
            "parameter there. The gradient tree must have the params' paths: check its keys "
            "(a typo, a renamed or an extra entry)."
        )
    hint = ", ".join(repr(p) for p in list(known)[:6])
    return KeyError(
        f"{owner}: the state has no {slot!r} entry for path {path!r}, which the gradients "
        f"have (state paths: {hint}{', ...' if len(known) > 6 else ''}). If the params changed "
        "since `init`, call `gradtx.reconcile(tx, state, params)` to keep the surviving state "
        "and initialise the new paths; else the gradients' keys are wrong (a typo or an extra "
        "entry)."
    )


def _params_by_path(params: Params | None, owner: str, required: bool) -> dict[str, Any] | None:
    if params is None:
        if required:
            raise ValueError(f"{owner} needs the params: call `tx.update(updates, state, params)`.")
        return None
    paths, leaves, _ = flatten(params)
    return dict(zip(paths, leaves))


def update_slots(
    leaf_update: Callable[..., tuple[Any, dict]],
    updates: Updates,
    slots: Slots,
    params: Params | None = None,
    *,
    owner: str,
    needs_params: bool = False,
    where: set[str] | None = None,
    per_leaf: bool = False,
    masked_update: Callable[..., tuple[Any, dict]] | None = None,
    element_slots: Iterable[str] | None = None,
    shared_values: Iterable[str] = (),
) -> tuple[Updates, Slots]:
    """Apply `leaf_update(g, leaf_slots, param) -> (u, new_leaf_slots)` to every present path.

    Args:
        leaf_update: per-array math; `leaf_slots` is `{slot_name: array}` for that path and
            `param` is the parameter (or `None` when params were not given).
        updates: the gradient/update tree; `None` leaves pass through untouched.
        slots: the transformation's slots, `{slot_name: {path: array}}`.
        params: the params tree, or `None`.
        owner: the transformation's name, used in error messages.
        needs_params: raise a clear error if `params` is `None`.
        where: optional set of paths to transform; other paths pass through unchanged.
        per_leaf: the math needs each leaf's own array (not a packed buffer of many leaves).
        masked_update: `(g, leaf_slots, param, selected) -> (u, new_leaf_slots)` for a
            packed buffer that `where` selects in part (`selected`: a bool array shaped like
            the buffer); it must equal `leaf_update` where `selected` and leave the rest as
            it was. Without it, such a buffer is an error naming the path.
        element_slots: the slots that hold a value per element of the parameter (default:
            all); the update comes out in the promoted dtype of the gradient and these slots
            (see `update_dtype`), so float32 bookkeeping scalars do not widen it.
        shared_values: `StepCounts` slots that keep what `leaf_update` returns instead of
            advancing by one (see `StepCounts.updated`): scalars that change only with the
            count, which the paths of a group compute alike from the group's values.

    Returns:
        The new updates (same structure as `updates`) and the new slots, in which only the
        transformed paths changed; each slot keeps its dtype. A `StepCounts` slot advances
        by one for the transformed paths, whatever `leaf_update` returned for it.

    Raises:
        ValueError: the state of a path was made for a parameter of another shape than its
            gradient's (a count's recorded shape differs, the math would change a slot's
            shape, or it fails on a slot of the gradient's rank and another shape), naming
            the path, the shapes and `gradtx.reconcile`.
    """
    paths, leaves, treedef = flatten(updates)
    by_path = _params_by_path(params, owner, needs_params)
    if by_path is None:  # with params, the outermost `update` checked them (see protocol.py)
        check_complete(owner, paths, _slot_paths(slots))
    counted = {name: values for name, values in slots.items() if isinstance(values, StepCounts)}
    shared = {name for name in shared_values if name in counted}
    counts = set(counted) - shared
    new_slots: dict[str, Any] = {n: dict(v) for n, v in slots.items() if n not in counts}
    advanced: set[str] = set()
    read = set(slots) if element_slots is None else set(element_slots)
    out = []
    on_explicit_axes = explicit(leaves)
    for path, g in zip(paths, leaves):
        if g is None or (where is not None and path not in where and not is_unit(g)):
            out.append(g)
            continue
        leaf_slots = {}
        for name, values in slots.items():
            if path not in values:
                raise _missing_state(owner, name, path, values, by_path)
            leaf_slots[name] = values[path]
        if is_unit(g):
            param = by_path.get(path) if by_path is not None else None
            u, changed = _update_unit(
                leaf_update,
                g,
                leaf_slots,
                param,
                path,
                owner,
                needs_params,
                where,
                per_leaf,
                masked_update,
                read,
            )
            out.append(u)
            for name, value in changed.items():
                new_slots[name][path] = value
            continue
        param = None
        if by_path is not None:
            param = by_path.get(path)
            if param is None and needs_params:
                raise KeyError(f"{owner}: the params have no leaf at path {path!r}.")
            if param is not None and _shape_dtype(param)[0] != tuple(np.shape(g)):
                raise ValueError(
                    f"{owner}: at path {path!r} the update has shape {tuple(np.shape(g))} but "
                    f"the parameter has shape {tuple(np.shape(param))}."
                )
        check_same_kind(g, param, owner, path)
        _check_counted_shape(owner, path, g, counted)
        try:
            if is_complex(g):  # complex as pairs of reals (see gradtx/_layouts/complex.py)
                real = None if param is None else to_real(param)
                u, changed = leaf_update(to_real(g), leaf_slots, real)
                u = from_real(u, g.dtype)
            else:
                g_, param_ = (
                    in_state_layout(g, param, leaf_slots) if on_explicit_axes else (g, param)
                )
                u, changed = leaf_update(g_, leaf_slots, param_)
                u = cast(u, update_dtype(g, _only(leaf_slots, read), path))
        except (TypeError, ValueError, IndexError) as e:
            # Math that failed on a state made for another shape: say so, not where it broke.
            _check_state_shapes(
                owner, path, g, {n: v for n, v in leaf_slots.items() if n in read}, e
            )
            raise
        out.append(u)
        advanced.add(path)
        for name, value in changed.items():
            if name not in counts:
                old = leaf_slots[name]
                if np.shape(value) != np.shape(old):  # the math broadcast the state
                    raise _made_for_another_shape(
                        owner, path, g, f"its state {name!r} has shape {np.shape(old)}"
                    )
                new_slots[name][path] = cast(value, old.dtype)
    for name in counts:
        new_slots[name] = counted[name].advanced(advanced)
    for name in shared:
        new_slots[name] = counted[name].updated({p: new_slots[name][p] for p in advanced})
    return treedef.unflatten(out), {name: new_slots[name] for name in slots}


def _made_for_another_shape(owner: str, path: str, g: Any, state: str) -> ValueError:
    if is_complex(g) and "step count" not in state:
        state += " (a complex parameter's state holds its real and imaginary parts: (2, *shape))"
    return ValueError(
        f"{owner}: the gradient at {path!r} has shape {tuple(np.shape(g))}, but the state "
        f"there was made for a parameter of another shape: {state}. The params changed since "
        "`init`: call `state, report = gradtx.reconcile(tx, state, params)`, which keeps the "
        "state of unchanged paths and initialises the changed ones anew."
    )


def _check_counted_shape(owner: str, path: str, g: Any, counted: Mapping[str, StepCounts]) -> None:
    """Raise if a step count of `path` was made for a parameter of another shape than `g`'s.

    A count is a scalar, so `init` records its parameter's shape in the count's layout.
    """
    for name, counts in counted.items():
        made = counts.shape(path)
        if made is not None and made != tuple(np.shape(g)):
            raise _made_for_another_shape(
                owner, path, g, f"its step count {name!r} was made for shape {made}"
            )
        return  # the counts of one state record the same shapes


def _check_state_shapes(
    owner: str, path: str, g: Any, leaf_slots: dict[str, Any], error: Exception
) -> None:
    """After math failed on `path`: raise naming a state array not shaped like `g`.

    Suspects are arrays of as many dimensions as the math's gradient, and others whose shape
    the error names beside the gradient's (JAX's "incompatible shapes: (3, 2), (3,)"): state
    of another rank (factored moments, per-path scalars) is otherwise meant to differ.
    """
    shape = tuple(np.shape(to_real(g) if is_complex(g) else g))
    told = str(error)
    for name, value in leaf_slots.items():
        own = tuple(np.shape(value))
        named = str(own) in told and str(shape) in told
        if own and own != shape and (len(own) == len(shape) or named):
            raise _made_for_another_shape(
                owner, path, g, f"its state {name!r} has shape {own}"
            ) from error


def map_updates(
    fn: Callable[[Any, Any], Any],
    updates: Updates,
    params: Params | None = None,
    *,
    owner: str,
    needs_params: bool = False,
    where: set[str] | None = None,
) -> Updates:
    """Stateless lift: `fn(g, param) -> u` over the present paths (see `update_slots`)."""

    def leaf_update(g: Any, _: dict, param: Any) -> tuple[Any, dict]:
        return fn(g, param), {}

    new_updates, _ = update_slots(
        leaf_update, updates, {}, params, owner=owner, needs_params=needs_params, where=where
    )
    return new_updates


def _update_unit(
    leaf_update: Callable[..., tuple[Any, dict]],
    g: Packed,
    leaf_slots: dict[str, Any],
    param: Any,
    path: str,
    owner: str,
    needs_params: bool,
    where: set[str] | None,
    per_leaf: bool,
    masked_update: Callable[..., tuple[Any, dict]] | None,
    read: set[str],
) -> tuple[Packed, dict[str, Packed]]:
    """`update_slots` for packed params: the math per buffer (or per leaf if `per_leaf`)."""
    reject_complex_packed(g.buffers, owner, path)
    for name, value in leaf_slots.items():
        _check_packed_shapes(owner, path, g, name, value)
        check_same_layout(g, value, f"{owner} (state {name!r})", path)
    if param is None and needs_params:
        raise KeyError(f"{owner}: the params have no leaf at path {path!r}.")
    if param is not None:
        check_same_layout(g, param, owner, path)
    layout = g.layout
    new_u, new_slots = [], {name: [] for name in leaf_slots}
    for group, grad in enumerate(g.buffers):
        slots_g = {name: value.buffers[group] for name, value in leaf_slots.items()}
        param_g = None if param is None else param.buffers[group]
        mask = True if where is None else layout.group_mask(group, where, path)
        if mask is not True and mask is not False:
            _check_splittable(slots_g, owner, path)
        if mask is False:
            u, changed = grad, {}
        elif per_leaf:
            dtype = update_dtype(grad, _only(slots_g, read))
            u, changed = _update_by_leaf(
                leaf_update, grad, slots_g, param_g, layout, group, mask, dtype
            )
        elif mask is True:
            u, changed = leaf_update(grad, slots_g, param_g)
        elif masked_update is None:
            raise TypeError(
                f"{owner} selects some paths of the packed buffer at {path!r} but has no "
                "masked update for a buffer that a selection splits; run it per leaf or "
                "pack the selected parameters separately."
            )
        else:
            u, changed = masked_update(grad, slots_g, param_g, mask_array(mask))
        if mask is not False:
            u = cast(u, update_dtype(grad, _only(slots_g, read), (path, group)))
        new_u.append(u)
        for name, old in slots_g.items():
            new_slots[name].append(cast(changed.get(name, old), old.dtype))
    return g.replace(tuple(new_u)), {
        name: g.replace(tuple(buffers)) for name, buffers in new_slots.items()
    }


def _check_packed_shapes(owner: str, path: str, g: Packed, name: str, state: State) -> None:
    """Raise if packed state `name` was made for leaves of other shapes than `g`'s, naming them."""
    if not isinstance(state, Packed) or state.layout == g.layout:
        return
    made = {spec.path: spec.shape for spec in state.layout.specs}
    for spec in g.layout.specs:
        if spec.path in made and made[spec.path] != spec.shape:
            where = join_path(path, spec.path)
            raise ValueError(
                f"{owner}: the packed gradient at {where!r} has shape {spec.shape}, but the "
                f"packed state {name!r} was made for a parameter of shape {made[spec.path]} "
                "there. The params changed since `init`: call `state, report = "
                "gradtx.reconcile(tx, state, params)`, which keeps the state of unchanged paths "
                "and initialises the changed ones anew."
            )


def _check_splittable(slots_g: dict[str, Any], owner: str, path: str) -> None:
    for name, value in slots_g.items():
        if np.ndim(value) == 0:
            raise ValueError(
                f"{owner}: the selection splits a packed buffer of {path!r}, but state "
                f"{name!r} is one value for the whole buffer; pack the selected parameters "
                "separately."
            )


def _update_by_leaf(
    leaf_update: Callable[..., tuple[Any, dict]],
    grad: Any,
    slots_g: dict[str, Any],
    param_g: Any,
    layout: Any,
    group: int,
    mask: Any,
    dtype: Any,
) -> tuple[Any, dict]:
    """Per-leaf math on each leaf of one buffer, the updates in `dtype` concatenated back."""
    pieces: list = []
    slot_pieces: dict[str, list] = {name: [] for name in slots_g}
    specs = layout.by_group[group]

    def leaves_of(x: Any) -> list:
        if x is None or np.ndim(x) == 0:
            return [x] * len(specs)
        return [slice_leaf(v, spec) for v, spec in zip(reading_views(x, len(specs)), specs)]

    grads, params = leaves_of(grad), leaves_of(param_g)
    slots = {name: leaves_of(value) for name, value in slots_g.items()}
    for i, spec in enumerate(specs):
        g_leaf = grads[i]
        old = {name: leaves[i] for name, leaves in slots.items()}
        selected = mask is True or (spec.size > 0 and bool(mask[spec.offset]))
        if selected:
            u, changed = leaf_update(g_leaf, old, params[i])
        else:
            u, changed = g_leaf, {}
        pieces.append(cast(u, dtype))
        for name in slots_g:
            slot_pieces[name].append(changed.get(name, old[name]))
    out = {}
    for name, values in slot_pieces.items():
        if np.ndim(slots_g[name]) == 0:  # one value per buffer: every leaf advanced it alike
            out[name] = values[-1] if values else slots_g[name]
        else:
            out[name] = join_leaves(values, np.shape(slots_g[name])) if values else slots_g[name]
    u = join_leaves(pieces, np.shape(grad)) if pieces else grad
    return u, out


def dtype_or_none(dtype: Any, name: str = "dtype") -> Any:
    """A state-dtype argument (`mu_dtype=`, `accumulator_dtype=`, ...) as a numpy dtype or None."""
    if dtype is None:
        return None
    try:
        return jnp.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"`{name}` must be a dtype or None, got {dtype!r}") from e


def check_state_keys(owner: str, state: State, keys: tuple[str, ...]) -> None:
    """Raise a clear error if `state` lacks the keys its transformation's `init` gives it."""
    missing = [k for k in keys if not isinstance(state, Mapping) or k not in state]
    if missing:
        found = list(state) if isinstance(state, Mapping) else type(state).__name__
        raise KeyError(
            f"{owner}: expected the state made by its init, with keys {list(keys)}, got "
            f"{found}; was it made by another transformation's init?"
        )
