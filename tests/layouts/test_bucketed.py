"""`gradtx.bucketed`: a tree's state in flat buffers. The contract suite compares it with the
per-leaf layout for every registered transformation; these tests cover what users do with it:
jit and donation, checkpoints both ways, reconcile, bf16 params, and misuse."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx


def _params(dtype=jnp.float32):
    key = jax.random.PRNGKey(0)
    return {
        "layers": [
            {
                "kernel": jax.random.normal(jax.random.fold_in(key, i), (4, 3)).astype(dtype),
                "bias": jnp.full((3,), 0.1 * i, dtype),
            }
            for i in range(4)
        ],
        "frozen_buffer": None,  # Equinox-style: no array here
    }


def _grads(params, seed):
    key = jax.random.PRNGKey(seed)
    return jax.tree.map(
        lambda p: jax.random.normal(key, p.shape).astype(p.dtype) if p is not None else None,
        params,
    )


def _run(tx, params, steps, donate=False):
    step = jax.jit(
        lambda p, s, g: (lambda u, s: (gradtx.apply_updates(p, u), s))(*tx.update(g, s, p)),
        donate_argnums=(0, 1) if donate else (),
    )
    state = tx.init(params)
    params = jax.tree.map(jnp.copy, params)
    for i in range(steps):
        params, state = step(params, state, _grads(params, i))
    return params, state


def test_donated_jitted_steps_equal_the_per_leaf_layout_bit_for_bit():
    tx = gradtx.adamw(1e-2, weight_decay=0.1, mask="!**/bias")
    params, state = _run(tx, _params(), 5)
    b_params, b_state = _run(gradtx.bucketed(tx), _params(), 5, donate=True)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(b_params)):
        np.testing.assert_array_equal(a, b)
    flat, b_flat = gradtx.state_dict(state), gradtx.state_dict(b_state)
    assert sorted(flat) == sorted(b_flat)
    for key in flat:
        np.testing.assert_array_equal(flat[key], b_flat[key], err_msg=key)
    assert b_params["frozen_buffer"] is None


def test_state_is_flat_and_offsets_stay_out_of_checkpoints():
    tx = gradtx.bucketed(gradtx.adam(1e-3))
    state = tx.init(_params())
    (mu,) = state["mu"].values()  # one packed unit at the root of the params
    assert isinstance(mu, gradtx.Packed)
    assert mu.buffers[0].shape == (4 * (12 + 3),)
    assert not any("offset" in key for key in gradtx.state_dict(state))


def test_checkpoints_move_between_layouts():
    plain = gradtx.adam(1e-2)
    _, state = _run(plain, _params(), 3)
    flat = gradtx.state_dict(state)
    b_state, report = gradtx.load_state_dict(gradtx.bucketed(plain), _params(), flat)
    assert report.clean
    back, report = gradtx.load_state_dict(plain, _params(), gradtx.state_dict(b_state))
    assert report.clean
    for key, value in gradtx.state_dict(back).items():
        np.testing.assert_array_equal(value, flat[key], err_msg=key)


def _bigger():
    params = _params()
    params["layers"].append({"kernel": jnp.ones((4, 3)), "bias": jnp.zeros(3)})
    return params


def test_reconcile_keeps_surviving_state_after_adding_a_layer():
    tx = gradtx.bucketed(gradtx.sgd(1e-2, momentum=0.9))
    _, state = _run(tx, _params(), 2)
    new_state, report = gradtx.reconcile(tx, state, _bigger())
    assert report.missing and all("layers/4" in k for k in report.missing)
    old, new = gradtx.state_dict(state), gradtx.state_dict(new_state)
    np.testing.assert_array_equal(new["trace/layers/1/kernel"], old["trace/layers/1/kernel"])
    assert not np.any(np.asarray(new["trace/layers/4/kernel"]))


def test_reconcile_refuses_a_new_layer_under_a_shared_step_count():
    """A buffer has one step count: a new layer (count 0) cannot join trained ones."""
    tx = gradtx.bucketed(gradtx.adam(1e-2))
    _, state = _run(tx, _params(), 2)
    with pytest.raises(ValueError, match="one value for all of its 10 paths.*step count"):
        gradtx.reconcile(tx, state, _bigger())


def test_bf16_params_with_float32_state():
    tx = gradtx.adam(1e-2, mu_dtype=jnp.float32, nu_dtype=jnp.float32)
    params, _ = _run(tx, _params(jnp.bfloat16), 3)
    b_params, b_state = _run(gradtx.bucketed(tx), _params(jnp.bfloat16), 3)
    assert next(iter(b_state["mu"].values())).buffers[0].dtype == jnp.float32
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(b_params)):
        assert b.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_partial_update_is_an_error_naming_the_path():
    tx = gradtx.bucketed(gradtx.adam(1e-2))
    params = _params()
    grads = _grads(params, 0)
    grads["layers"][2]["kernel"] = None
    with pytest.raises(ValueError, match="'layers/2/kernel'.*partial updates"):
        tx.update(grads, tx.init(params), params)


def test_packed_params_are_refused():
    with pytest.raises(TypeError, match="already packed"):
        gradtx.bucketed(gradtx.adam(1e-2)).init(gradtx.pack({"w": jnp.ones(3)}))


def test_updates_for_other_params_are_refused():
    tx = gradtx.bucketed(gradtx.sgd(1e-2))
    state = tx.init({"a": jnp.ones(2)})
    with pytest.raises(KeyError, match="reconcile"):
        tx.update({"a": jnp.ones(2), "b": jnp.ones(2)}, state)


def test_global_norm_clipping_agrees_within_float32_rounding():
    """The global norm sums the squares in another order over a flat buffer, so the clip
    factor can differ in its last bit; everything downstream stays within 1e-6."""
    tx = gradtx.chain(gradtx.clip_by_global_norm(0.5), gradtx.adam(1e-2))
    params, _ = _run(tx, _params(), 4)
    b_params, _ = _run(gradtx.bucketed(tx), _params(), 4)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(b_params)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def _mixed_sizes():
    """Small leaves that share a buffer and two leaves large enough for their own."""
    key = jax.random.PRNGKey(3)
    return {
        "embed": jax.random.normal(key, (64, 32)),  # 2048 elements
        "head": jax.random.normal(jax.random.fold_in(key, 1), (4096,)),
        "bias": jnp.zeros(8),
        "scale": jnp.ones(8),
    }


def test_large_leaves_keep_a_buffer_and_step_count_of_their_own():
    tx = gradtx.bucketed(gradtx.adamw(1e-2, weight_decay=0.1, mask="!bias"), own_buffer_from=2048)
    state = tx.init(_mixed_sizes())
    (mu,) = state["mu"].values()
    sizes = {spec.path: mu.layout.sizes[spec.group] for spec in mu.layout.specs}
    assert sizes == {"bias": 16, "scale": 16, "embed": 2048, "head": 4096}
    assert repr(mu) == "Packed(4 leaves in float32[16], float32#1[64,32], float32#2[4096])"
    # One step count per buffer: three of them, still keyed by path in checkpoints.
    (count,) = state["count"].values()
    assert [b.shape for b in count.buffers] == [(), (), ()]
    assert sorted(k for k in gradtx.state_dict(state) if k.startswith("count/")) == [
        "count/bias",
        "count/embed",
        "count/head",
        "count/scale",
    ]


def test_mixed_leaf_sizes_equal_the_per_leaf_layout():
    """Bit-for-bit, for leaves in a shared buffer and for leaves with a buffer of their own
    (kept in the leaf's shape: run as a 1-D array, XLA's CPU code had rounded some
    multiply-adds of a (64, 32) leaf's moments differently, by an ulp)."""
    tx = gradtx.adamw(1e-2, weight_decay=0.1, mask="!bias")
    params, state = _run(tx, _mixed_sizes(), 4)
    flat = gradtx.state_dict(state)
    for own in (2048, 3000, None):
        b_params, b_state = _run(gradtx.bucketed(tx, own_buffer_from=own), _mixed_sizes(), 4, True)
        b_flat = gradtx.state_dict(b_state)
        assert sorted(flat) == sorted(b_flat)
        for key in flat:
            np.testing.assert_array_equal(flat[key], b_flat[key], err_msg=f"{own}: {key}")
        for key in params:
            np.testing.assert_array_equal(params[key], b_params[key], err_msg=f"{own}: {key}")


def test_checkpoints_move_between_bucketings():
    """State saved under one threshold loads under another (keys are paths, not buffers)."""
    tx = gradtx.adam(1e-2)
    _, state = _run(gradtx.bucketed(tx, own_buffer_from=2048), _mixed_sizes(), 3)
    flat = gradtx.state_dict(state)
    one_buffer = gradtx.bucketed(tx, own_buffer_from=None)
    other, report = gradtx.load_state_dict(one_buffer, _mixed_sizes(), flat)
    assert report.clean
    for key, value in gradtx.state_dict(other).items():
        np.testing.assert_array_equal(value, flat[key], err_msg=key)


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "64k"])
def test_own_buffer_from_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="bucketed: `own_buffer_from`"):
        gradtx.bucketed(gradtx.adam(1e-3), own_buffer_from=bad)
    with pytest.raises(ValueError, match="pack: `own_buffer_from`"):
        gradtx.pack(_mixed_sizes(), own_buffer_from=bad)


