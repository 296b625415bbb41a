"""Packed params (`gradtx.pack`): one buffer per dtype, and paths stay the identity."""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx


def _params() -> dict:
    rng = np.random.default_rng(0)
    return {
        "enc": {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), "b": jnp.zeros(4)},
        "head": [jnp.asarray(rng.normal(size=(5,)), jnp.bfloat16), None],
        "scale": jnp.float32(2.0),
    }


def _loss(params: dict) -> jax.Array:
    enc, head = params["enc"], params["head"][0].astype(jnp.float32)
    return jnp.sum(jnp.tanh(enc["w"] + enc["b"][None, :]) ** 2) + params["scale"] * jnp.sum(head**2)


def test_pack_groups_by_dtype_and_unpacks_to_the_same_tree():
    params = _params()
    packed = gradtx.pack(params)
    assert packed.layout.groups == ("float32", "bfloat16")
    assert [b.shape for b in packed.buffers] == [(17,), (5,)]
    assert packed.paths() == ["enc/b", "enc/w", "head/0", "scale"]
    assert repr(packed) == "Packed(4 leaves in float32[17], bfloat16[5])"
    for offsets in (None, packed.offsets()):
        back = packed.unpack(offsets)
        assert jax.tree.structure(back, is_leaf=lambda x: x is None) == jax.tree.structure(
            params, is_leaf=lambda x: x is None
        )
        for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("runtime_offsets", [True, False])
def test_gradient_through_unpack_arrives_packed(runtime_offsets):
    params = _params()
    packed = gradtx.pack(params)
    offsets = packed.offsets() if runtime_offsets else None

    @jax.jit
    def grad(p, offsets):
        return jax.grad(lambda q: _loss(q.unpack(offsets)))(p)

    g = grad(packed, offsets)
    assert isinstance(g, gradtx.Packed) and g.layout == packed.layout
    expected = jax.grad(_loss)(params)
    for a, b in zip(jax.tree.leaves(g.unpack()), jax.tree.leaves(expected)):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), 1e-6)


def test_jitted_donated_training_matches_the_tree():
    params = _params()
    packed = gradtx.pack(params)
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(0.05, mask="**/w"))

    def tree_step(p, s):
        u, s = tx.update(jax.grad(_loss)(p), s, p)
        return gradtx.apply_updates(p, u), s

    def packed_step(p, s, offsets):
        u, s = tx.update(jax.grad(lambda q: _loss(q.unpack(offsets)))(p), s, p)
        return gradtx.apply_updates(p, u), s

    tree_step = jax.jit(tree_step, donate_argnums=(0, 1))
    packed_step = jax.jit(packed_step, donate_argnums=(0, 1))
    p, s = params, tx.init(params)
    pk, ps = packed, tx.init(packed)
    for _ in range(5):
        p, s = tree_step(p, s)
        pk, ps = packed_step(pk, ps, packed.offsets())
    for a, b in zip(jax.tree.leaves(pk.unpack()), jax.tree.leaves(p)):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), 1e-5)
    norm_p = gradtx.state_dict(ps)["clip_by_global_norm/global_norm"]
    np.testing.assert_allclose(norm_p, gradtx.state_dict(s)["clip_by_global_norm/global_norm"])


def test_selectors_see_the_paths_inside():
    packed = gradtx.pack(_params())
    assert gradtx.paths.select(packed, "**/w") == ["enc/w"]
    assert gradtx.paths.select({"model": packed}, "model/enc") == ["model/enc/b", "model/enc/w"]
    labels = gradtx.paths.resolve_labels(packed, {"a": "enc", "b": ["head", "scale"]})
    assert labels == {"enc/b": "a", "enc/w": "a", "head/0": "b", "scale": "b"}


