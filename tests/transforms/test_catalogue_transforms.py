"""Transformations of the catalogue beyond the contract suite: SM3's cover sets, optimistic Adam's
variants, `apply_every`'s cycles, per-layer per-example clipping, the unit-wise helpers of
AGC, parameter block norms, the layer-wise DoG and Lion's soft modes. Each is checked against
its NumPy reference (tests/contract/references/) and, where optax has it, against optax."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import references.clipping as rclip
import references.optimistic as ro
import references.per_leaf as rpl
import references.sign as rs
import references.wrappers as rw

import gradtx

RNG = np.random.default_rng(11)


def _normal(*shape: int, scale: float = 1.0) -> jax.Array:
    return jnp.asarray((scale * RNG.normal(size=shape)).astype(np.float32))


def _flat(tree) -> dict[str, np.ndarray]:
    return {p: np.asarray(x, np.float64) for p, x in gradtx.paths.leaves(tree).items()}


def _close(got, want, rtol: float = 1e-5, scale=None) -> None:
    """Equal within `rtol` relative to each leaf's largest magnitude (or to `scale[path]`)."""
    got, want = _flat(got), {p: np.asarray(x, np.float64) for p, x in want.items()}
    assert set(got) == set(want)
    for path, x in got.items():
        size = np.abs(want[path] if scale is None else scale[path])
        atol = rtol * float(np.max(size, initial=0.0))
        np.testing.assert_allclose(x, want[path], rtol=rtol, atol=atol, err_msg=path)


def run_against(tx, reference, params, grads_seq, oracle=None, *, rtol=1e-5, apply=True):
    """Run `tx`, its reference and (optionally) an optax oracle side by side; compare every
    step's updates. With `apply`, the updates are added to the params between steps."""
    state = tx.init(params)
    ref_params = _flat(params)
    ref_state = reference.init(ref_params)
    o_params, o_state = params, None if oracle is None else oracle.init(params)
    for grads in grads_seq:
        updates, state = tx.update(grads, state, params)
        want, ref_state = reference.update(_flat(grads), ref_state, ref_params)
        _close(updates, want, rtol)
        if oracle is not None:
            with jax.numpy_dtype_promotion("standard"), jax.numpy_rank_promotion("allow"):
                o_updates, o_state = oracle.update(grads, o_state, o_params)
            _close(updates, _flat(o_updates), 1e-6)
        if apply:
            params = gradtx.apply_updates(params, updates)
            ref_params = {p: x + want[p] for p, x in ref_params.items()}
            if oracle is not None:
                o_params = optax.apply_updates(o_params, o_updates)
    return state


# --- SM3 ----------------------------------------------------------------------------------------

SM3_PARAMS = {"t": _normal(2, 3, 2), "w": _normal(3, 4), "b": _normal(4), "e": jnp.zeros((0, 3))}
SM3_GRADS = [
    {"t": _normal(2, 3, 2), "w": _normal(3, 4), "b": _normal(4), "e": jnp.zeros((0, 3))}
    for _ in range(4)
]
# A zero gradient somewhere: SM3 takes 0/0 = 0.
SM3_GRADS[0]["w"] = SM3_GRADS[0]["w"].at[1].set(0.0)


@pytest.mark.parametrize("b2", [1.0, 0.9], ids=["sums", "averages"])
def test_sm3_matches_its_reference_and_optax_on_every_rank(b2):
    tx = gradtx.scale_by_sm3(b1=0.8, b2=b2)
    reference = rpl.scale_by_sm3(b1=0.8, b2=b2)
    run_against(tx, reference, SM3_PARAMS, SM3_GRADS, apply=False)
    # optax takes no zero-size array (a maximum over nothing) and no scalar.
    oracle = optax.scale_by_sm3(np.float32(0.8), np.float32(b2))
    nonempty = [{p: x for p, x in g.items() if p != "e"} for g in (SM3_PARAMS, *SM3_GRADS)]
    run_against(tx, reference, nonempty[0], nonempty[1:], oracle, apply=False)


