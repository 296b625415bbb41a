"""`state_shardings`: the shardings of an optimizer state, before it exists (ZeRO-1 included)."""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.core import Tracer
from jax.sharding import NamedSharding, PartitionSpec

from gradtx._core.outermost_call import add_init_finisher
from gradtx._core.protocol import Params, State
from gradtx._layouts.packed import join_path, known_shardings, spec_axes
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.paths import flatten, is_unit, owning_path, path_of
from gradtx._state.flax_sharding import DECLARED, declared_shardings, declared_specs

# Set while the state's layout is read from an abstract `init`, which must not place it.
_PLACING: contextvars.ContextVar[bool] = contextvars.ContextVar("placing", default=False)


@dataclasses.dataclass(frozen=True)
class SlotLayout:
    """How one state leaf is laid out, and why.

    Attributes:
        key: the leaf's path in the state (`adam/mu/enc/w`; a packed buffer's ends in its index).
        param: the parameter path it belongs to, or `None` (counts, statistics, scalars).
        sharding: the sharding it gets.
        note: `"as its parameter"`, `"its parameter's, stacked on dim 0"`,
            `"its parameter's, on the dims it keeps"`, `"replicated"`,
            `"replicated: not floating point"` (a random key's bits), with
            `"its parameter's optimizer_sharding"` in place of "its parameter" where the
            parameter declares one (Flax NNX metadata), or under `shard_over`:
            `"over 'data' on dim 0"`, `"over 'data' on dim 0, with 'model'"`,
            `"as its parameter: no dimension divisible by 8"`,
            `"as its parameter: already over 'data'"`.
    """

    key: str
    param: str | None
    sharding: Any
    note: str


def _param_leaves(params: Params) -> dict[str, Any]:
    """Every array leaf of the params by path; a packed unit's buffers under its path."""
    paths, leaves, _ = flatten(params)
    out: dict[str, Any] = {}
    for path, leaf in zip(paths, leaves):
        if leaf is None:
            continue
        if is_unit(leaf):
            for key_path, sub in jax.tree_util.tree_flatten_with_path(leaf)[0]:
                out[join_path(path, path_of(key_path))] = sub
        else:
            out[path] = leaf
    return out


def _sharding_of(path: str, leaf: Any) -> Any:
    sharding = getattr(leaf, "sharding", None)
    if sharding is None:
        what = type(leaf).__name__
        raise ValueError(
            f"state_shardings: the parameter at path {path!r} ({what}) has no sharding; pass "
            "arrays, or `jax.ShapeDtypeStruct(shape, dtype, sharding=...)` for each leaf."
        )
    return sharding


def _replicated(shardings: list[Any]) -> Any:
    """Replication on the params' mesh (or on their one device)."""
    for s in shardings:
        if isinstance(s, NamedSharding):
            return NamedSharding(s.mesh, PartitionSpec())
    for s in shardings:
        if s.is_fully_replicated:
            return s
    raise ValueError(
        "state_shardings: the params' shardings are neither NamedShardings nor replicated; "
        "give each parameter a `jax.sharding.NamedSharding` on one mesh."
    )


def _padded(spec: PartitionSpec, ndim: int) -> list[Any]:
    entries = list(spec)
    return entries + [None] * (ndim - len(entries))


def _kept_dims(shape: tuple[int, ...], param_shape: tuple[int, ...]) -> list[int] | None:
    """Which of the parameter's dims a slot of `shape` keeps (a factored moment drops some)."""
    kept, start = [], 0
    for size in shape:
        while start < len(param_shape) and param_shape[start] != size:
            start += 1
        if start == len(param_shape):
            return None
        kept.append(start)
        start += 1
    return kept


def _spec(entries: list[Any]) -> PartitionSpec:
    """A PartitionSpec without trailing `None`s (`P("data")`, not `P("data", None)`)."""
    return PartitionSpec(*spec_axes(entries))


