"""Packed parameters: a params tree kept in one flat buffer per dtype.

A model with thousands of small leaves makes XLA emit one kernel per leaf for every
elementwise step of the optimizer, and compile time grows with the number of distinct kernels
and outputs. `pack` stores the leaves in a few flat buffers instead; the model reads its leaves
back with `unpack`, whose gradient arrives already packed, so the whole optimizer step is a
handful of kernels over the buffers.

Paths stay the identity: the lifting helper, selectors, `apply_updates`, `global_norm`,
`state_dict` and `load_state_dict` see a `Packed` as the leaves it holds (`enc/w`, ...), so a
checkpoint of a packed model restores into the unpacked one and back.

Leaves split over devices (sharded) are never packed by `pack`: joined with other leaves into
one buffer they would be resharded (all-gathered) at every step. `bucketed` packs the others
and keeps each sharded leaf in a buffer of its own, in its shape and sharding (`pack_apart`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.core import Tracer
from jax.sharding import NamedSharding, PartitionSpec

from gradtx._paths.cache import BoundedCache
from gradtx._paths.paths import flatten, is_unit

# Leaves of at least this many elements are not worth copying into a shared buffer: at 64Ki
# float32 elements Adam's step on a leaf already costs several kernel launches' worth of
# memory traffic, while XLA's CPU concatenation of large operands is slow
# (benchmarks/lab/layouts.py). (`bucketed` gives them a buffer of their own; `global_norm`
# reduces them where they lie.)
LARGE_LEAF = 1 << 16

# XLA's GPU multi-output fusion weighs every pair of fusions that read one operand. A buffer
# sliced into many leaves gave it a pair count quadratic in the leaves, most of the GPU compile
# of the many-leaf MLP. Leaves read through views of 64 leaves
# each cut that pass to a small part of it (benchmarks/compile_time.py, on a GPU).
LEAVES_PER_VIEW = 64


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    """Where one leaf lives: its path, buffer (group), offset and shape."""

    path: str
    group: int
    offset: int
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass(frozen=True, eq=False)
class Layout:
    """The static description of a `Packed`: the original tree and where each leaf lives.

    Attributes:
        treedef: the structure of the original tree (`None` leaves included).
        specs: one `LeafSpec` per non-`None` leaf, in tree order.
        groups: each buffer's dtype, by name (`"float32"`, `"bfloat16"`, ...); a dtype has
            several buffers when large leaves have their own (see `pack`).
        sizes: the number of elements of each buffer.

    A buffer that holds a single leaf of one or more dimensions keeps that leaf's shape
    (`buffer_shapes`); the others are 1-D. Viewed as 1-D, a param that weight decay reads
    would reach XLA's fused update in two shapes, and XLA updates a donated buffer in place
    only when every use in the kernel is elementwise: it copied each such param instead.
    """

    treedef: Any
    specs: tuple[LeafSpec, ...]
    groups: tuple[str, ...]
    sizes: tuple[int, ...]

    # JAX hashes and compares a pytree's static data on every jitted call. The generated
    # dataclass methods walk every `LeafSpec` in Python, a noticeable part of a packed step
    # (benchmarks/lab/host_overhead.py), so the key is built once, of plain tuples compared in C.
    @functools.cached_property
    def _key(self) -> tuple:
        specs = tuple((s.path, s.group, s.offset, s.shape) for s in self.specs)
        return (self.treedef, specs, self.groups, self.sizes)

    @functools.cached_property
    def _hash(self) -> int:
        return hash(self._key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, Layout) and self._hash == other._hash and self._key == other._key
        )

    @functools.cached_property
    def all_paths(self) -> tuple[str, ...]:
        return flatten(self.treedef.unflatten([None] * self.treedef.num_leaves))[0]

    @functools.cached_property
    def buffer_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Each buffer's shape: its leaf's for a buffer of one leaf (not a scalar), else 1-D."""
        return tuple(
            specs[0].shape if len(specs) == 1 and specs[0].shape else (size,)
            for specs, size in zip(self.by_group, self.sizes)
        )

    @functools.cached_property
    def by_group(self) -> tuple[tuple[LeafSpec, ...], ...]:
        return tuple(tuple(s for s in self.specs if s.group == g) for g in range(len(self.groups)))

    def group_mask(self, group: int, chosen: set[str], prefix: str) -> Any:
        """`True`/`False` if all/none of a buffer's paths are in `chosen`, else a bool mask."""
        specs = self.by_group[group]
        hits = np.fromiter((join_path(prefix, s.path) in chosen for s in specs), bool, len(specs))
        if hits.all():
            return True
        if not hits.any():
            return False
        # Kept per selection: every trace of a step asks again, and the result (read-only)
        # stays the same object, so what is derived from it can be kept too (its bits).
        key = (group, hits.tobytes())
        mask = self._masks.get(key)
        if mask is None:
            # A buffer's leaves lie end to end in spec order (see `pack`).
            mask = np.repeat(hits, [s.size for s in specs])
            mask.flags.writeable = False
            self._masks.remember(key, mask)
        return mask

    @functools.cached_property
    def _masks(self) -> BoundedCache:
        return BoundedCache(16)

    @functools.cached_property
    def structure(self) -> Any:
        """The original tree with `jax.ShapeDtypeStruct` leaves (see `Packed.structure`)."""
        return self.tree_of(jax.ShapeDtypeStruct(s.shape, self.groups[s.group]) for s in self.specs)

    def tree_of(self, values: Iterable[Any]) -> Any:
        """The original tree with `values` (one per spec, in order) at the held paths."""
        flat = dict(zip((s.path for s in self.specs), values))
        return self.treedef.unflatten([flat.get(p) for p in self.all_paths])


_LAYOUTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _interned(layout: Layout) -> Layout:
    """The one live `Layout` equal to `layout`.

    Params and gradients packed apart then share it, so JAX's check of the static data on
    every jitted call is an identity test.
    """
    return _LAYOUTS.setdefault(layout, layout)


def join_path(prefix: str, path: str) -> str:
    """`prefix/path`, or either alone when the other is empty."""
    return f"{prefix}/{path}" if prefix and path else prefix or path


_OFFSETS: BoundedCache = BoundedCache(256)


class Packed:
    """A params tree held in one flat buffer per dtype (see `pack`).

    A pytree whose children are the buffers, so `jax.grad`, `jax.jit`, donation and optax
    see plain arrays; its static part is the `Layout`. gradtx's own functions address its
    contents by the original paths.

    Slot values made by transformations for a packed parameter are `Packed` too, with the
    same layout; a buffer of shape `()` there stands for one value shared by every path of
    that buffer (a step count).
    """

    __slots__ = ("buffers", "layout")
    __gradtx_unit__ = True

    def __init__(self, layout: Layout, buffers: tuple) -> None:
        if len(buffers) != len(layout.groups):
            raise ValueError(
                f"Packed: the layout has {len(layout.groups)} buffers {list(layout.groups)}, "
                f"got {len(buffers)}."
            )
        self.layout = layout
        self.buffers = tuple(buffers)

    def __repr__(self) -> str:
        names = buffer_names(self.layout.groups)
        shapes = [",".join(map(str, shape)) for shape in self.layout.buffer_shapes]
        parts = ", ".join(f"{name}[{shape}]" for name, shape in zip(names, shapes))
        return f"Packed({len(self.layout.specs)} leaves in {parts})"

    # ---- reading the leaves back -------------------------------------------------------

    def offsets(self) -> tuple[jax.Array, ...]:
        """Each leaf's offset in its buffer, as int32 arrays to pass into a jitted step.

        Passing these as an argument of the jitted function makes the offsets runtime values,
        so XLA compiles one slicing kernel per leaf *shape* rather than per leaf; `unpack`
        without them compiles one per leaf (slower to compile on many leaves, same results).

        Examples:
            >>> packed = gradtx.pack({"a": jnp.ones(2), "b": jnp.ones(3)})
            >>> [int(o) for o in packed.offsets()]
            [0, 2]
        """
        cached = _OFFSETS.get(self.layout)
        if cached is None:
            offsets = tuple(jnp.asarray(s.offset, jnp.int32) for s in self.layout.specs)
            cached = _OFFSETS.remember(self.layout, offsets)
        return cached

    def unpack(self, offsets: tuple | None = None) -> Any:
        """The original tree (differentiable: gradients flow back into the buffers).

        Args:
            offsets: `self.offsets()`, passed in as an argument of the jitted function, or
                `None` to slice at offsets fixed at trace time.

        Examples:
            >>> params = {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}
            >>> gradtx.pack(params).unpack()["w"].shape
            (2, 2)
        """
        for group, buffer in enumerate(self.buffers):
            if np.ndim(buffer) == 0 and self.layout.sizes[group]:
                raise ValueError(f"Packed.unpack: buffer {group} holds one shared value.")
        if offsets is not None and len(offsets) != len(self.layout.specs):
            raise ValueError(
                f"Packed.unpack: expected {len(self.layout.specs)} offsets (from "
                f"`packed.offsets()`), got {len(offsets)}."
            )
        return self.layout.tree_of(_unpack(self.layout, self.buffers, offsets))

    def paths(self, prefix: str = "") -> list[str]:
        """The paths of the leaves it holds (under `prefix`), in tree order."""
        return [join_path(prefix, s.path) for s in self.layout.specs]

    def items(self, prefix: str = "") -> Iterator[tuple[str, Any]]:
        """`(path, array)` per leaf: slices of the buffers (a shared scalar is repeated)."""
        for spec in self.layout.specs:
            buffer = self.buffers[spec.group]
            # A shared value is kept, and so is a buffer of one leaf: that leaf, sharding included.
            if np.ndim(buffer) and np.shape(buffer) != spec.shape:
                if isinstance(buffer, jax.ShapeDtypeStruct):
                    buffer = jax.ShapeDtypeStruct(spec.shape, buffer.dtype)
                else:
                    buffer = slice_leaf(buffer, spec)
            yield join_path(prefix, spec.path), buffer

    def structure(self) -> Any:
        """The original tree with `jax.ShapeDtypeStruct` leaves (what selectors look at).

        Built once per layout: selectors read it on every traced `update`.
        """
        return self.layout.structure

    def replace(self, buffers: tuple) -> Packed:
        """The same layout with new buffers."""
        return Packed(self.layout, buffers)

    def map(self, fn: Callable[..., Any], *others: Packed) -> Packed:
        """`fn` applied buffer by buffer to this and `others` (which share the layout)."""
        for other in others:
            check_same_layout(self, other, "Packed.map")
        return self.replace(
            tuple(fn(*bufs) for bufs in zip(self.buffers, *(o.buffers for o in others)))
        )