def test_sm3_keeps_one_accumulator_per_row_and_column():
    params = {"w": jnp.zeros((4, 3)), "t": jnp.zeros((2, 3, 5)), "s": jnp.zeros(())}
    state = gradtx.sm3(0.1).init(params)
    shapes = {k: v.shape for k, v in gradtx.state_dict(state).items() if k.startswith("v/")}
    assert shapes == {"v/w": (7,), "v/t": (10,), "v/s": ()}
    # The first step sees g^2 itself; each accumulator then holds its cover set's maximum.
    g = _normal(4, 3)
    _, state = gradtx.scale_by_sm3().update({"w": g}, gradtx.scale_by_sm3().init({"w": g}))
    square = np.asarray(g, np.float64) ** 2
    want = np.concatenate([square.max(axis=1), square.max(axis=0)])
    np.testing.assert_allclose(state["v"]["w"], want, rtol=1e-6)


def test_sm3_refuses_packed_params():
    with pytest.raises(TypeError, match="scale_by_sm3 keeps accumulators.*packed params"):
        gradtx.sm3(0.1).init(gradtx.pack({"w": jnp.zeros((2, 3))}))


# --- optimistic Adam ----------------------------------------------------------------------------

GAME_PARAMS = {"w": _normal(3, 2), "b": _normal(2)}
GAME_GRADS = [{"w": _normal(3, 2), "b": _normal(2)} for _ in range(6)]


def _optax_optimistic_adam(*args, **kwargs):
    with warnings.catch_warnings():  # optax 0.2.8 deprecates it for optimistic_adam_v2
        warnings.simplefilter("ignore", DeprecationWarning)
        return optax.optimistic_adam(*args, **kwargs)


@pytest.mark.parametrize("nesterov", [True, False], ids=["nadam", "adam"])
def test_optimistic_adam_with_its_own_optimism(nesterov):
    tx = gradtx.optimistic_adam(0.05, optimism=0.3, nesterov=nesterov)
    oracle = _optax_optimistic_adam(
        np.float32(0.05), np.float32(0.3), np.float32(0.9), np.float32(0.999), nesterov=nesterov
    )
    reference = ro.optimistic_adam(0.05, 0.3, nesterov=nesterov)
    # `1 - 0.999**t` loses about 5 digits in float32 (as in optax), and the optimism 0.3 > lr
    # weighs the difference of two such directions: 1e-4 against the float64 reference.
    run_against(tx, reference, GAME_PARAMS, GAME_GRADS, oracle, rtol=1e-4)