def _zero1(
    sharding: NamedSharding, shape: tuple[int, ...], axis: str, first: int = 0
) -> tuple[NamedSharding, str]:
    """`sharding` also split over `axis`, and a note saying where.

    On the first free dim from `first` on that the axis size divides, else on a split dim
    that the product of its axes and this one divides. A stack of slots (`first=1`) is split
    along its parameter's dims, so that each device keeps the slices of the same elements.
    """
    spec = _padded(sharding.spec, len(shape))
    if any(entry == axis or (isinstance(entry, tuple) and axis in entry) for entry in spec):
        return sharding, f"as its parameter: already over {axis!r}"
    size = sharding.mesh.shape[axis]
    for dim, (entry, n) in enumerate(zip(spec, shape)):
        if dim >= first and entry is None and n % size == 0 and n >= size:
            spec[dim] = axis
            return NamedSharding(sharding.mesh, _spec(spec)), f"over {axis!r} on dim {dim}"
    # No free dimension: one already split (over "model", say) may take the axis as well.
    mesh_shape = sharding.mesh.shape
    for dim, (entry, n) in enumerate(zip(spec, shape)):
        if entry is None:
            continue
        axes = entry if isinstance(entry, tuple) else (entry,)
        split = size * math.prod(mesh_shape[a] for a in axes)
        if n % split == 0 and n >= split:
            spec[dim] = (*axes, axis)
            note = f"over {axis!r} on dim {dim}, with {', '.join(map(repr, axes))}"
            return NamedSharding(sharding.mesh, _spec(spec)), note
    if not shape:
        return sharding, "as its parameter: a scalar"
    return sharding, f"as its parameter: no dimension divisible by {size}"


def _check_axis(shardings: list[Any], axis: str) -> None:
    meshes = [s.mesh for s in shardings if isinstance(s, NamedSharding)]
    if not meshes:
        raise ValueError(
            f"state_shardings: `shard_over={axis!r}` needs params with NamedShardings on a "
            "mesh that has that axis."
        )
    for mesh in meshes:
        if axis not in mesh.axis_names:
            raise ValueError(
                f"state_shardings: `shard_over={axis!r}` is not an axis of the params' mesh, "
                f"whose axes are {list(mesh.axis_names)}."
            )


def slot_layouts(tx: Any, params: Params, *, shard_over: str | None = None) -> list[SlotLayout]:
    """The layout of every leaf of `tx.init(params)`, in the state's tree order.

    The rules of `state_shardings`, with the reason for each leaf. Nothing is allocated.

    Args:
        tx: the transformation.
        params: arrays or `jax.ShapeDtypeStruct`s, each with a sharding.
        shard_over: a mesh axis to split per-path slots over as well (ZeRO-1), or `None`.

    Returns:
        One `SlotLayout` per leaf of the state.

    Examples:
        >>> params = {"w": jnp.zeros((4, 2))}
        >>> for slot in gradtx.slot_layouts(gradtx.adam(1e-3), params):
        ...     print(slot.key, slot.param, slot.note)
        count/0 None replicated
        mu/w w as its parameter
        nu/w w as its parameter
    """
    return _layouts(tx, params, shard_over)[1]


# A slot's note when its parameter declares where its state lives (`optimizer_sharding`).
_DECLARED_NOTES = {
    "as its parameter": f"as its parameter's {DECLARED}",
    "its parameter's, stacked on dim 0": f"its parameter's {DECLARED}, stacked on dim 0",
    "its parameter's, on the dims it keeps": f"its parameter's {DECLARED}, on the dims it keeps",
}


