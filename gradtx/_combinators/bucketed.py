"""Bucketed execution: a tree's optimizer state in one flat buffer per dtype.

On a tree of many small leaves the per-leaf layout is launch- and compile-bound: XLA emits
and compiles kernels for every leaf and every state slot. `bucketed(tx)` keeps the state of
`tx` in flat buffers (the layout of `gradtx.pack`), concatenates the gradients into them,
runs `tx`'s math once per buffer, and hands each leaf its slice of the result at an offset
held in the state. Offsets kept as runtime values (one int32 scalar per leaf) let XLA share
one slicing kernel among all leaves of a shape; baked in as constants every slice would be
a kernel of its own (measured by `benchmarks/lab/layouts.py`, quoted on the performance page).

Sharded leaves are never joined with others: each keeps a buffer of its own, in its shape
and sharding. Which leaves those are is decided once, at `init`, and kept in the state's
static structure (`BucketOffsets.sharded`), so every `update` packs the same way even under
`jit` with automatic mesh axes, where tracers do not show their sharding.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from gradtx._combinators.wrapper import Wrapper
from gradtx._core.lift import check_state_keys
from gradtx._core.module import static
from gradtx._core.protocol import Params, State, Updates
from gradtx._layouts.packed import (
    LARGE_LEAF,
    Packed,
    buffer_names,
    check_own_buffer_from,
    pack_apart,
    plan_layout,
    sharded_leaves,
    spec_text,
)
from gradtx._paths.paths import is_unit, leaves

OFFSETS = "bucket_offsets"


class BucketOffsets:
    """Each leaf's offset in its bucket, one int32 scalar per path (runtime values).

    Its static part is the bucketed paths and the sharded ones among them (`sharded`), which
    keep a bucket of their own: `init` saw their shardings, and `update`, which may not (a
    tracer under automatic mesh axes shows none), packs as `init` did. It is a unit holding
    no per-path state, so `state_dict` and checkpoints do not see it: the layout is rebuilt
    by `init` from the params.
    """

    __slots__ = ("paths_", "sharded", "values")
    __gradtx_unit__ = True

    def __init__(self, paths: tuple[str, ...], values: tuple, sharded: tuple[str, ...] = ()):
        self.paths_ = paths
        self.values = tuple(values)
        self.sharded = sharded

    def __repr__(self) -> str:
        apart = f", {len(self.sharded)} sharded" if self.sharded else ""
        return f"BucketOffsets({len(self.paths_)} leaves{apart})"

    def paths(self, prefix: str = "") -> list[str]:
        """No per-path state lives here."""
        return []

    def items(self, prefix: str = "") -> Any:
        """No per-path state lives here."""
        return iter(())


jax.tree_util.register_pytree_node(
    BucketOffsets,
    lambda o: (o.values, (o.paths_, o.sharded)),
    lambda aux, values: BucketOffsets(aux[0], tuple(values), aux[1]),
)


def _check_unpacked(tree: Any, owner: str, what: str) -> None:
    for path, leaf in leaves(tree).items():
        if is_unit(leaf):
            raise TypeError(
                f"{owner}: the {what} at path {path!r} are already packed (gradtx.pack); use "
                "the transformation itself on packed params."
            )


def _check_seen(owner: str, offsets: BucketOffsets, updates: Updates) -> None:
    """Refuse gradients sharded where `init` saw no sharding: they would be joined to others.

    `update` runs traced (eager calls too, see `eager_dispatch`), and a tracer shows its
    sharding only under explicit mesh axes: under automatic ones this finds nothing.
    """
    unseen = {
        path: sharding
        for path, sharding in sharded_leaves(updates).items()
        if path not in offsets.sharded and path in offsets.paths_
    }
    if unseen:
        listed = ", ".join(f"{p!r} ({spec_text(s)})" for p, s in list(unseen.items())[:4])
        raise ValueError(
            f"{owner}: the gradients at {listed} are sharded, but `init` did not see their "
            "params sharded, so the state joins them with other leaves. Make the state where "
            "the shardings show: `tx.init` outside `jax.jit` on the sharded params (or on "
            "`jax.ShapeDtypeStruct`s with shardings), or under explicit mesh axes."
        )


def _with_offsets(inner: State, offsets: BucketOffsets, nested: bool) -> dict:
    """The state: `inner`'s entries and the offsets, or with `nested` `inner` as one entry."""
    return {**({"inner": inner} if nested else inner), OFFSETS: offsets}