def test_optimistic_adam_without_nesterov_is_daskalakis_algorithm_1():
    """theta_t = theta_{t-1} - 2 lr r_t + lr r_{t-1} with r_t = m_hat / (sqrt(v_hat) + eps)
    (their Algorithm 1), from the second step on; the first step is lr r_1."""
    lr, b1, b2, eps = 0.05, 0.9, 0.999, 1e-8
    tx = gradtx.optimistic_adam(lr, nesterov=False)
    state = tx.init(GAME_PARAMS)
    m = v = 0.0
    previous = None
    for t, grads in enumerate(GAME_GRADS, start=1):
        updates, state = tx.update(grads, state, GAME_PARAMS)
        g = np.asarray(grads["b"], np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        r = (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        want = -lr * r if previous is None else -2 * lr * r + lr * previous
        np.testing.assert_allclose(updates["b"], want, rtol=2e-5)
        previous = r


def test_optimistic_adam_settles_optax_bilinear_game():
    """optax's documented example: min_x max_y x*y from (1, 2), optimism 1 and lr 0.01."""
    tx = gradtx.optimistic_adam(1e-2, 1.0)

    def step(carry, _):
        params, state = carry
        x, y = params["x"], params["y"]
        grads = {"x": y, "y": -x}  # descend in x, ascend in y
        updates, state = tx.update(grads, state, params)
        return (gradtx.apply_updates(params, updates), state), jnp.hypot(x, y)

    params = {"x": jnp.float32(1.0), "y": jnp.float32(2.0)}
    _, distances = jax.lax.scan(step, (params, tx.init(params)), length=1025)
    shown = [float(distances[4**i]) for i in range(6)]
    np.testing.assert_allclose(shown, [2.243, 2.195, 2.161, 2.055, 0.796, 0.001], atol=2e-3)


def test_optimistic_adam_refuses_a_schedule():
    with pytest.raises(TypeError, match="optimistic_adam: `learning_rate` must be a number"):
        gradtx.optimistic_adam(gradtx.schedules.linear(0.1, 0.0, 10))


# --- apply_every --------------------------------------------------------------------------------


def test_apply_every_releases_the_sum_of_each_cycle():
    params = {"w": jnp.zeros(3)}
    grads = [{"w": _normal(3)} for _ in range(7)]
    for k in (1, 2, 3):
        run_against(gradtx.apply_every(k), rw.apply_every(k), params, grads, optax.apply_every(k))


def test_apply_every_counts_cycles_per_path():
    """A path without a gradient (`None`) does not advance its cycle."""
    tx = gradtx.apply_every(2)
    state = tx.init({"a": jnp.zeros(()), "b": jnp.zeros(())})
    one = jnp.float32(1.0)
    u, state = tx.update({"a": one, "b": one}, state)
    u, state = tx.update({"a": one, "b": None}, state)
    assert float(u["a"]) == 2.0 and u["b"] is None
    u, state = tx.update({"a": one, "b": one}, state)
    assert float(u["a"]) == 0.0 and float(u["b"]) == 2.0


def test_apply_every_after_sgd_sums_k_steps():
    tx = gradtx.chain(gradtx.sgd(0.1), gradtx.apply_every(2))
    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    _, state = tx.update({"w": jnp.ones(2)}, state)
    u, state = tx.update({"w": 3 * jnp.ones(2)}, state)
    np.testing.assert_allclose(u["w"], [-0.4, -0.4], rtol=1e-6)


def test_apply_every_refuses_k_below_one():
    with pytest.raises(ValueError, match="apply_every: `k` must be a positive number"):
        gradtx.apply_every(0)


# --- per-example, per-layer clipping ------------------------------------------------------------


def test_per_example_layer_norm_clip_matches_optax_docs():
    """optax's documented values: with one leaf it is the global clip."""
    grads = {"w": jnp.array([[0.0, 0.0, 0.0], [0.0, 3.0, 4.0], [4.0, 0.0, 3.0], [3.0, 4.0, 0.0]])}
    params = {"w": jnp.zeros(3)}
    for clip, total, clipped in ((jnp.inf, 7.0, 0), (0.0, 0.0, 3), (1.25, 1.75, 3)):
        tx = gradtx.per_example_layer_norm_clip(clip)
        u, state = tx.update(grads, tx.init(params))
        np.testing.assert_allclose(u["w"], [total] * 3, rtol=1e-6)
        assert int(state["num_clipped"]["w"]) == clipped
        same, _ = gradtx.per_example_global_norm_clip(clip).update(grads, {"num_clipped": 0})
        np.testing.assert_allclose(u["w"], same["w"], rtol=1e-6)


@pytest.mark.parametrize("uniform", [True, False], ids=["uniform", "by_size"])
def test_per_example_layer_norm_clip_matches_reference_and_optax(uniform):
    grads = {"w": _normal(6, 4, 5), "b": _normal(6, 5, scale=0.2), "s": _normal(6, scale=3.0)}
    params = {p: g[0] for p, g in grads.items()}
    tx = gradtx.per_example_layer_norm_clip(1.5, uniform)
    u, state = tx.update(grads, tx.init(params))
    want, _ = rclip.per_example_layer_norm_clip(1.5, uniform).update(
        _flat(grads), {"num_clipped": {}}, {}
    )
    # A sum over examples may cancel: its rounding is relative to the terms summed.
    terms = {p: np.sum(np.abs(g), axis=0) for p, g in _flat(grads).items()}
    _close(u, want, scale=terms)
    summed, counts = optax.per_example_layer_norm_clip(grads, np.float32(1.5), uniform)
    _close(u, _flat(summed), 1e-6, scale=terms)
    assert {p: int(n) for p, n in state["num_clipped"].items()} == {
        p: int(n) for p, n in counts.items()
    }
    assert set(gradtx.stats(state)) == {"num_clipped/b", "num_clipped/s", "num_clipped/w"}


def test_per_example_layer_norm_clip_needs_one_batch_axis():
    tx = gradtx.per_example_layer_norm_clip(1.0)
    state = tx.init({"a": jnp.zeros(2), "b": jnp.zeros(2)})
    with pytest.raises(ValueError, match=r"disagree on the batch size.*'a': 4.*'b': 3"):
        tx.update({"a": jnp.ones((4, 2)), "b": jnp.ones((3, 2))}, state)
    with pytest.raises(ValueError, match="'a' is a scalar"):
        tx.update({"a": jnp.ones(()), "b": jnp.ones((3, 2))}, state)
    with pytest.raises(KeyError, match="no entry for path 'c'"):
        tx.update({"c": jnp.ones((3, 2))}, state)


# --- AGC's unit-wise helpers --------------------------------------------------------------------

UNIT_SHAPES = [(), (5,), (1, 4, 1), (3, 4), (2, 3, 4), (2, 2, 3, 4), (2, 2, 2, 3, 4)]


@pytest.mark.parametrize("shape", UNIT_SHAPES, ids=str)
def test_unitwise_norm_matches_reference_and_optax(shape):
    x = _normal(*shape)
    got = gradtx.unitwise_norm(x)
    assert got.shape == x.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(got, rclip.unitwise_norm(np.asarray(x)), rtol=1e-6)
    np.testing.assert_allclose(got, optax.transforms.unitwise_norm(x), rtol=1e-6)


def test_unitwise_norm_axis_and_misuse():
    x = _normal(3, 4, 5)
    np.testing.assert_allclose(
        gradtx.unitwise_norm(x, axis=(1, 2)), rclip.unitwise_norm(np.asarray(x), (1, 2)), rtol=1e-6
    )
    np.testing.assert_allclose(
        gradtx.unitwise_norm(x, axis=2), optax.transforms.unitwise_norm(x, axis=2), rtol=1e-6
    )
    with pytest.raises(ValueError, match=r"unitwise_norm: no default unit.*rank 6.*`axis=`"):
        gradtx.unitwise_norm(jnp.ones((2,) * 6))
    with pytest.raises(TypeError, match="`axis` must be an int"):
        gradtx.unitwise_norm(x, axis="rows")


def test_unitwise_clip_matches_reference_and_optax():
    grad = _normal(4, 3)
    g_norm = gradtx.unitwise_norm(grad)
    max_norm = jnp.broadcast_to(jnp.array([0.5, 10.0, 1.0], jnp.float32), (4, 3))
    got = gradtx.unitwise_clip(g_norm, max_norm, grad)
    want = rclip.unitwise_clip(np.asarray(g_norm), np.asarray(max_norm), np.asarray(grad))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, optax.transforms.unitwise_clip(g_norm, max_norm, grad))
    # The norms may keep the rank with size-1 axes (keepdims), and bf16 stays bf16.
    keepdims = gradtx.unitwise_clip(g_norm[:1], max_norm[:1], grad.astype(jnp.bfloat16))
    assert keepdims.dtype == jnp.bfloat16
    np.testing.assert_allclose(keepdims.astype(jnp.float32), got, rtol=1e-2, atol=1e-2)


def test_unitwise_clip_names_the_misshapen_argument():
    grad = jnp.ones((4, 3))
    with pytest.raises(ValueError, match=r"unitwise_clip: `max_norm` has shape \(3,\)"):
        gradtx.unitwise_clip(jnp.ones((4, 3)), jnp.ones(3), grad)
    with pytest.raises(ValueError, match=r"`g_norm` has shape \(4, 2\)"):
        gradtx.unitwise_clip(jnp.ones((4, 2)), jnp.ones((4, 3)), grad)


# --- parameter block norm -----------------------------------------------------------------------


def test_scale_by_param_block_norm_on_stacked_layers():
    """Each slice of a stacked leaf is scaled by its own norm, as separate leaves are."""
    params = {"layers": {"w": _normal(3, 2, 4)}, "b": _normal(4)}
    grads = {"layers": {"w": _normal(3, 2, 4)}, "b": _normal(4)}
    tx = gradtx.scale_by_param_block_norm(0.1, stacked={"layers/**": 1})
    u, _ = tx.update(grads, {}, params)
    for i in range(3):
        want = np.asarray(grads["layers"]["w"][i]) * np.linalg.norm(params["layers"]["w"][i])
        np.testing.assert_allclose(u["layers"]["w"][i], want, rtol=1e-6)
    np.testing.assert_allclose(
        u["b"], np.asarray(grads["b"]) * np.linalg.norm(params["b"]), rtol=1e-6
    )


# --- layer-wise DoG -----------------------------------------------------------------------------


def test_distance_over_gradients_matches_reference_and_optax():
    params = {"w": _normal(3, 4), "b": _normal(4)}
    grads = [{"w": _normal(3, 4), "b": _normal(4)} for _ in range(6)]
    tx = gradtx.scale_by_distance_over_gradients(1e-3, global_scale=-1.0, param_dtype=jnp.float32)
    oracle = optax.scale_by_distance_over_gradients(np.float32(1e-3), global_scale=np.float32(-1))
    reference = rpl.scale_by_distance_over_gradients(1e-3, global_scale=-1.0)
    run_against(tx, reference, params, grads, oracle)


def test_distance_over_gradients_of_one_path_is_global_dog():
    """With a single path, the layer-wise step is DoG's global step (contrib.scale_by_dog
    with the same heuristic start)."""
    params = {"w": _normal(5)}
    grads = [{"w": _normal(5)} for _ in range(5)]
    layer = gradtx.scale_by_distance_over_gradients(1e-2)
    whole = gradtx.contrib.scale_by_dog(("heuristic", 1e-2))
    s1, s2, p = layer.init(params), whole.init(params), params
    for g in grads:
        u1, s1 = layer.update(g, s1, p)
        u2, s2 = whole.update(g, s2, p)
        np.testing.assert_allclose(u1["w"], u2["w"], rtol=1e-6)
        p = gradtx.apply_updates(p, gradtx.tree.scale(-1.0, u1))


def test_distance_over_gradients_state_dtype_and_params():
    params = {"w": _normal(3, 2).astype(jnp.bfloat16)}
    state = gradtx.scale_by_distance_over_gradients().init(params)
    assert {x.dtype for x in jax.tree.leaves(state)} == {jnp.dtype(jnp.bfloat16)}
    wide = gradtx.scale_by_distance_over_gradients(param_dtype=jnp.float32)
    assert {x.dtype for x in jax.tree.leaves(wide.init(params))} == {jnp.dtype(jnp.float32)}
    structs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    assert not np.any(np.asarray(wide.init(structs)["init_params"]["w"]))
    with pytest.raises(ValueError, match="needs the params"):
        wide.update(params, wide.init(params))
    with pytest.raises(TypeError, match="packed params"):
        wide.init(gradtx.pack(params))


# --- Lion's soft modes --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["hard", "smooth", "refined"])
def test_lion_modes_match_reference_and_optax(mode):
    params = {"w": _normal(3, 4), "s": jnp.zeros(())}
    grads = [{"w": _normal(3, 4, scale=3.0), "s": _normal(scale=0.5)} for _ in range(5)]
    tx = gradtx.scale_by_lion(mode=mode, smooth_beta=2.0)
    oracle = optax.scale_by_lion(np.float32(0.9), np.float32(0.99), mode=mode, smooth_beta=2.0)
    reference = rs.scale_by_lion(mode=mode, smooth_beta=2.0)
    run_against(tx, reference, params, grads, oracle, apply=False)


def test_lion_passes_its_mode_on():
    params = {"w": jnp.zeros(2)}
    grads = {"w": jnp.array([0.5, -20.0])}
    tx = gradtx.lion(1.0, weight_decay=0.0, mode="refined")
    u, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(u["w"], [-0.05, 1.0], rtol=1e-6)
    # Only the smooth mode keeps `smooth_beta`: the sign keeps the leaves it had.
    assert len(jax.tree.leaves(gradtx.scale_by_lion(smooth_beta=3.0))) == 2
    assert len(jax.tree.leaves(gradtx.scale_by_lion(mode="smooth"))) == 3
    with pytest.raises(ValueError, match="scale_by_lion: `mode` must be one of"):
        gradtx.lion(1e-3, mode="soft")