def _layouts(tx: Any, params: Params, shard_over: str | None) -> tuple[Any, list[SlotLayout]]:
    """The state's tree structure and the layout of each of its leaves."""
    tx = as_transformation(tx, "state_shardings(tx)")
    by_path = _param_leaves(params)
    shardings = {path: _sharding_of(path, leaf) for path, leaf in by_path.items()}
    if not shardings:
        raise ValueError("state_shardings: the params hold no arrays.")
    replicated = _replicated(list(shardings.values()))
    if shard_over is not None:
        _check_axis(list(shardings.values()), shard_over)
    declared = declared_shardings(declared_specs(params), shardings)
    # `bucketed` lays sharded leaves out apart; `init`'s own placement has nothing to place.
    token = _PLACING.set(True)
    try:
        with known_shardings(shardings):
            state = jax.eval_shape(tx.init, params)
    finally:
        _PLACING.reset(token)
    out = []
    treedef = jax.tree.structure(state)
    for key, leaf, owner in _state_leaves(state, by_path):
        shape = tuple(leaf.shape)
        sharding, note = replicated, "replicated"
        # A random key's bits share their parameter's path but hold no value per element.
        if owner is not None and shape and not jnp.issubdtype(leaf.dtype, jnp.inexact):
            sharding, note = replicated, "replicated: not floating point"
        elif owner is not None and shape:
            param = by_path[owner]
            base = declared.get(owner, shardings[owner])
            sharding, note = _slot_sharding(base, shape, tuple(param.shape), replicated)
            if owner in declared:
                note = _DECLARED_NOTES.get(note, note)
            stacked = shape[1:] == tuple(param.shape)
            # ZeRO-1 splits the slots that hold a value per element of the parameter. A
            # factored moment's rows and columns stay as they are (split over one axis on
            # two dims, their outer product would be an illegal layout), and so does a slot
            # of another shape.
            per_element = shape == tuple(param.shape) or stacked
            if shard_over is not None and per_element and isinstance(sharding, NamedSharding):
                sharding, note = _zero1(sharding, shape, shard_over, first=int(stacked))
        out.append(SlotLayout(key, owner if shape else None, sharding, note))
    return treedef, out


def _state_leaves(state: State, params: dict[str, Any]) -> list[tuple[str, Any, str | None]]:
    """`(key, leaf, parameter path or None)` for every leaf of `state`, in tree order.

    A leaf belongs to the longest parameter path that ends its key. A buffer of a packed
    state (`bucketed`, packed params) that holds one leaf in that leaf's shape belongs to it.
    """
    out = []
    found = jax.tree_util.tree_flatten_with_path(state, is_leaf=is_unit)[0]
    for key_path, node in found:
        key = path_of(key_path)
        if not is_unit(node):
            out.append((key, node, owning_path(key, params)))
            continue
        alone = _single_leaf_buffers(node)
        for i, (sub_path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(node)[0]):
            sub_key = join_path(key, path_of(sub_path))
            owner = alone.get(i)
            if owner is None or owner not in params:
                owner = owning_path(sub_key, params)
            out.append((sub_key, leaf, owner))
    return out


def _single_leaf_buffers(unit: Any) -> dict[int, str]:
    """`{buffer index: path}` for the buffers of a packed unit that hold a single leaf."""
    specs = getattr(getattr(unit, "layout", None), "specs", ())
    sizes = collections.Counter(spec.group for spec in specs)
    return {spec.group: spec.path for spec in specs if sizes[spec.group] == 1}


def _slot_sharding(
    param_sharding: Any, shape: tuple[int, ...], param_shape: tuple[int, ...], replicated: Any
) -> tuple[Any, str]:
    """The sharding of a slot of `shape` that belongs to a parameter, and why.

    A slot shaped like its parameter takes its sharding; a stack of such slots (L-BFGS's
    memory, `[memory_size, *shape]`), the same behind its stack dim; a factored one, the
    dims it keeps.
    """
    if shape == param_shape:
        return param_sharding, "as its parameter"
    if not isinstance(param_sharding, NamedSharding):
        return replicated, "replicated"
    if shape[1:] == param_shape:
        spec = [None, *_padded(param_sharding.spec, len(param_shape))]
        return NamedSharding(param_sharding.mesh, _spec(spec)), "its parameter's, stacked on dim 0"
    kept = _kept_dims(shape, param_shape)
    if kept is None:
        return replicated, "replicated: not shaped like its parameter"
    spec = _padded(param_sharding.spec, len(param_shape))
    derived = _spec([spec[d] for d in kept])
    return NamedSharding(param_sharding.mesh, derived), "its parameter's, on the dims it keeps"