def _inner_state(state: dict) -> tuple[Any, bool]:
    """The inner transformation's state, and whether it is kept under `inner` (not merged)."""
    if set(state) == {"inner", OFFSETS}:
        return state["inner"], True
    return {k: v for k, v in state.items() if k != OFFSETS}, False


class Bucketed(Wrapper):
    """`tx` with its state in flat buffers per dtype (see `bucketed`)."""

    name: ClassVar[str] = "bucketed"
    own_buffer_from: int | None = static(default=LARGE_LEAF)

    def state_keys(self) -> tuple[str, ...]:
        """The inner state's entries (or `inner`), and the leaves' offsets `bucket_offsets`."""
        return (OFFSETS,)

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """The inner transformation's description, each path's bucket first.

        The bucket is a step without hyperparameters named `bucket float32` (shared with the
        other small leaves of its dtype), `own bucket float32#1 (large)` (at least
        `own_buffer_from` elements) or `own bucket float32#2 (sharded P('x'))` (split over
        devices: never joined with other leaves). Buffers are named as in `Packed`'s repr.
        """
        _check_unpacked(params, self.name, "params")
        sharded = sharded_leaves(params)
        layout, _ = plan_layout(params, own_buffer_from=self.own_buffer_from, apart=sharded)
        names = buffer_names(layout.groups)
        large = self.own_buffer_from
        out = dict(self.inner.describe(params, step))
        for spec in layout.specs:
            name = names[spec.group]
            if spec.path in sharded:
                note = f"own bucket {name} (sharded {spec_text(sharded[spec.path])})"
            elif large is not None and spec.size >= large:
                note = f"own bucket {name} (large)"
            else:
                note = f"bucket {name}"
            out[spec.path] = [(note, {}), *out.get(spec.path, [])]
        return out

    def eval_params(self, state: dict, params: Params) -> Any:
        """The inner's eval weights, computed on the packed params and handed back as a tree."""
        check_state_keys(self.name, state, self.state_keys())
        offsets = state[OFFSETS]
        packed = self._pack(params, "params", offsets.sharded)
        result = self.inner.eval_params(_inner_state(state)[0], packed)
        if result is packed:  # the params themselves: no copy through the buffers
            return params
        return result.unpack(offsets.values)

    def init_state(self, params: Params) -> dict:
        """The inner state for the packed params, each leaf's offset, and the sharded paths."""
        # Decided here, once: `update` may run where shardings do not show (see `bucketed`).
        sharded = tuple(sharded_leaves(params))
        packed = self._pack(params, "params", sharded)
        state = self.inner.init_state(packed)
        offsets = BucketOffsets(
            tuple(s.path for s in packed.layout.specs),
            tuple(jnp.asarray(s.offset, jnp.int32) for s in packed.layout.specs),
            sharded,
        )
        # A dict state takes the offsets in as one more entry; any other is kept under `inner`.
        nested = not isinstance(state, dict) or bool({OFFSETS, "inner"} & set(state))
        return _with_offsets(state, offsets, nested)

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Pack the updates (and params), run the inner step once per buffer, unpack."""
        check_state_keys(self.name, state, self.state_keys())
        offsets = state[OFFSETS]
        known = set(offsets.paths_)
        missing = [p for p, x in leaves(updates).items() if x is None and p in known]
        if missing:
            raise ValueError(
                f"{self.name}: the updates have no gradient at path {missing[0]!r}. Bucketed "
                "state advances every leaf of a buffer together, so partial updates need the "
                "per-leaf layout: use the transformation without `bucketed`."
            )
        _check_seen(self.name, offsets, updates)
        packed = self._pack(updates, "updates", offsets.sharded)
        if tuple(s.path for s in packed.layout.specs) != offsets.paths_:
            extra_paths = sorted(set(s.path for s in packed.layout.specs) - set(offsets.paths_))
            raise KeyError(
                f"{self.name}: the updates hold paths the state was not made for "
                f"({extra_paths[:4]}); call `gradtx.reconcile(tx, state, params)` after "
                "changing the params."
            )
        # Unused packed params are removed by XLA (everything here runs under jit).
        packed_params = None if params is None else self._pack(params, "params", offsets.sharded)
        inner, nested = _inner_state(state)
        new_packed, new_inner = self.inner.step(packed, inner, packed_params, **extra)
        return new_packed.unpack(offsets.values), _with_offsets(new_inner, offsets, nested)

    def _pack(self, tree: Any, what: str, apart: tuple) -> Packed:
        """`tree` (the `what`) packed, the sharded paths `apart` each in a buffer of its own."""
        _check_unpacked(tree, self.name, what)
        return pack_apart(tree, own_buffer_from=self.own_buffer_from, apart=apart)


def bucketed(tx: Any, *, own_buffer_from: int | None = LARGE_LEAF) -> Bucketed:
    """Keep `tx`'s state in one flat buffer per dtype: fast to compile on many small leaves.

    The params stay a normal tree. Each step concatenates the gradients of the small leaves
    into the layout of the state (`gradtx.pack`'s), runs `tx` once per buffer, and gives
    each leaf its slice of the result, cut at an offset stored in the state as a runtime
    value so that XLA compiles one kernel per leaf *shape*. Leaves of at least
    `own_buffer_from` elements (64Ki by default) keep a buffer of their own, which costs no
    copy: bucketing a large leaf saves nothing, and XLA's CPU concatenation of large
    operands is slow. On many small leaves this compiles much faster than the per-leaf
    layout (benchmarks/compile_time.py). A buffer of its own is the leaf in its own
    shape. The results equal `tx`'s on the same params, bit-for-bit, with these
    differences, which are those of packed params:

    - a step count is one value per buffer, not one per path;
    - every present leaf must have a gradient: a `None` gradient (a partial update) is an
      error naming the path, since the whole buffer advances together;
    - a selection that splits a buffer (a weight-decay mask) runs as a `jnp.where` over it,
      and transformations that need each leaf's shape run leaf by leaf over the buffer.

    When `tx`'s state is a dict (every optimizer and `chain`), the offsets are one more entry
    of it and `state_dict` keys are those of `tx` on the same params, so checkpoints move
    between the bucketed and the per-leaf layout (loading into bucketed state needs the
    per-path step counts of a buffer to agree); any other state is kept under `inner`.

    Sharded params: a leaf split over devices (its sharding known and not fully replicated)
    is never joined with other leaves, which would make XLA reshard it (all-gather,
    all-to-all) every step. It keeps a bucket of its own, which is the leaf in its own shape
    and sharding, so its state is what `tx` keeps for it on the tree (with a step count of
    its own; results within an ulp of `tx`'s, as XLA may fuse the sharded step differently);
    replicated and single-device leaves are bucketed as above. `gradtx.explain`
    names each path's bucket. Which leaves are sharded is decided by `init` and kept in the
    state's static structure, so `update` and `eval_params` pack the same way even under
    `jax.jit` with automatic mesh axes, where tracers do not show their sharding. So `init`
    must see the shardings: call it outside `jit` on the sharded arrays, or on
    `jax.ShapeDtypeStruct`s with their shardings (each state buffer is then made directly
    with its sharding), or under `jit` with explicit mesh axes. Under `jax.jit(tx.init)`
    with automatic axes the tracers show no sharding, so every leaf counts as unsharded and
    sharded ones are joined with the others; `out_shardings` cannot undo that (the layout is
    fixed while tracing), and neither can `jax.eval_shape(tx.init, ...)`. Gradients that
    show a sharding `init` did not see (explicit axes) are an error naming the paths.

    Args:
        tx: the transformation whose state to bucket (optax ones are wrapped).
        own_buffer_from: leaves with at least this many elements get a buffer (and, for
            Adam, a step count) of their own; `None` buckets every leaf.

    Examples:
        >>> tx = gradtx.bucketed(gradtx.adam(0.1))
        >>> params = {"a": jnp.ones(2), "b": jnp.ones((2, 2))}
        >>> state = tx.init(params)
        >>> state["mu"]  # the packed unit sits at the root path ""
        {'': Packed(2 leaves in float32[6])}
        >>> u, state = tx.update(jax.tree.map(jnp.ones_like, params), state)
        >>> u["b"]
        Array([[-0.1, -0.1],
               [-0.1, -0.1]], dtype=float32)
        >>> sorted(gradtx.state_dict(state))[:3]
        ['count/a', 'count/b', 'mu/a']
        >>> print(gradtx.explain(tx, params))  # doctest: +NORMALIZE_WHITESPACE
        step 0
        path  steps                                                     lr   wd  b1   b2     frozen  state
        a     bucket float32 > scale_by_adam > scale_by_learning_rate   0.1  0   0.9  0.999          count:i32 mu:f32 nu:f32
        b     bucket float32 > scale_by_adam > scale_by_learning_rate   0.1  0   0.9  0.999          count:i32 mu:f32 nu:f32
    """  # noqa: E501
    check_own_buffer_from(own_buffer_from, "bucketed")
    return Bucketed(tx, own_buffer_from)