def test_a_mask_inside_a_buffer_decays_only_the_selected_paths():
    packed = gradtx.pack({"w": jnp.ones(3), "b": jnp.ones(2)})
    tx = gradtx.add_decayed_weights(0.5, mask="w")
    zeros = packed.replace(tuple(jnp.zeros_like(b) for b in packed.buffers))
    updates, _ = tx.update(zeros, tx.init(packed), packed)
    np.testing.assert_array_equal(updates.unpack()["w"], [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(updates.unpack()["b"], [0.0, 0.0])


@pytest.mark.parametrize(
    "sizes",
    [[37, 70, 5, 1, 64, 33, 3, 1 << 16], [64, 192, 32, 96, 1 << 16, 160, 32, 64]],
    ids=["odd sizes", "multiples of 32"],
)
def test_a_mask_over_many_leaves_selects_exactly_their_elements(sizes):
    # The selection is read from bits packed in 32-bit words (a mask this large is read
    # from words; small ones are constants). Odd sizes put leaf boundaries inside words and
    # a partial word at the end; sizes that are multiples of 32 take a bit per 32 elements.
    params = {f"p{i}": jnp.full((n,), i + 1.0) for i, n in enumerate(sizes)}
    chosen = ["p0", "p2", "p3", "p5", "p7"]
    tx = gradtx.add_decayed_weights(0.5, mask=chosen)
    packed = gradtx.pack(params)
    zeros = packed.replace(tuple(jnp.zeros_like(b) for b in packed.buffers))
    updates, _ = jax.jit(tx.update)(zeros, tx.init(packed), packed)
    for i, n in enumerate(sizes):
        expected = 0.5 * (i + 1.0) if f"p{i}" in chosen else 0.0
        np.testing.assert_array_equal(updates.unpack()[f"p{i}"], np.full(n, expected))


@pytest.mark.parametrize("copies", [1, 1 << 14], ids=["constant mask", "mask from bits"])
def test_masked_decay_passes_the_unselected_elements_through_bit_for_bit(copies):
    # Decay adds -0.0 where the mask is off: that keeps every value, signed zeros and
    # infinities bit for bit, as selecting between the decayed and the incoming update would.
    # A NaN stays a NaN, but its sign and payload are the device's: arithmetic on a GPU
    # returns the canonical NaN (0x7fc00000) whatever the input's bits (numerics page).
    # (Not subnormals: XLA's CPU arithmetic flushes them to zero, in any sum it computes.)
    values = [-0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, 1.5e-38, -3.5]
    special = np.tile(np.array(values, np.float32), copies)
    params = {"b": jnp.ones(special.size), "w": jnp.full(5, 2.0)}
    packed = gradtx.pack(params)
    incoming = gradtx.pack({"b": jnp.asarray(special), "w": jnp.ones(5)})
    tx = gradtx.add_decayed_weights(0.5, mask="w")
    updates, _ = jax.jit(tx.update)(incoming, tx.init(packed), packed)
    out = updates.unpack()
    got = np.asarray(out["b"])
    nan = np.isnan(special)
    np.testing.assert_array_equal(np.isnan(got), nan)
    assert got[~nan].view(np.uint32).tolist() == special[~nan].view(np.uint32).tolist()
    np.testing.assert_array_equal(out["w"], np.full(5, 2.0))


def test_a_layout_keeps_each_selection_s_mask_apart():
    # Masks (and their bits) are kept per layout and selection, read-only: a second
    # selection over the same buffer gets its own mask, and the first is found again.
    sizes = [40, 1 << 16, 7]
    params = {f"p{i}": jnp.full((n,), i + 1.0) for i, n in enumerate(sizes)}
    packed = gradtx.pack(params)
    zeros = packed.replace(tuple(jnp.zeros_like(b) for b in packed.buffers))
    first = packed.layout.group_mask(0, {"p1"}, "")
    assert first is packed.layout.group_mask(0, {"p1"}, "")
    assert not first.flags.writeable
    for chosen in (["p1"], ["p0", "p2"], ["p1"]):
        tx = gradtx.add_decayed_weights(0.5, mask=chosen)
        updates, _ = jax.jit(tx.update)(zeros, tx.init(packed), packed)
        for i, n in enumerate(sizes):
            expected = 0.5 * (i + 1.0) if f"p{i}" in chosen else 0.0
            np.testing.assert_array_equal(updates.unpack()[f"p{i}"], np.full(n, expected))


def test_state_keys_and_checkpoints_are_shared_with_the_unpacked_model():
    params = _params()
    tx = gradtx.adam(1e-2, mu_dtype=jnp.float32)
    packed_state = tx.init(gradtx.pack(params))
    keys = sorted(gradtx.state_dict(packed_state))
    assert keys == sorted(gradtx.state_dict(tx.init(params)))
    assert "mu/head/0" in keys and "count/enc/w" in keys
    assert gradtx.state_dict(packed_state)["mu/head/0"].dtype == jnp.float32


def test_a_nested_packed_subtree_keeps_its_prefix():
    params = {"body": gradtx.pack({"w": jnp.ones(2), "v": jnp.ones(3)}), "head": jnp.ones(2)}
    tx = gradtx.sgd(0.1, momentum=0.9)
    keys = sorted(gradtx.state_dict(tx.init(params)))
    assert keys == ["trace/body/v", "trace/body/w", "trace/head"]


def test_a_none_gradient_for_the_packed_part_leaves_it_and_its_state_alone():
    params = {"body": gradtx.pack({"w": jnp.ones(2)}), "head": jnp.ones(2)}
    tx = gradtx.adam(0.1)
    state = tx.init(params)
    updates, new_state = tx.update({"body": None, "head": jnp.ones(2)}, state, params)
    assert updates["body"] is None
    flat, new_flat = gradtx.state_dict(state), gradtx.state_dict(new_state)
    assert int(new_flat["count/body/w"]) == 0 and int(new_flat["count/head"]) == 1
    np.testing.assert_array_equal(new_flat["mu/body/w"], flat["mu/body/w"])
    new_params = gradtx.apply_updates(params, updates)
    assert new_params["body"].buffers[0] is params["body"].buffers[0]


def test_init_accepts_shape_dtype_structs():
    packed = jax.eval_shape(gradtx.pack, _params())
    state = jax.eval_shape(gradtx.adam(1e-3).init, packed)
    assert gradtx.state_dict(state)["mu/enc/w"].shape == (3, 4)


def test_global_norm_of_packed_equals_the_tree():
    params = _params()
    np.testing.assert_allclose(
        gradtx.global_norm(gradtx.pack(params)), gradtx.global_norm(params), rtol=1e-6
    )


def test_pack_rejects_non_float_leaves_by_path():
    with pytest.raises(TypeError, match=r"'step'.*only floating-point"):
        gradtx.pack({"w": jnp.ones(2), "step": jnp.int32(3)})
    with pytest.raises(TypeError, match="already packed"):
        gradtx.pack({"a": gradtx.pack({"w": jnp.ones(2)})})


def test_unpack_checks_the_offsets():
    packed = gradtx.pack({"w": jnp.ones(2), "v": jnp.ones(2)})
    with pytest.raises(ValueError, match="expected 2 offsets"):
        packed.unpack(packed.offsets()[:1])


def test_unpack_at_runtime_offsets_traces_a_slice_and_a_reshape_per_leaf():
    # Offsets are never negative: no wrap-around (compare, add, select) per leaf, which on
    # 2000 leaves cost 0.5 s of tracing and lowering and a larger kernel for XLA.
    packed = gradtx.pack(_params())
    jaxpr = jax.make_jaxpr(lambda p, offsets: p.unpack(offsets))(packed, packed.offsets())

    def primitives(jaxpr):
        for eqn in jaxpr.eqns:
            yield eqn.primitive.name
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                yield from primitives(sub)

    names = [n for n in primitives(jaxpr.jaxpr) if n not in ("custom_vjp_call", "pjit")]
    assert set(names) <= {"dynamic_slice", "reshape"}, sorted(set(names))
    # A buffer of one leaf is that leaf: no slice.
    shared = [s for s in packed.layout.specs if len(packed.layout.by_group[s.group]) > 1]
    assert 0 < len(shared) < len(packed.layout.specs)
    assert names.count("dynamic_slice") == len(shared)


def _many_leaves(n: int) -> dict:
    rng = np.random.default_rng(1)
    return {
        f"l{i:03d}": jnp.asarray(rng.normal(size=(i % 5 + 1, 3)), jnp.float32) for i in range(n)
    }


def _barrier_widths(jaxpr) -> list[int]:
    """The number of operands of each `optimization_barrier` in `jaxpr`, nested ones included."""
    widths = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "optimization_barrier":
            widths.append(len(eqn.invars))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            widths += _barrier_widths(sub)
    return widths


@pytest.mark.parametrize("runtime_offsets", [True, False])
def test_many_leaves_are_read_through_views_of_their_buffer(runtime_offsets):
    # XLA's GPU multi-output fusion weighs every pair of slices of one operand: 150 leaves are
    # read through 3 views of 64 leaves or fewer, and their values and gradients stay exact.
    params = _many_leaves(150)
    packed = gradtx.pack(params)
    offsets = packed.offsets() if runtime_offsets else None
    jaxpr = jax.make_jaxpr(lambda p, o: p.unpack(o))(packed, offsets)
    assert _barrier_widths(jaxpr.jaxpr) == [3]
    few = gradtx.pack(_many_leaves(gradtx._layouts.packed.LEAVES_PER_VIEW))
    assert _barrier_widths(jax.make_jaxpr(lambda p: p.unpack())(few).jaxpr) == []

    def loss(tree):
        return sum(jnp.sum(jnp.sin(leaf) * (i + 1)) for i, leaf in enumerate(tree.values()))

    back, grads = jax.jit(lambda p, o: (p.unpack(o), jax.grad(lambda q: loss(q.unpack(o)))(p)))(
        packed, offsets
    )
    expected = jax.grad(loss)(params)
    for path, leaf in params.items():
        np.testing.assert_array_equal(back[path], leaf)
        np.testing.assert_allclose(grads.unpack()[path], expected[path], 1e-5, 1e-6, err_msg=path)


def test_per_leaf_math_on_many_packed_leaves_reads_views_and_matches_the_tree():
    params = _many_leaves(150)
    grads = jax.tree.map(lambda x: jnp.cos(x) + 0.5, params)
    tx = gradtx.scale_by_trust_ratio()
    packed, packed_grads = gradtx.pack(params), gradtx.pack(grads)
    step = jax.jit(lambda g, s, p: tx.update(g, s, p)[0])
    jaxpr = jax.make_jaxpr(step)(packed_grads, tx.init(packed), packed)
    assert _barrier_widths(jaxpr.jaxpr) == [3, 3]  # the gradients' buffer and the params'
    want = tx.update(grads, tx.init(params), params)[0]
    got = step(packed_grads, tx.init(packed), packed).unpack()
    for path in params:
        np.testing.assert_allclose(got[path], want[path], rtol=1e-6, err_msg=path)


def test_mixing_packed_and_unpacked_trees_is_an_error_naming_the_path():
    params = {"w": jnp.ones(2)}
    packed = gradtx.pack(params)
    with pytest.raises(KeyError, match="The params are packed at"):
        gradtx.apply_updates(packed, {"w": jnp.ones(2)})
    with pytest.raises(TypeError, match="at path 'body' one tree holds packed params"):
        gradtx.apply_updates({"body": packed}, {"body": jnp.ones(2)})
    other = gradtx.pack({"w": jnp.ones(2), "v": jnp.ones(1)})
    with pytest.raises(ValueError, match="different layouts"):
        gradtx.apply_updates(packed, other)
    tx = gradtx.adam(1e-3)
    with pytest.raises(ValueError, match="different layouts"):
        tx.update(other, tx.init(packed), packed)


def test_loading_unequal_counts_into_one_buffer_is_an_error():
    params = {"w": jnp.ones(2), "v": jnp.ones(2)}
    tx = gradtx.adam(1e-3)
    state = tx.init(params)
    _, state = tx.update({"w": jnp.ones(2), "v": None}, state, params)
    flat = gradtx.state_dict(state)
    with pytest.raises(ValueError, match="loaded values differ"):
        gradtx.load_state_dict(tx, gradtx.pack(params), flat)


def test_large_leaves_get_their_own_buffer_and_unpack_the_same():
    params = {"big": jnp.arange(12.0).reshape(3, 4), "a": jnp.ones(2), "b": jnp.zeros(3)}
    packed = gradtx.pack(params, own_buffer_from=10)
    # A buffer of one leaf is the leaf in its own shape (no view that XLA must see through).
    assert [b.shape for b in packed.buffers] == [(5,), (3, 4)]
    assert repr(packed) == "Packed(3 leaves in float32[5], float32#1[3,4])"
    keys = [jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_flatten_with_path(packed)[0]]
    assert keys == [".buffers[float32]", ".buffers[float32#1]"]
    offsets = packed.offsets()
    for runtime in (offsets, None):
        back = jax.jit(lambda p, o: p.unpack(o))(packed, runtime)
        for key in params:
            np.testing.assert_array_equal(back[key], params[key])
    grads = jax.grad(lambda p: p.unpack(offsets)["big"].sum() + p.unpack(offsets)["b"].sum())(
        packed
    )
    np.testing.assert_array_equal(grads.buffers[1], np.ones((3, 4)))
    np.testing.assert_array_equal(grads.buffers[0], [0, 0, 1, 1, 1])


def test_equal_layouts_are_one_object_and_compare_by_content():
    # JAX compares a pytree's static data on every jitted call: params and gradients packed
    # apart share one layout object, so that check is an identity test.
    params = _params()
    a, b = gradtx.pack(params), gradtx.pack(jax.tree.map(lambda x: x, params))
    assert a.layout is b.layout
    assert gradtx.pack(params, own_buffer_from=4).layout is not a.layout
    # A layout built apart (not through `pack`) still compares and hashes by content.
    from gradtx._layouts.packed import Layout, LeafSpec

    copy = Layout(
        a.layout.treedef,
        tuple(LeafSpec(s.path, s.group, s.offset, s.shape) for s in a.layout.specs),
        a.layout.groups,
        a.layout.sizes,
    )
    assert copy is not a.layout and copy == a.layout and hash(copy) == hash(a.layout)
    moved = Layout(copy.treedef, copy.specs[::-1], copy.groups, copy.sizes)
    assert moved != a.layout
    assert (a.layout == "float32") is False


# --- the lifting helper's guards for a selection that splits a packed buffer -------------------
# No public transformation reaches them (weight decay brings a masked update and keeps no
# state; the others run per leaf or refuse packed params): a transformation written later must
# meet them, so they are pinned here with small private subclasses.


def _selecting(with_masked_update: bool, with_count: bool):
    from gradtx._core.per_array import PerArrayTransform

    class Selecting(PerArrayTransform):
        name = "selecting"

        def state_keys(self):
            return ("count",) if with_count else ()

        def init_leaf(self, param):
            return {"count": jnp.zeros((), jnp.int32)} if with_count else {}

        def update_leaf(self, g, slots, param):
            return 2 * g, {}

        def selected_paths(self, updates, params):
            return {"a"}

        if with_masked_update:

            def masked_update_leaf(self, g, slots, param, selected):
                return jnp.where(selected, 2 * g, g), {}

    return Selecting()


def test_a_split_buffer_needs_a_masked_update():
    packed = gradtx.pack({"a": jnp.ones(2), "b": jnp.ones(3)})
    tx = _selecting(with_masked_update=False, with_count=False)
    with pytest.raises(TypeError, match="selecting selects some paths of the packed buffer"):
        tx.update(packed, tx.init(packed))
    tx = _selecting(with_masked_update=True, with_count=False)
    updates, _ = tx.update(packed, tx.init(packed))
    np.testing.assert_array_equal(updates.unpack()["a"], [2.0, 2.0])
    np.testing.assert_array_equal(updates.unpack()["b"], [1.0, 1.0, 1.0])


def test_a_split_buffer_cannot_share_one_count():
    packed = gradtx.pack({"a": jnp.ones(2), "b": jnp.ones(3)})
    tx = _selecting(with_masked_update=True, with_count=True)
    with pytest.raises(ValueError, match="state 'count' is one value for the whole buffer"):
        tx.update(packed, tx.init(packed))


def test_a_buffer_of_one_abstract_leaf_keeps_its_sharding():
    # `bucketed` packs a sharded leaf apart: given abstractly, its buffer (and so the state
    # `init` makes from it) must keep the leaf's sharding.
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    params = {
        "big": jax.ShapeDtypeStruct((3, 4), jnp.float32, sharding=sharding),
        "a": jax.ShapeDtypeStruct((2,), jnp.float32),
    }
    packed = gradtx.pack(params, own_buffer_from=10)
    assert packed.buffers[1].shape == (3, 4) and packed.buffers[1].sharding == sharding
    assert dict(packed.items())["big"].sharding == sharding
    assert packed.buffers[0].sharding is None