def test_donated_weight_decay_updates_a_large_leaf_in_place():
    # Weight decay reads the param. Viewed as a 1-D buffer, the param reached XLA's fused
    # update in two shapes, and XLA copied it every step instead of updating it in place.
    params = {"w": jnp.ones((256, 512)), "b": jnp.zeros(8)}
    grads = jax.tree.map(jnp.ones_like, params)
    tx = gradtx.bucketed(gradtx.adamw(1e-3, weight_decay=0.1))

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state

    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, tx.init(params), grads)
    hlo = compiled.compile().as_text()
    assert "input_output_alias" in hlo
    assert not re.search(r"f32\[256,512\]\{[0-9,]*\} copy\(", hlo)


def test_explain_names_each_path_s_bucket():
    tx = gradtx.bucketed(gradtx.adam(1e-2), own_buffer_from=2048)
    table = gradtx.explain(tx, _mixed_sizes())
    assert table["bias"].steps == ("bucket float32", "scale_by_adam", "scale_by_learning_rate")
    assert table["scale"].steps[0] == "bucket float32"
    assert table["embed"].steps[0] == "own bucket float32#1 (large)"
    assert table["head"].steps[0] == "own bucket float32#2 (large)"
    assert table["bias"].learning_rate == pytest.approx(1e-2)  # the note adds no hyperparameter
    assert "own bucket float32#1 (large) > scale_by_adam" in str(table)