def check_same_layout(a: Packed, b: Any, owner: str, path: str = "") -> None:
    """Raise a clear error unless `b` is a `Packed` with `a`'s layout."""
    if not isinstance(b, Packed):
        raise TypeError(
            f"{owner}: at path {path!r} one tree holds packed params and the other "
            f"{type(b).__name__}; pack both (gradtx.pack) or neither."
        )
    if a.layout != b.layout:
        mine, theirs = set(a.paths()), set(b.paths())
        detail = sorted(mine ^ theirs)[:4] or "the same paths in another order or dtype"
        raise ValueError(
            f"{owner}: at path {path!r} two packed trees have different layouts ({detail})."
        )


def slice_leaf(buffer: Any, spec: LeafSpec, offset: Any = None) -> Any:
    """The leaf `spec` describes, cut out of its buffer.

    The cut is at `offset` (a runtime value) or, without one, at the spec's static offset.
    """
    if np.shape(buffer) == spec.shape:  # the buffer is the leaf (any other leaf is empty)
        return buffer
    if offset is None:
        flat = lax.slice(buffer, (spec.offset,), (spec.offset + spec.size,))
    else:
        # Offsets are never negative, so the slice needs no wrap-around: without it each
        # leaf traces and lowers three operations fewer (benchmarks/compile_time.py).
        flat = lax.dynamic_slice(buffer, (offset,), (spec.size,), allow_negative_indices=False)
    return lax.reshape(flat, spec.shape)


