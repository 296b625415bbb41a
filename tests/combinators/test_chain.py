"""chain and named_chain: names, flat optimizer chains, and mixing with optax."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx
from gradtx._combinators.chain import Chain

B1, B2, EPS = np.float32(0.9), np.float32(0.999), np.float32(1e-8)


def _params():
    return {"enc": {"w": jnp.asarray([[0.5, -1.0], [2.0, 0.1]]), "b": jnp.asarray([0.0, 0.3])}}


def _grads(step):
    return {
        "enc": {
            "w": jnp.asarray([[1.0, -2.0], [0.5, 3.0]]) * (1.0 + step),
            "b": jnp.asarray([-0.2, 0.7]) / (1.0 + step),
        }
    }


def _run(tx, steps=4, **extra):
    params = _params()
    state = tx.init(params)
    history = []
    for i in range(steps):
        updates, state = tx.update(_grads(i), state, params, **extra)
        params = gradtx.apply_updates(params, updates)
        history.append(updates)
    return params, state, history


def _assert_trees_equal(a, b):
    # Eager gradtx updates run as one compiled program, eager optax op by op: XLA's fusion may
    # round the last bit differently, so equal means equal to float32 precision here.
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


# --- names -------------------------------------------------------------------------------------


def test_default_names_with_suffixes_on_repeats():
    tx = gradtx.chain(gradtx.scale(2.0), gradtx.clip(1.0), gradtx.scale(3.0), gradtx.scale(0.5))
    assert tx.names == ("scale", "clip", "scale_2", "scale_3")
    assert list(tx.init(_params())) == ["scale", "clip", "scale_2", "scale_3"]
    updates, _ = tx.update({"w": jnp.asarray([0.1, 1.0])}, tx.init({"w": jnp.zeros(2)}))
    np.testing.assert_allclose(updates["w"], [0.3, 1.5], rtol=1e-6)  # 0.1*2*3/2, clip(2)*3/2


def test_chain_state_is_keyed_by_child_name():
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1), gradtx.trace(0.5))
    state = tx.init(_params())
    assert list(state) == ["clip_by_global_norm", "adam", "trace"]
    assert set(state["adam"]) == {"mu", "nu", "count"}
    assert set(state["adam"]["mu"]) == {"enc/b", "enc/w"}
    assert set(state["trace"]) == {"trace"}


def test_nested_chains_are_named_chain():
    inner = gradtx.chain(gradtx.scale(2.0))
    tx = gradtx.chain(inner, gradtx.chain(gradtx.scale(3.0)))
    assert tx.names == ("chain", "chain_2")
    assert tx.init(_params()) == {"chain": {"scale": {}}, "chain_2": {"scale": {}}}


def test_named_chain_uses_the_given_names():
    tx = gradtx.named_chain(
        ("clip", gradtx.clip_by_global_norm(1.0)),
        ("opt", gradtx.adam(0.1)),
        ("opt2", gradtx.sgd(0.1, momentum=0.9)),
    )
    assert tx.names == ("clip", "opt", "opt2")
    state = tx.init(_params())
    assert list(state) == ["clip", "opt", "opt2"]
    assert set(gradtx.state_dict(state)) == {
        "clip/global_norm",
        "clip/clipped",
        *(f"opt/{s}/enc/{n}" for s in ("mu", "nu", "count") for n in ("w", "b")),
        *(f"opt2/trace/enc/{n}" for n in ("w", "b")),
    }


def test_named_chain_equals_chain_numerically():
    a = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1))
    b = gradtx.named_chain(("c", gradtx.clip_by_global_norm(1.0)), ("o", gradtx.adam(0.1)))
    pa, sa, _ = _run(a)
    pb, sb, _ = _run(b)
    _assert_trees_equal(pa, pb)
    _assert_trees_equal(sa["adam"], sb["o"])


# --- flat optimizer chains ---------------------------------------------------------------------


def test_optimizers_are_flat_chains():
    adam = gradtx.adam(0.1)
    assert isinstance(adam, Chain) and adam.flat
    assert adam.names == ("scale_by_adam", "scale_by_learning_rate")
    assert list(adam.init(_params())) == ["mu", "nu", "count"]
    adamw = gradtx.adamw(gradtx.schedules.constant(0.1))
    assert adamw.names == ("scale_by_adam", "add_decayed_weights", "scale_by_learning_rate")
    assert list(adamw.init(_params())) == ["mu", "nu", "count", "schedule_count", "scheduled"]
    assert list(gradtx.sgd(0.1).init(_params())) == []
    assert list(gradtx.sgd(0.1, momentum=0.9).init(_params())) == ["trace"]


def test_repeated_optimizers_in_a_chain():
    tx = gradtx.chain(gradtx.adam(0.1), gradtx.adam(0.2))
    assert tx.names == ("adam", "adam_2")
    state = tx.init(_params())
    assert list(state["adam_2"]) == ["mu", "nu", "count"]


def test_flat_optimizer_equals_nested_chain_of_its_parts():
    flat = gradtx.adam(0.1, B1, B2, EPS)
    nested = gradtx.chain(gradtx.scale_by_adam(B1, B2, EPS), gradtx.scale_by_learning_rate(0.1))
    pf, sf, _ = _run(flat)
    pn, sn, _ = _run(nested)
    _assert_trees_equal(pf, pn)
    _assert_trees_equal(sf, sn["scale_by_adam"])

    sgd = gradtx.sgd(0.1, momentum=0.9, nesterov=True)
    parts = gradtx.chain(gradtx.trace(0.9, nesterov=True), gradtx.scale_by_learning_rate(0.1))
    _assert_trees_equal(_run(sgd)[0], _run(parts)[0])


def test_flat_chain_with_colliding_state_keys_is_an_error():
    a, b = gradtx.scale_by_adam(), gradtx.scale_by_adam(nesterov=True)
    with pytest.raises(ValueError, match=r"both keep state 'mu'"):
        Chain((a, b), ("first", "second"), "opt", flat=True)


# --- optax interoperability --------------------------------------------------------------------


def test_optax_transformations_inside_gradtx_chain():
    with jax.numpy_dtype_promotion("standard"):
        ours = gradtx.chain(
            optax.clip_by_global_norm(1.0),
            optax.scale_by_adam(b1=B1, b2=B2, eps=EPS),
            optax.scale(-0.1),
        )
        theirs = optax.chain(
            optax.clip_by_global_norm(1.0),
            optax.scale_by_adam(b1=B1, b2=B2, eps=EPS),
            optax.scale(-0.1),
        )
        assert ours.names == ("clip_by_global_norm", "scale_by_adam", "scale")
        p_ours, s_ours, u_ours = _run(ours)
        p_theirs, _, u_theirs = _run(theirs)
    _assert_trees_equal(p_ours, p_theirs)
    _assert_trees_equal(u_ours, u_theirs)
    # JAX returns dicts from a compiled step with sorted keys: compare the key sets.
    assert sorted(s_ours) == ["clip_by_global_norm", "scale", "scale_by_adam"]
    # ... and the same numbers as the pure gradtx version.
    pure = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1, B1, B2, EPS))
    p_pure, _, u_pure = _run(pure)
    for a, b in zip(jax.tree.leaves(u_ours), jax.tree.leaves(u_pure)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    for a, b in zip(jax.tree.leaves(p_ours), jax.tree.leaves(p_pure)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_gradtx_transformations_inside_optax_chain():
    inside = optax.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1, B1, B2, EPS))
    pure = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1, B1, B2, EPS))
    p_in, s_in, u_in = _run(inside)
    p_pure, s_pure, u_pure = _run(pure)
    _assert_trees_equal(p_in, p_pure)
    _assert_trees_equal(u_in, u_pure)
    assert isinstance(s_in, tuple) and len(s_in) == 2
    _assert_trees_equal(s_in[1], s_pure["adam"])
    # ... and the same numbers as pure optax.
    with jax.numpy_dtype_promotion("standard"):
        p_optax, _, _ = _run(
            optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.1, B1, B2, EPS))
        )
    for a, b in zip(jax.tree.leaves(p_in), jax.tree.leaves(p_optax)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_gradtx_inside_optax_under_jit():
    tx = optax.chain(gradtx.clip(0.5), gradtx.sgd(0.1, momentum=0.9))

    @jax.jit
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    params = _params()
    state = tx.init(params)
    params, state = step(params, state, _grads(0))
    expected = _params()["enc"]["w"] - 0.1 * jnp.clip(_grads(0)["enc"]["w"], -0.5, 0.5)
    np.testing.assert_allclose(params["enc"]["w"], expected, rtol=1e-6)


def test_extra_arguments_reach_optax_and_are_ignored_by_gradtx():
    def init(params):
        return ()

    def update(updates, state, params=None, **extra):
        # The extra argument must arrive: scale the updates by it.
        return jax.tree.map(lambda g: g * extra["value"], updates), state

    tx = gradtx.chain(optax.GradientTransformationExtraArgs(init, update), gradtx.scale(2.0))
    updates, _ = tx.update(_grads(0), tx.init(_params()), _params(), value=jnp.float32(3.0))
    _assert_trees_equal(updates, jax.tree.map(lambda g: 6.0 * g, _grads(0)))
    # a plain optax transformation without **extra gets none
    plain = gradtx.chain(optax.scale(0.5))
    updates, _ = plain.update(_grads(0), plain.init(_params()), None, value=1.0)
    _assert_trees_equal(updates, jax.tree.map(lambda g: 0.5 * g, _grads(0)))


# --- empty chain -------------------------------------------------------------------------------


def test_empty_chain_is_identity():
    tx = gradtx.chain()
    params = _params()
    state = tx.init(params)
    assert state == {}
    grads = _grads(0)
    updates, new_state = tx.update(grads, state, params)
    _assert_trees_equal(updates, grads)
    assert new_state == {}
    assert gradtx.named_chain().init(params) == {}


def test_chain_with_identity_equals_the_transform():
    a = gradtx.chain(gradtx.identity(), gradtx.adam(0.1))
    b = gradtx.adam(0.1)
    _assert_trees_equal(_run(a)[0], _run(b)[0])


class _Halve:
    def init(self, params):
        return {}

    def update(self, updates, state, params=None):
        return jax.tree.map(lambda g: 0.5 * g, updates), state


def test_foreign_names_come_from_the_object():
    tx = gradtx.chain(
        _Halve(), optax.GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s))
    )
    assert tx.names == ("_Halve", "transform")
    updates, _ = tx.update(_grads(0), tx.init(_params()))
    _assert_trees_equal(updates, jax.tree.map(lambda g: 0.5 * g, _grads(0)))


# --- low-precision updates -----------------------------------------------------------------------


def _bf16(x):
    return np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32))


def test_low_precision_updates_are_rounded_once_at_the_end_of_a_chain():
    """Stateless steps on bf16 gradients: the chain carries float32 and rounds once."""
    rng = np.random.default_rng(3)
    params = {"w": jnp.zeros(64, jnp.bfloat16), "f": jnp.ones(3), "frozen": jnp.ones(2)}
    tx = gradtx.chain(gradtx.scale(-0.37), gradtx.scale(1.3))
    state = tx.init(params)
    g = jnp.asarray(rng.normal(size=64), jnp.bfloat16)
    updates, _ = jax.jit(tx.update)({"w": g, "f": jnp.ones(3), "frozen": None}, state)
    wide = np.asarray(g, np.float32) * np.float32(-0.37)
    once = _bf16(wide * np.float32(1.3))
    each = _bf16(_bf16(wide) * np.float32(1.3))  # rounding after every child
    assert updates["w"].dtype == jnp.bfloat16 and updates["f"].dtype == jnp.float32
    assert updates["frozen"] is None
    np.testing.assert_array_equal(np.asarray(updates["w"], np.float32), once)
    assert np.any(once != each)  # rounding after every child would give other values here


def test_low_precision_updates_that_read_float32_state_stay_float32():
    """bf16 gradients with a float32 trace: the update read float32 state, so it comes out
    in float32 (exactly `-0.37 * trace`), and `apply_updates` rounds once."""
    rng = np.random.default_rng(3)
    params = {"w": jnp.zeros(64, jnp.bfloat16), "frozen": jnp.ones(2, jnp.bfloat16)}
    tx = gradtx.chain(gradtx.trace(0.9, accumulator_dtype=jnp.float32), gradtx.scale(-0.37))
    state = tx.init(params)
    for _ in range(2):
        g = jnp.asarray(rng.normal(size=64), jnp.bfloat16)
        updates, state = jax.jit(tx.update)({"w": g, "frozen": None}, state)
        trace = np.asarray(state["trace"]["trace"]["w"])
        assert updates["w"].dtype == jnp.float32 and updates["frozen"] is None
        np.testing.assert_allclose(np.asarray(updates["w"]), np.float32(-0.37) * trace, rtol=1e-6)


def test_low_precision_packed_updates_are_rounded_once_too():
    rng = np.random.default_rng(4)
    params = {"a": jnp.asarray(rng.normal(size=8), jnp.bfloat16), "b": jnp.ones(3, jnp.bfloat16)}
    grads = {"a": jnp.asarray(rng.normal(size=8), jnp.bfloat16), "b": jnp.ones(3, jnp.bfloat16)}
    for dtype in (jnp.float32, jnp.bfloat16):
        tx = gradtx.chain(gradtx.trace(0.9, accumulator_dtype=dtype), gradtx.scale(-0.37))
        tree, _ = tx.update(grads, tx.init(params))
        packed, _ = tx.update(gradtx.pack(grads), tx.init(gradtx.pack(params)))
        assert packed.buffers[0].dtype == dtype  # the state's dtype, as per leaf
        for path, value in packed.unpack().items():
            np.testing.assert_array_equal(value, tree[path])


def test_a_global_norm_in_a_chain_reads_the_updates_the_chain_has_reached():
    # The norm may be taken from the narrow source of the chain's float32 copy, but only
    # while no step before it has changed the updates.
    from gradtx._core.widening import _SOURCES

    g = {"w": jnp.asarray([3.0, 4.0], jnp.bfloat16), "b": jnp.asarray([12.0], jnp.bfloat16)}
    for first, factor in ((gradtx.identity(), 1.0), (gradtx.scale(2.0), 2.0)):
        tx = gradtx.chain(first, gradtx.clip_by_global_norm(1.0))
        updates, state = jax.jit(tx.update)(g, tx.init(g))
        assert float(state["clip_by_global_norm"]["global_norm"]) == 13.0 * factor
        np.testing.assert_allclose(
            np.asarray(updates["w"], np.float32), _bf16(np.array([3.0, 4.0]) / 13.0), rtol=0
        )
    assert not _SOURCES  # nothing outlives the chain's update


def test_clipping_bf16_updates_in_a_chain_needs_no_float32_copy_of_them():
    # XLA's CPU backend wrote the float32 conversion of the gradient out in full for the norm
    # when the rest of the step shared it (see gradtx/_core/widening.py): one more gradient-sized
    # float32 buffer than the same step without clipping.
    import re

    n = 1 << 18
    params = {"w": jnp.ones(n, jnp.bfloat16)}

    def float32_buffers(tx):
        step = jax.jit(lambda g, s: tx.update(g, s, params))
        entry = step.lower(params, tx.init(params)).compile().as_text().split("ENTRY")[1]
        return len(re.findall(rf"= f32\[{n}\]\S* (?:fusion|convert)\(", entry))

    adam = gradtx.adam(1e-3, mu_dtype=jnp.float32)
    clipped = float32_buffers(gradtx.chain(gradtx.clip_by_global_norm(1.0), adam))
    assert clipped == float32_buffers(adam)