def test_unsharded_params_record_no_sharded_leaves():
    state = gradtx.bucketed(gradtx.adam(1e-2)).init(_params())
    assert state["bucket_offsets"].sharded == ()
    assert repr(state["bucket_offsets"]) == "BucketOffsets(8 leaves)"


def test_explain_suggests_bucketed_state_for_many_small_leaves():
    many = {f"layers/{i}": jnp.zeros(8) for i in range(500)}
    hint = gradtx.explain(gradtx.adam(1e-3), many).hint
    assert "500 small leaves" in hint and "gradtx.bucketed(tx)" in hint
    assert str(gradtx.explain(gradtx.adam(1e-3), many)).splitlines()[-1] == f"hint: {hint}"
    # Not when the state is already bucketed, the leaves are few, or the params are packed.
    assert gradtx.explain(gradtx.bucketed(gradtx.adam(1e-3)), many).hint == ""
    chained = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.bucketed(gradtx.adam(1e-3)))
    assert gradtx.explain(chained, many).hint == ""
    few = {f"layers/{i}": jnp.zeros(8) for i in range(499)}
    assert gradtx.explain(gradtx.adam(1e-3), few).hint == ""
    assert gradtx.explain(gradtx.adam(1e-3), gradtx.pack(many)).hint == ""