def state_shardings(tx: Any, params: Params, *, shard_over: str | None = None) -> Any:
    """The shardings of `tx.init(params)`, computed without allocating the state.

    Use them to create the state directly in place, and as the state's shardings of a
    jitted step:

        shardings = gradtx.state_shardings(tx, abstract_params)
        state = jax.jit(tx.init, out_shardings=shardings)(params)

    Rules, per leaf of the state:

    - a per-path slot shaped like its parameter (Adam's `mu` and `nu`, a momentum trace)
      takes the parameter's sharding; a stack of them (L-BFGS's memory of `memory_size`
      past differences, shaped `[memory_size, *shape]`) takes it on its last dimensions,
      the stack dimension whole; a slot with fewer dimensions (a factored second moment)
      takes the parameter's sharding on the dimensions it keeps;
    - a parameter that declares where its optimizer state lives (a Flax NNX `Variable` with
      `optimizer_sharding` metadata) has its slots laid out by that spec, by the same
      rules, on its mesh or else the one set with `jax.set_mesh`; `init` puts them there
      too, so `nnx.Optimizer` does;
    - everything else (step counts, injected hyperparameters, statistics) is replicated on
      the params' mesh.

    With `shard_over="data"` (ZeRO-1), every per-path slot that holds a value per element
    of its parameter (shaped like it, or a stack of such) is also split over that mesh
    axis, on its first dimension that is not already sharded and that the axis size
    divides (else on a sharded one that the product of its axes and this one divides:
    `("model", "data")`). A slot with no such dimension, or whose parameter is already
    split over the axis (FSDP), stays as its parameter, and so do factored moments and
    slots of other shapes; `gradtx.slot_layouts` says which and why. The step then keeps
    one slice of the optimizer state per device of the axis, and XLA inserts the
    collectives that the layout needs. Under explicit mesh axes the arrays carry these
    shardings in their types, and each update comes out with its parameter's sharding (the
    user's own `update` call reshards it), so the params keep theirs without `jit` being
    told any shardings.

    `gradtx.bucketed` keeps each sharded leaf in a buffer of its own, which its `init` can
    only see outside `jit` under automatic axes: with sharded params, create its state with
    `tx.init(params)` (the arrays come out with these shardings) rather than under `jit`.

    Args:
        tx: the transformation.
        params: the params: arrays, or `jax.ShapeDtypeStruct`s with a `sharding` each (an
            abstract model, before any array exists).
        shard_over: a mesh axis name to split per-path state over as well, or `None`.

    Returns:
        A pytree shaped like `tx.init(params)` whose leaves are `jax.sharding.Sharding`s.

    Raises:
        ValueError: a parameter without a sharding (named by path), a `shard_over` that is
            not an axis of the params' mesh, or an `optimizer_sharding` with no mesh to be on.

    Examples:
        >>> mesh = jax.make_mesh((1,), ("data",))
        >>> replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        >>> abstract = {"w": jax.ShapeDtypeStruct((4, 2), jnp.float32, sharding=replicated)}
        >>> tx = gradtx.adam(1e-3)
        >>> shardings = gradtx.state_shardings(tx, abstract, shard_over="data")
        >>> shardings["mu"]["w"].spec
        P('data',)
        >>> params = {"w": jax.device_put(jnp.zeros((4, 2)), replicated)}
        >>> state = jax.jit(tx.init, out_shardings=shardings)(params)
        >>> state["nu"]["w"].sharding.spec
        P('data',)
    """
    treedef, layouts = _layouts(tx, params, shard_over)
    return jax.tree.unflatten(treedef, [slot.sharding for slot in layouts])


