"""Transformations whose math needs each leaf's own shape: stacked layers, packed params, shape
rules (factored moments, AGC units) and per-example clipping."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import references.per_leaf as rpl

import gradtx
from gradtx.paths import SelectorError

L = 3  # layers in a stack
RNG = np.random.default_rng(7)


def _normal(*shape: int) -> jax.Array:
    return jnp.asarray(RNG.normal(size=shape).astype(np.float32))


# A stack of L layers (w: (3, 4), b: (4,), s: ()) and a leaf outside the stack.
STACKED_PARAMS = {
    "layers": {"w": _normal(L, 3, 4), "b": _normal(L, 4), "s": _normal(L)},
    "head": _normal(5),
}
STACKED_GRADS = [
    {"layers": {"w": _normal(L, 3, 4), "b": _normal(L, 4), "s": _normal(L)}, "head": _normal(5)}
    for _ in range(3)
]
# Layer 1's weight and gradient are zero somewhere, to cross the special cases.
STACKED_PARAMS["layers"]["b"] = STACKED_PARAMS["layers"]["b"].at[1].set(0.0)
STACKED_GRADS[0]["layers"]["w"] = STACKED_GRADS[0]["layers"]["w"].at[2].set(0.0)


def unstack(tree: dict) -> dict:
    """The same model with L separate layers: `layers/<i>/w`, ..."""
    layers = tree["layers"]
    return {
        "layers": [{k: v[i] for k, v in layers.items()} for i in range(L)],
        "head": tree["head"],
    }


def run(tx, params, grads_seq):
    state = tx.init(params)
    history = []
    for grads in grads_seq:
        updates, state = tx.update(grads, state, params)
        history.append(updates)
    return history, state


STACKED_CASES = {
    "scale_by_trust_ratio": lambda s: gradtx.scale_by_trust_ratio(min_norm=0.1, stacked=s),
    "scale_by_param_block_rms": lambda s: gradtx.scale_by_param_block_rms(0.5, stacked=s),
    "clip_by_block_rms": lambda s: gradtx.clip_by_block_rms(0.7, stacked=s),
    "adaptive_grad_clip": lambda s: gradtx.adaptive_grad_clip(0.3, stacked=s),
    "scale_by_factored_rms": lambda s: gradtx.scale_by_factored_rms(
        min_dim_size_to_factor=3, stacked=s
    ),
    "lamb": lambda s: gradtx.lamb(0.1, weight_decay=0.1, stacked=s),
    "lars": lambda s: gradtx.lars(0.1, trust_coefficient=0.5, stacked=s),
    "adafactor": lambda s: gradtx.adafactor(0.1, min_dim_size_to_factor=3, stacked=s),
}


@pytest.mark.parametrize("make", STACKED_CASES.values(), ids=STACKED_CASES.keys())
def test_stacked_leaf_equals_separate_leaves(make):
    """A leaf of shape (L, ...) declared stacked gives exactly the results of L leaves."""
    stacked, state = run(make({"layers": 1}), STACKED_PARAMS, STACKED_GRADS)
    separate, sep_state = run(
        make(None), unstack(STACKED_PARAMS), [unstack(g) for g in STACKED_GRADS]
    )
    for got, want in zip(stacked, separate):
        for key in ("w", "b", "s"):
            for i in range(L):
                np.testing.assert_array_equal(got["layers"][key][i], want["layers"][i][key])
        np.testing.assert_array_equal(got["head"], want["head"])
    # The state of a stacked leaf is the separate leaves' states, stacked (counts: one).
    flat, sep_flat = gradtx.state_dict(state), gradtx.state_dict(sep_state)
    for key, value in flat.items():
        slot, _, path = key.partition("/layers/")
        if not path:
            np.testing.assert_array_equal(value, sep_flat[key])
            continue
        parts = [sep_flat[f"{slot}/layers/{i}/{path}"] for i in range(L)]
        want = parts[0] if slot.endswith("count") else np.stack(parts)
        np.testing.assert_array_equal(value, want, err_msg=key)
    assert len(flat) == len(sep_flat) - (L - 1) * sum(1 for k in flat if "/layers/" in k)


def test_stacked_changes_the_result():
    """Guard against a vacuous check: without `stacked` the stack is one leaf, and the
    per-leaf norms differ."""
    stacked, _ = run(
        gradtx.scale_by_trust_ratio(stacked={"layers": 1}), STACKED_PARAMS, STACKED_GRADS[:1]
    )
    whole, _ = run(gradtx.scale_by_trust_ratio(), STACKED_PARAMS, STACKED_GRADS[:1])
    assert not np.allclose(stacked[0]["layers"]["w"], whole[0]["layers"]["w"])


def test_two_stack_axes_and_factored_slices():
    """`n = 2` leading axes; each (5, 4) slice is factored, a (5,) bias is not."""
    params = {"blocks": {"w": _normal(2, 3, 5, 4), "b": _normal(2, 3, 5)}}
    grads = [{"blocks": {"w": _normal(2, 3, 5, 4), "b": _normal(2, 3, 5)}} for _ in range(2)]
    tx = gradtx.scale_by_factored_rms(min_dim_size_to_factor=4, stacked={"blocks/*": 2})
    history, state = run(tx, params, grads)
    flat = {k: v.shape for k, v in gradtx.state_dict(state).items()}
    assert flat == {
        "v_row/blocks/w": (2, 3, 4),
        "v_col/blocks/w": (2, 3, 5),
        "v/blocks/b": (2, 3, 5),
        "count/blocks/b": (),
        "count/blocks/w": (),
    }
    one = gradtx.scale_by_factored_rms(min_dim_size_to_factor=4)
    for i in range(2):
        for j in range(3):
            single, _ = run(
                one, params["blocks"]["w"][i, j], [g["blocks"]["w"][i, j] for g in grads]
            )
            for k in range(2):
                np.testing.assert_array_equal(history[k]["blocks"]["w"][i, j], single[k])


def test_stacked_with_packed_params_matches_unpacked():
    tx = gradtx.scale_by_trust_ratio(stacked={"layers/w": 1})
    params, grads = STACKED_PARAMS, STACKED_GRADS[0]
    want, _ = tx.update(grads, tx.init(params), params)
    packed = gradtx.pack(params)
    got, _ = tx.update(gradtx.pack(grads), tx.init(packed), packed)
    for path, value in gradtx.paths.leaves(got.unpack()).items():
        np.testing.assert_allclose(value, gradtx.paths.leaves(want)[path], rtol=1e-6, err_msg=path)


def test_stacked_errors_name_the_selector_and_path():
    tx = gradtx.clip_by_block_rms(1.0, stacked={"layerz/**": 1})
    with pytest.raises(SelectorError, match="stacked selector 'layerz/\\*\\*' matches no path"):
        tx.init(STACKED_PARAMS)
    tx = gradtx.scale_by_trust_ratio(stacked={"layers": 2})
    with pytest.raises(ValueError, match=r"'layers' declares 2 .* 'layers/s' has shape \(3,\)"):
        tx.init(STACKED_PARAMS)
    tx = gradtx.scale_by_param_block_rms(stacked={"layers": 1, "**/w": 2})
    with pytest.raises(ValueError, match="'layers/w' is declared stacked with 1 axes"):
        tx.init(STACKED_PARAMS)
    with pytest.raises(TypeError, match="must be a dict"):
        gradtx.clip_by_block_rms(1.0, stacked="layers")
    with pytest.raises(TypeError, match="non-negative int"):
        gradtx.clip_by_block_rms(1.0, stacked={"layers": -1})
    # update checks the shapes it is given too
    tx = gradtx.clip_by_block_rms(1.0, stacked={"head": 2})
    with pytest.raises(ValueError, match="'head' has shape"):
        tx.update({"head": jnp.ones(3)}, {})


def test_stacked_under_jit_and_scan():
    tx = gradtx.adafactor(0.1, min_dim_size_to_factor=3, stacked={"layers": 1})

    @jax.jit
    def steps(params, state, grad_stack):
        def body(state, grads):
            updates, state = tx.update(grads, state, params)
            return state, updates

        return jax.lax.scan(body, state, grad_stack)

    stack = jax.tree.map(lambda *xs: jnp.stack(xs), *STACKED_GRADS)
    _, history = steps(STACKED_PARAMS, tx.init(STACKED_PARAMS), stack)
    eager, _ = run(tx, STACKED_PARAMS, STACKED_GRADS)
    for k in range(len(STACKED_GRADS)):
        np.testing.assert_allclose(history["layers"]["w"][k], eager[k]["layers"]["w"], rtol=1e-6)


# --- packed params ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tx",
    [
        gradtx.scale_by_factored_rms(),
        gradtx.adafactor(0.1),
        gradtx.per_example_global_norm_clip(1.0),
    ],
    ids=["scale_by_factored_rms", "adafactor", "per_example_global_norm_clip"],
)
def test_refuses_packed_params(tx):
    with pytest.raises(TypeError, match="packed params"):
        tx.init(gradtx.pack({"w": jnp.ones((2, 3))}))


# --- shapes: factored moments, AGC units --------------------------------------------------------


FACTORED_SHAPES = {"a": (2, 5, 3), "b": (4, 4), "c": (6, 2, 3), "d": (1, 7), "e": (3,)}


def test_factored_rms_shapes_match_optax_and_the_reference():
    params = {k: _normal(*s) for k, s in FACTORED_SHAPES.items()}
    grads = [{k: _normal(*s) for k, s in FACTORED_SHAPES.items()} for _ in range(3)]
    tx = gradtx.scale_by_factored_rms(decay_rate=0.7, min_dim_size_to_factor=2)
    history, state = run(tx, params, grads)
    shapes = {k: v.shape for k, v in gradtx.state_dict(state).items() if "count" not in k}
    # (2, 5, 3): largest axis 1, second 2; (4, 4): a tie, the later axis counts as largest;
    # (1, 7) has second largest 1 < 2: not factored.
    assert shapes == {
        "v_row/a": (2, 3),
        "v_col/a": (2, 5),
        "v_row/b": (4,),
        "v_col/b": (4,),
        "v_row/c": (2, 3),
        "v_col/c": (6, 2),
        "v/d": (1, 7),
        "v/e": (3,),
    }
    oracle = optax.scale_by_factored_rms(
        decay_rate=np.float32(0.7), min_dim_size_to_factor=2, epsilon=np.float32(1e-30)
    )
    reference = rpl.scale_by_factored_rms(0.7, 2)
    o_state, r_state = (
        oracle.init(params),
        reference.init({k: np.asarray(v) for k, v in params.items()}),
    )
    for k, g in enumerate(grads):
        with jax.numpy_dtype_promotion("standard"):
            o_updates, o_state = oracle.update(g, o_state, params)
        r_updates, r_state = reference.update({p: np.asarray(x) for p, x in g.items()}, r_state, {})
        for path in FACTORED_SHAPES:
            np.testing.assert_allclose(history[k][path], o_updates[path], rtol=2e-6, err_msg=path)
            np.testing.assert_allclose(history[k][path], r_updates[path], rtol=1e-5, err_msg=path)


def test_factored_rms_step_offset_and_decay_rate_fn():
    params, grads = {"w": _normal(3, 4)}, [{"w": _normal(3, 4)} for _ in range(3)]

    def capped(step, decay_rate):  # Zhai et al.: 1 - (t + 1)^-c, at most 0.9
        return jnp.minimum(1.0 - (step.astype(jnp.float32) + 1.0) ** (-decay_rate), 0.9)

    for kwargs in ({"step_offset": -4}, {"decay_rate_fn": capped}):
        tx = gradtx.scale_by_factored_rms(min_dim_size_to_factor=2, **kwargs)
        optax_kwargs = {"decay_rate_fn": capped} if "decay_rate_fn" in kwargs else kwargs
        oracle = optax.scale_by_factored_rms(
            min_dim_size_to_factor=2, decay_rate=np.float32(0.8), **optax_kwargs
        )
        history, _ = run(tx, params, grads)
        o_state = oracle.init(params)
        for k, g in enumerate(grads):
            with jax.numpy_dtype_promotion("standard"):
                o_updates, o_state = oracle.update(g, o_state, params)
            np.testing.assert_allclose(history[k]["w"], o_updates["w"], rtol=2e-6)
    # the offset matters: a fresh schedule starts at decay 0, an offset one does not
    plain, _ = run(gradtx.scale_by_factored_rms(min_dim_size_to_factor=2), params, grads)
    offset, _ = run(
        gradtx.scale_by_factored_rms(min_dim_size_to_factor=2, step_offset=-4), params, grads
    )
    assert not np.allclose(plain[1]["w"], offset[1]["w"])


AGC_SHAPES = {"conv": (2, 2, 3, 4), "conv3d": (2, 1, 2, 3, 2), "heads": (3, 2, 4), "row": (1, 5)}


def test_adaptive_grad_clip_units_match_optax():
    params = {k: _normal(*s) for k, s in AGC_SHAPES.items()}
    grads = {k: 2.0 * _normal(*s) for k, s in AGC_SHAPES.items()}
    got, _ = gradtx.adaptive_grad_clip(0.4).update(grads, {}, params)
    want, _ = optax.adaptive_grad_clip(np.float32(0.4)).update(grads, optax.EmptyState(), params)
    for path in AGC_SHAPES:
        np.testing.assert_allclose(got[path], want[path], rtol=1e-6, err_msg=path)
        reference = rpl.agc_leaf(np.asarray(grads[path]), np.asarray(params[path]), 0.4, 1e-3)
        np.testing.assert_allclose(got[path], reference, rtol=1e-5, err_msg=path)
        assert not np.allclose(got[path], grads[path])  # some unit was clipped

    params = {k: params[k] for k in ("conv", "heads")}
    grads = {k: grads[k] for k in ("conv", "heads")}
    got, _ = gradtx.adaptive_grad_clip(0.4, axis=(1, 2)).update(grads, {}, params)
    o_tx = optax.adaptive_grad_clip(np.float32(0.4), axis=(1, 2))
    want, _ = o_tx.update(grads, optax.EmptyState(), params)
    for path in ("conv", "heads"):
        np.testing.assert_allclose(got[path], want[path], rtol=1e-6, err_msg=path)

    with pytest.raises(ValueError, match=r"shape \(1, 2, 1, 2, 1, 2\).*pass `axis=`"):
        big = {"x": jnp.ones((1, 2, 1, 2, 1, 2))}
        gradtx.adaptive_grad_clip(0.4).update(big, {}, big)


# --- edge cases of the per-leaf rules -----------------------------------------------------------


def test_zero_norms_and_thresholds():
    params = {"w": jnp.zeros(3), "v": jnp.array([3.0, 4.0])}
    grads = {"w": jnp.array([1.0, 2.0, 2.0]), "v": jnp.zeros(2)}
    u, _ = gradtx.scale_by_trust_ratio().update(grads, {}, params)
    np.testing.assert_array_equal(u["w"], grads["w"])  # zero param: ratio 1
    np.testing.assert_array_equal(u["v"], grads["v"])
    u, _ = gradtx.clip_by_block_rms(0.0).update(grads, {})
    np.testing.assert_array_equal(u["w"], jnp.zeros(3))  # all clipped away, no NaN
    np.testing.assert_array_equal(u["v"], jnp.zeros(2))
    u, _ = gradtx.scale_by_param_block_rms(0.01).update(grads, {}, params)
    np.testing.assert_allclose(u["w"], 0.01 * grads["w"])
    u, _ = gradtx.adaptive_grad_clip(0.1, eps=0.5).update(grads, {}, params)
    np.testing.assert_allclose(u["w"], grads["w"] * 0.05 / 3.0, rtol=1e-6)  # limit 0.1 * 0.5


def test_bf16_leaves_stay_bf16_with_stacking():
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), STACKED_PARAMS)
    grads = jax.tree.map(lambda x: x.astype(jnp.bfloat16), STACKED_GRADS[0])
    tx = gradtx.adafactor(0.1, min_dim_size_to_factor=3, stacked={"layers": 1})
    u, state = tx.update(grads, tx.init(params), params)
    for path, x in gradtx.paths.leaves(u).items():
        assert x.dtype == jnp.bfloat16, path
        assert bool(jnp.all(jnp.isfinite(x))), path
    assert gradtx.state_dict(state)["v_row/layers/w"].dtype == jnp.bfloat16


# --- per-example clipping -----------------------------------------------------------------------


def test_per_example_global_norm_clip_matches_optax_docs():
    grads = {"w": jnp.array([[0.0, 0.0, 0.0], [0.0, 3.0, 4.0], [4.0, 0.0, 3.0], [3.0, 4.0, 0.0]])}
    params = {"w": jnp.zeros(3)}
    for clip, total, clipped in ((jnp.inf, 7.0, 0), (0.0, 0.0, 3), (1.25, 1.75, 3)):
        tx = gradtx.per_example_global_norm_clip(clip)
        u, state = tx.update(grads, tx.init(params))
        np.testing.assert_allclose(u["w"], [total] * 3, rtol=1e-6)
        assert int(state["num_clipped"]) == clipped


def test_per_example_global_norm_clip_in_a_dp_step():
    """Per-example gradients from `vmap(grad)`; the norm spans every leaf of one example."""

    def loss(params, x):
        return jnp.sum(params["w"] * x) + params["b"] * jnp.sum(x)

    params = {"w": jnp.ones(3), "b": jnp.array(0.5), "frozen": None}
    xs = _normal(5, 3)
    per_example = jax.vmap(jax.grad(loss), (None, 0))(params, xs)
    tx = gradtx.chain(gradtx.per_example_global_norm_clip(1.0), gradtx.scale(1 / 5))
    u, _ = jax.jit(tx.update)(per_example, tx.init(params))
    assert u["frozen"] is None and u["w"].shape == (3,) and u["b"].shape == ()
    want, _ = optax.per_example_global_norm_clip(
        [per_example["b"], per_example["w"]], np.float32(1.0)
    )
    np.testing.assert_allclose(u["b"], want[0] / 5, rtol=1e-6)
    np.testing.assert_allclose(u["w"], want[1] / 5, rtol=1e-6)


def test_per_example_global_norm_clip_needs_one_batch_axis():
    tx = gradtx.per_example_global_norm_clip(1.0)
    state = tx.init({"a": jnp.zeros(2), "b": jnp.zeros(2)})
    with pytest.raises(ValueError, match=r"disagree on the batch size.*'a': 4.*'b': 3"):
        tx.update({"a": jnp.ones((4, 2)), "b": jnp.ones((3, 2))}, state)
    with pytest.raises(ValueError, match="'a' is a scalar"):
        tx.update({"a": jnp.ones(()), "b": jnp.ones((3, 2))}, state)