def reading_views(buffer: Any, count: int) -> list:
    """The arrays to cut `count` consecutive leaves of `buffer` from, one per leaf.

    Traced, a buffer of more than `LEAVES_PER_VIEW` leaves is seen through one
    `optimization_barrier` of several references to it, each shared by `LEAVES_PER_VIEW`
    leaves, so that XLA no longer finds thousands of slices of one operand. The barrier
    copies nothing: its outputs alias the buffer. Otherwise every leaf reads the buffer.
    """
    if count <= LEAVES_PER_VIEW or np.ndim(buffer) == 0 or not isinstance(buffer, Tracer):
        return [buffer] * count
    views = lax.optimization_barrier((buffer,) * -(-count // LEAVES_PER_VIEW))
    return [views[i // LEAVES_PER_VIEW] for i in range(count)]


def _as_1d(leaf: Any) -> Any:
    # `lax.reshape` rather than `jnp.ravel`, a jitted function: traced once per leaf on every
    # trace of a step, it costs several times more (benchmarks/compile_time.py).
    if not isinstance(leaf, jax.Array):
        return jnp.ravel(leaf)
    return leaf if leaf.ndim == 1 else lax.reshape(leaf, (leaf.size,))


def join_leaves(leaves: list, shape: tuple[int, ...]) -> Any:
    """The buffer of `shape` that `leaves` tile, in order (the inverse of `slice_leaf`)."""
    if len(leaves) == 1 and np.shape(leaves[0]) == tuple(shape):
        # A buffer of one leaf is that leaf: viewed as 1-D and back, a sharded leaf would be
        # gathered (and under explicit mesh axes the reshape is refused).
        return leaves[0]
    return lax.reshape(concatenate([_as_1d(leaf) for leaf in leaves]), shape)


def _unpack_leaves(layout: Layout, buffers: tuple, offsets: tuple | None) -> list:
    views = [iter(reading_views(b, len(specs))) for b, specs in zip(buffers, layout.by_group)]
    if offsets is None:
        offsets = (None,) * len(layout.specs)
    return [slice_leaf(next(views[s.group]), s, o) for s, o in zip(layout.specs, offsets)]


_unpack = jax.custom_vjp(_unpack_leaves, nondiff_argnums=(0,))


def _unpack_fwd(layout: Layout, buffers: tuple, offsets: tuple | None) -> tuple:
    return _unpack_leaves(layout, buffers, offsets), offsets


def _unpack_bwd(layout: Layout, offsets: tuple | None, cotangents: list) -> tuple:
    # The leaves tile their buffers exactly, so a buffer's cotangent is one concatenation of
    # its leaves' cotangents (rather than one buffer-sized scatter per leaf).
    pieces: list[list] = [[] for _ in layout.groups]
    for spec, c in zip(layout.specs, cotangents):
        dtype = layout.groups[spec.group]
        pieces[spec.group].append(c if c.dtype == dtype else c.astype(dtype))
    grads = tuple(
        join_leaves(leaves, shape) if leaves else jnp.zeros(shape, dtype)
        for leaves, shape, dtype in zip(pieces, layout.buffer_shapes, layout.groups)
    )
    if offsets is None:
        return grads, None
    return grads, tuple(np.zeros((), jax.dtypes.float0) for _ in offsets)


_unpack.defvjp(_unpack_fwd, _unpack_bwd)


def pack(params: Any, *, own_buffer_from: int | None = None) -> Packed:
    """Keep a params tree in one flat buffer per dtype.

    Use the result as the params everywhere: `tx.init(packed)`, `tx.update(grads, state,
    packed)`, `gradtx.apply_updates(packed, updates)`. Inside the model call
    `packed.unpack(offsets)` to get the tree back; its gradient is a `Packed` with the same
    layout. Selectors, `state_dict` keys and checkpoints use the original paths, so a packed
    and an unpacked model share checkpoints.

    Sharded params are refused (a `ValueError` naming each path and its `PartitionSpec`):
    concatenated with other leaves, or flattened, a leaf split over devices would be
    resharded by XLA (all-gather, all-to-all) at every step. A leaf counts as sharded when its
    sharding is known and not fully replicated: a concrete array's, a `jax.ShapeDtypeStruct`'s
    `sharding`, or a tracer's under explicit mesh axes. Keep sharded params unpacked and use
    `gradtx.bucketed(tx)`, which buckets the optimizer's state and keeps sharded leaves apart.
    Replicated and single-device leaves pack as usual.

    Args:
        params: a pytree of floating-point arrays (`None` leaves are kept as `None`).
        own_buffer_from: leaves with at least this many elements get a buffer of their own
            (the leaf itself, no copy into a shared buffer); `None`: every leaf shares
            its dtype's buffer. Packing pays off for small leaves, whose kernels cost more to
            launch than to run; a large leaf gains nothing from sharing and costs a copy.

    Returns:
        A `Packed` holding one buffer per dtype (plus one per large leaf), leaves in tree
        order.

    Examples:
        >>> params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        >>> packed = gradtx.pack(params)
        >>> packed
        Packed(2 leaves in float32[9])
        >>> offsets = packed.offsets()
        >>> step = jax.jit(lambda p, offsets: jax.grad(lambda p: p.unpack(offsets)["w"].sum())(p))
        >>> step(packed, offsets).buffers[0]
        Array([0., 0., 0., 1., 1., 1., 1., 1., 1.], dtype=float32)
    """
    check_own_buffer_from(own_buffer_from, "pack")
    sharded = sharded_leaves(params)
    if sharded:
        listed = ", ".join(f"{path!r} ({spec_text(s)})" for path, s in list(sharded.items())[:6])
        more = f" and {len(sharded) - 6} more" if len(sharded) > 6 else ""
        raise ValueError(
            f"pack: the params at {listed}{more} are sharded over devices; packed with other "
            "leaves they would be resharded (all-gather / all-to-all) at every step. Keep "
            "sharded params unpacked, and use `gradtx.bucketed(tx)` to bucket the optimizer "
            "state: it keeps each sharded leaf in a buffer of its own."
        )
    return pack_apart(params, own_buffer_from=own_buffer_from)


def pack_apart(
    params: Any, *, own_buffer_from: int | None = None, apart: Collection[str] = ()
) -> Packed:
    """`pack`, with the leaves at the paths `apart` each in a buffer of its own.

    Such a buffer is the leaf in its own shape (and sharding): `bucketed` keeps sharded
    leaves there. No sharding check: the caller chose what goes apart.

    Examples:
        >>> packed = pack_apart({"a": jnp.ones(2), "b": jnp.ones(3)}, apart=("b",))
        >>> packed
        Packed(2 leaves in float32[2], float32#1[3])
    """
    layout, pieces = plan_layout(params, own_buffer_from=own_buffer_from, apart=apart)
    buffers = tuple(_concat(parts, shape) for parts, shape in zip(pieces, layout.buffer_shapes))
    return Packed(layout, buffers)


def plan_layout(
    params: Any, *, own_buffer_from: int | None = None, apart: Collection[str] = ()
) -> tuple[Layout, list[list]]:
    """The `Layout` `pack_apart` gives `params`, and each buffer's leaves (nothing copied).

    Examples:
        >>> layout, pieces = plan_layout({"a": jnp.ones(2), "b": jnp.ones(3)})
        >>> layout.groups, [len(p) for p in pieces]
        (('float32',), [2])
    """
    apart = frozenset(apart)
    paths, leaves, treedef = flatten(params)
    groups: list[str] = []
    pieces: list[list] = []
    sizes: list[int] = []
    shared: dict[str, int] = {}  # dtype name -> index of its shared buffer
    specs = []
    for path, leaf in zip(paths, leaves):
        if leaf is None:
            continue
        if isinstance(leaf, Packed):
            raise TypeError(f"pack: the leaf at path {path!r} is already packed.")
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
            raise TypeError(
                f"pack: the leaf at path {path!r} is {type(leaf).__name__} of dtype {dtype}; "
                "only floating-point arrays can be packed (keep the others outside the Packed)."
            )
        name = jnp.dtype(dtype).name
        alone = path in apart or (
            own_buffer_from is not None and int(np.size(leaf)) >= own_buffer_from
        )
        group = None if alone else shared.get(name)
        if group is None:  # a leaf apart, or the first small leaf of its dtype
            group = len(groups)
            groups.append(name)
            pieces.append([])
            sizes.append(0)
            if not alone:
                shared[name] = group
        spec = LeafSpec(path, group, sizes[group], tuple(np.shape(leaf)))
        specs.append(spec)
        sizes[group] += spec.size
        pieces[group].append(leaf)
    layout = _interned(Layout(treedef, tuple(specs), tuple(groups), tuple(sizes)))
    return layout, pieces


# The params' shardings by path while `gradtx.state_shardings` traces `init` abstractly:
# tracers under automatic mesh axes show no split, and the layout must be the eager one.
_KNOWN_SHARDINGS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "known_shardings", default=None
)


@contextlib.contextmanager
def known_shardings(by_path: dict[str, Any]) -> Iterator[None]:
    """Let `sharded_leaves` read the shardings of traced leaves from `by_path`."""
    token = _KNOWN_SHARDINGS.set(by_path)
    try:
        yield
    finally:
        _KNOWN_SHARDINGS.reset(token)


def sharded_leaves(tree: Any) -> dict[str, Any]:
    """`{path: sharding}` for the leaves of `tree` split over devices.

    A leaf is split by a sharding that is known and not fully replicated. It is unknown for a
    tracer under automatic mesh axes (whose type shows no split) unless `known_shardings`
    gives it, a NumPy array, and a `jax.ShapeDtypeStruct` without one.

    Examples:
        >>> sharded_leaves({"w": jnp.ones(3)})  # one device: nothing is split
        {}
    """
    found = {}
    known = _KNOWN_SHARDINGS.get() or {}
    for path, leaf in zip(*flatten(tree)[:2]):
        if isinstance(leaf, Tracer):
            shardings = [getattr(jax.typeof(leaf), "sharding", None), known.get(path)]
        else:
            shardings = [None if is_unit(leaf) else getattr(leaf, "sharding", None)]
        split = [s for s in shardings if not getattr(s, "is_fully_replicated", True)]
        if split:
            found[path] = split[0]
    return found


def spec_axes(spec: Any) -> tuple:
    """A `PartitionSpec`'s entries without trailing `None`s, which change no layout.

    `P("x")` and `P("x", None)` both give `("x",)`.
    """
    axes = list(spec)
    while axes and axes[-1] is None:
        axes.pop()
    return tuple(axes)


def spec_text(sharding: Any) -> str:
    """A sharding as its `PartitionSpec`, trailing `None`s dropped: `P('x')`, `P(None, 'x')`."""
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return repr(sharding)
    return f"P({', '.join(map(repr, spec_axes(spec)))})"


def check_own_buffer_from(value: Any, owner: str) -> None:
    """`own_buffer_from` is a positive int or `None`."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(
            f"{owner}: `own_buffer_from` must be a positive int or None, got {value!r}."
        )


def _concat(parts: list, shape: tuple[int, ...]) -> Any:
    if all(isinstance(p, jax.ShapeDtypeStruct) for p in parts):
        sharding = _abstract_sharding(parts, shape)
        return jax.ShapeDtypeStruct(shape, parts[0].dtype, sharding=sharding)
    if len(parts) == 1 and np.shape(parts[0]) == shape:
        return jnp.array(parts[0], copy=True)  # a buffer may be donated: never the input
    return join_leaves(parts, shape)


def _abstract_sharding(parts: list, shape: tuple[int, ...]) -> Any:
    """Where the buffer that abstract `parts` make lies, so `init` puts its state there too.

    A buffer of one leaf keeps the leaf's sharding; a shared buffer is replicated over the
    mesh its leaves are all replicated over, else left unplaced (`None`).
    """
    if len(parts) == 1 and parts[0].shape == shape:
        return parts[0].sharding
    shardings = [part.sharding for part in parts]
    if not all(isinstance(s, NamedSharding) and s.is_fully_replicated for s in shardings):
        return None
    meshes = {(s.mesh, s.memory_kind) for s in shardings}
    if len(meshes) != 1:
        return None
    [(mesh, memory_kind)] = meshes
    return NamedSharding(mesh, PartitionSpec(), memory_kind=memory_kind)


def concatenate(flat: list) -> Any:
    """One buffer from 1-D pieces, concatenated in chunks of 64.

    Outside `jit` (`pack` in a notebook), one concatenation of 2000 operands compiles a
    program of its own, several times slower to compile than the chunks, whose 64-operand
    programs are reused. Inside `jit`, XLA merges the chunks into one concatenation again,
    so the compiled step is the same either way.
    """
    chunks = [jnp.concatenate(flat[i : i + 64]) for i in range(0, len(flat), 64)]
    return chunks[0] if len(chunks) == 1 else jnp.concatenate(chunks)


def buffer_names(groups: tuple[str, ...]) -> list[str]:
    """Each buffer's dtype, numbered from the second buffer of a dtype on (`float32#1`)."""
    return [f"{g}#{groups[:i].count(g)}" if g in groups[:i] else g for i, g in enumerate(groups)]


def _flatten_packed_with_keys(p: Packed) -> tuple[tuple, Layout]:
    keys = [jax.tree_util.GetAttrKey(f"buffers[{n}]") for n in buffer_names(p.layout.groups)]
    return tuple(zip(keys, p.buffers)), p.layout


jax.tree_util.register_pytree_with_keys(
    Packed,
    _flatten_packed_with_keys,
    lambda layout, buffers: Packed(layout, tuple(buffers)),
    lambda p: (p.buffers, p.layout),
)


def reject_packed(params: Any, owner: str, why: str) -> None:
    """Raise a clear error for packed params (`gradtx.pack`), which `owner` cannot serve."""
    if any(is_unit(leaf) for leaf in flatten(params)[1]):
        raise TypeError(
            f"{owner} {why}, which packed params (gradtx.pack) cannot hold; apply it to the "
            "unpacked params."
        )