def is_placed(leaf: Any) -> bool:
    """Whether the caller chose where `leaf` lives.

    That is an abstract leaf with a sharding, or an array committed to its devices. An
    uncommitted array (what `jnp` functions return) was not placed, and neither is what is
    restored into it: a committed value would not match the cache key of a step compiled
    for uncommitted arguments, which would then compile again.
    """
    if isinstance(leaf, jax.Array):
        return leaf.committed
    return getattr(leaf, "sharding", None) is not None


def place_state(state: State, tx: Any, params: Params, *, shard_over: str | None = None) -> Any:
    """`state` with each leaf put where `state_shardings(tx, params, shard_over)` says.

    Leaves are matched by their key in the state, so a state whose step counts were regrouped
    (loaded from a checkpoint) is placed too: a leaf the promise does not list is replicated.
    Params that nobody placed (uncommitted arrays, abstract leaves without a sharding) leave
    the state as it is.
    """
    if not any(is_placed(x) for x in jax.tree.leaves(params)):
        return state
    try:
        _, layouts = _layouts(tx, params, shard_over)
    except ValueError:
        return state
    if not layouts:  # a stateless transformation
        return state
    by_key = {slot.key: slot.sharding for slot in layouts}
    replicated = _replicated([slot.sharding for slot in layouts])
    return jax.tree_util.tree_map_with_path(
        lambda kp, leaf: jax.device_put(leaf, by_key.get(path_of(kp), replicated)), state
    )


def _abstract(leaf: Any, fallback: Any) -> Any:
    """`leaf` as a `ShapeDtypeStruct` with its sharding where it has one, else `fallback`."""
    sharding = None if isinstance(leaf, Tracer) else getattr(leaf, "sharding", None)
    return jax.ShapeDtypeStruct(
        leaf.shape, leaf.dtype, sharding=fallback if sharding is None else sharding
    )


def _put(leaf: Any, sharding: NamedSharding) -> Any:
    if not isinstance(leaf, Tracer):
        return jax.device_put(leaf, sharding)
    explicit = getattr(jax.sharding.AxisType, "Explicit", None)
    if explicit is not None and explicit in getattr(sharding.mesh, "axis_types", ()):
        return jax.sharding.reshard(leaf, sharding)  # explicit axes: the type changes too
    return jax.lax.with_sharding_constraint(leaf, sharding)


def place_declared(tx: Any, state: State, params: Params) -> Any:
    """The state with the slots of each parameter that declares `optimizer_sharding` there.

    Runs on the outermost `init`'s state, so that `nnx.Optimizer(model, tx)` lays the state
    out as the model says, as it does for optax's. Eagerly the slots are put in place; while
    tracing (`init` under `jit`), they are constrained to it. Other slots stay as `init` made
    them (they follow their parameter).
    """
    if _PLACING.get():
        return state
    declared = declared_specs(params)
    if not declared:
        return state
    own = {
        path: leaf.sharding
        for path, leaf in _param_leaves(params).items()
        if isinstance(leaf, jax.Array) and not isinstance(leaf, Tracer)
    }
    mesh = next(iter(declared_shardings(declared, own).values())).mesh
    fallback = NamedSharding(mesh, PartitionSpec())  # for leaves traced under `jit`
    abstract = jax.tree.map(lambda x: _abstract(x, fallback), params)
    _, layouts = _layouts(tx, abstract, None)
    targets = {slot.key: slot for slot in layouts if slot.param in declared}

    def place(key_path: Any, leaf: Any) -> Any:
        slot = targets.get(path_of(key_path))
        if slot is None:
            return leaf
        assert slot.param is not None  # `targets` holds only slots of declared params
        try:
            return _put(leaf, slot.sharding)
        except ValueError as e:  # a spec the slot's shape does not divide
            raise ValueError(
                f"the parameter at path {slot.param!r} declares {DECLARED}="
                f"{declared[slot.param]}, which does not fit its state {slot.key!r} of shape "
                f"{tuple(leaf.shape)}: {e}"
            ) from e

    return jax.tree_util.tree_map_with_path(place, state)


add_init_finisher(place_declared)
