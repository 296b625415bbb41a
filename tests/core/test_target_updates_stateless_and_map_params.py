"""Functional helpers with optax's names: target-network updates, transformations made from
functions, and `tree_map_params`. NumPy (float64) references first, optax second."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx

RNG = np.random.default_rng(0)


def _r(*shape: int, dtype: Any = jnp.float32) -> jax.Array:
    return jnp.asarray(RNG.normal(size=shape).astype(np.float32), dtype)


ONLINE = {"enc": {"w": _r(2, 3), "b": _r(3)}, "layers": [_r(4), _r()], "frozen": None}
TARGET = {"enc": {"w": _r(2, 3), "b": _r(3)}, "layers": [_r(4), _r()], "frozen": None}


def flat(tree: Any) -> dict[str, np.ndarray]:
    return {
        p: np.asarray(x, np.float64) for p, x in gradtx.paths.leaves(tree).items() if x is not None
    }


@dataclasses.dataclass
class Layer:
    """A dataclass container with the paths `w` and `b`."""

    w: Any
    b: Any


jax.tree_util.register_dataclass(Layer, data_fields=["w", "b"], meta_fields=[])


# --- incremental_update (Polyak averaging) ------------------------------------------------------


@pytest.mark.parametrize("tau", [0.0, 0.01, 0.5, 1.0])
def test_incremental_update_against_numpy_and_optax(tau):
    got = gradtx.incremental_update(ONLINE, TARGET, tau)
    t = float(np.float32(tau))
    new, old = flat(ONLINE), flat(TARGET)
    for path, x in flat(got).items():
        np.testing.assert_allclose(x, t * new[path] + (1 - t) * old[path], rtol=1e-6, atol=1e-7)
    assert got["frozen"] is None
    with jax.numpy_dtype_promotion("standard"):
        oracle = optax.incremental_update(ONLINE, TARGET, tau)
    for path, x in flat(oracle).items():
        np.testing.assert_allclose(flat(got)[path], x, rtol=1e-6, atol=1e-7)


def test_incremental_update_matches_by_path_and_keeps_the_targets_dtype_and_container():
    online = {"w": jnp.array([1.0, 2.0]), "b": None}
    target = Layer(w=jnp.zeros(2, jnp.bfloat16), b=jnp.ones(1))
    got = jax.jit(gradtx.incremental_update)(online, target, jnp.float32(0.25))
    assert isinstance(got, Layer)
    assert got.w.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got.w, np.float32), [0.25, 0.5])
    np.testing.assert_array_equal(got.b, [1.0])  # no new value: the target keeps its own


def test_incremental_update_on_packed_params():
    online, target = gradtx.pack(ONLINE), gradtx.pack(TARGET)
    got = gradtx.incremental_update(online, target, 0.1)
    want = gradtx.incremental_update(ONLINE, TARGET, 0.1)
    for path, x in flat(got.unpack()).items():
        np.testing.assert_allclose(x, flat(want)[path], rtol=1e-6)


def test_incremental_update_errors_name_the_path():
    with pytest.raises(
        ValueError, match=r"path 'enc/b' is in `old_tensors` but not in `new_tensors`"
    ):
        gradtx.incremental_update(
            {"enc": {"w": jnp.ones(1)}}, {"enc": {"w": jnp.ones(1), "b": jnp.ones(1)}}, 0.1
        )
    with pytest.raises(ValueError, match=r"at path 'w' `new_tensors` has shape \(2,\)"):
        gradtx.incremental_update({"w": jnp.ones(2)}, {"w": jnp.ones(3)}, 0.1)
    with pytest.raises(ValueError, match="`step_size` must be a scalar"):
        gradtx.incremental_update({"w": jnp.ones(2)}, {"w": jnp.ones(2)}, jnp.ones(2))


# --- periodic_update ----------------------------------------------------------------------------


@pytest.mark.parametrize("period", [1, 2, 3])
def test_periodic_update_copies_every_period_steps(period):
    step = jax.jit(gradtx.periodic_update)
    for t in range(7):
        got = step(ONLINE, TARGET, jnp.int32(t), jnp.int32(period))
        source = ONLINE if t % period == 0 else TARGET  # the reference: copy iff t mod K = 0
        for path, x in flat(got).items():
            np.testing.assert_array_equal(x, flat(source)[path])
        oracle = optax.periodic_update(ONLINE, TARGET, t, period)
        for path, x in flat(oracle).items():
            np.testing.assert_array_equal(flat(got)[path], x)
    assert step._cache_size() == 1  # traced steps: one compilation


def test_periodic_update_keeps_the_targets_dtype_and_container():
    target = Layer(w=jnp.zeros(2, jnp.bfloat16), b=jnp.ones(1))
    got = gradtx.periodic_update({"w": jnp.array([1.5, 2.5]), "b": None}, target, 4, 2)
    assert isinstance(got, Layer) and got.w.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got.w, np.float32), [1.5, 2.5])
    np.testing.assert_array_equal(got.b, [1.0])


def test_periodic_update_errors():
    tree = {"w": jnp.ones(2)}
    with pytest.raises(ValueError, match="`update_period` must be >= 1"):
        gradtx.periodic_update(tree, tree, 3, 0)
    with pytest.raises(TypeError, match="`steps` must be an integer"):
        gradtx.periodic_update(tree, tree, 3.0, 2)
    with pytest.raises(ValueError, match=r"path 'v' is in `new_tensors` but not in `old_tensors`"):
        gradtx.periodic_update({"w": jnp.ones(2), "v": jnp.ones(1)}, tree, 2, 2)


# --- stateless ----------------------------------------------------------------------------------


def decay_step(rate: Any, updates: Any, params: Any) -> Any:
    """`u = -(g + rate * p)`, by path; without params, `u = -g`."""
    if params is None:
        return gradtx.tree.scale(-1.0, updates)
    return gradtx.tree.scale(-1.0, gradtx.tree.add(updates, gradtx.tree.scale(rate, params)))


def test_stateless_against_numpy_and_optax():
    tx = gradtx.stateless(jax.tree_util.Partial(decay_step, 0.5))
    assert tx.init(ONLINE) == {}
    u, state = jax.jit(tx.update)(TARGET, {}, ONLINE)
    assert state == {}
    g, p = flat(TARGET), flat(ONLINE)
    for path, x in flat(u).items():
        np.testing.assert_allclose(x, -(g[path] + 0.5 * p[path]), rtol=1e-6)
    oracle = optax.stateless(lambda g, p: jax.tree.map(lambda a, b: -(a + 0.5 * b), g, p))
    o_u, _ = oracle.update(TARGET, oracle.init(ONLINE), ONLINE)
    for path, x in flat(o_u).items():
        np.testing.assert_allclose(flat(u)[path], x, rtol=1e-6)
    # without params `f` gets None; a None gradient leaf stays None (gradtx.tree keeps it)
    grads = {**TARGET, "enc": {**TARGET["enc"], "w": None}}
    u, _ = tx.update(grads, {})
    assert u["enc"]["w"] is None
    np.testing.assert_allclose(u["enc"]["b"], -np.asarray(TARGET["enc"]["b"]))


def test_stateless_sweeps_a_partial_argument_without_recompiling():
    def make(rate):
        return gradtx.stateless(jax.tree_util.Partial(decay_step, rate))

    traces = []

    @jax.jit
    def step(tx, grads, params):
        traces.append(1)
        return tx.update(grads, {}, params)[0]

    a, b = step(make(0.1), TARGET, ONLINE), step(make(0.2), TARGET, ONLINE)
    assert len(traces) == 1
    assert not np.allclose(a["enc"]["w"], b["enc"]["w"])
    stacked = jax.vmap(make)(jnp.array([0.1, 0.2]))
    swept = jax.vmap(lambda tx: tx.update(TARGET, {}, ONLINE)[0])(stacked)
    np.testing.assert_allclose(swept["enc"]["w"][1], b["enc"]["w"], rtol=1e-6)


def test_explain_names_the_steps_without_calling_f():
    def fails(*args: Any) -> Any:
        raise AssertionError("f was called")

    tx = gradtx.chain(gradtx.stateless(fails), gradtx.stateless_with_tree_map(fails))
    row = gradtx.explain(tx, {"w": jnp.ones(2)})["w"]
    assert row.steps == ("stateless", "stateless_with_tree_map") and row.hyperparams == {}


def drop_bias(updates: Any, params: Any) -> Any:
    return {"w": updates["w"]}


def test_stateless_errors():
    with pytest.raises(TypeError, match="stateless: `f` must be a function"):
        gradtx.stateless(1.0)
    tx = gradtx.stateless(drop_bias)
    with pytest.raises(ValueError, match=r"stateless: `f` must return .* path 'b' is missing"):
        tx.update({"w": jnp.ones(1), "b": jnp.ones(1)}, {})
    with pytest.raises(TypeError, match="packed params"):
        tx.init(gradtx.pack({"w": jnp.ones(2)}))
    with pytest.raises(TypeError, match="packed params"):
        tx.update(gradtx.pack({"w": jnp.ones(2)}), {})


# --- stateless_with_tree_map --------------------------------------------------------------------


def normalized_step(g: Any, p: Any) -> Any:
    """`u = -g / size(g) + p`, so the result depends on each leaf's own shape."""
    out = -g / g.size
    return out if p is None else out + p


def test_stateless_with_tree_map_against_numpy_and_optax():
    tx = gradtx.stateless_with_tree_map(normalized_step)
    u, _ = tx.update(TARGET, tx.init(ONLINE), ONLINE)
    g, p = flat(TARGET), flat(ONLINE)
    for path, x in flat(u).items():
        np.testing.assert_allclose(x, -g[path] / max(g[path].size, 1) + p[path], rtol=1e-6)
    oracle = optax.stateless_with_tree_map(normalized_step)
    o_u, _ = oracle.update(TARGET, oracle.init(ONLINE), ONLINE)
    for path, x in flat(o_u).items():
        np.testing.assert_allclose(flat(u)[path], x, rtol=1e-6)
    u, _ = tx.update({**TARGET, "layers": [None, TARGET["layers"][1]]}, {})  # no params
    assert u["layers"][0] is None
    np.testing.assert_allclose(u["layers"][1], -np.asarray(TARGET["layers"][1]))


def test_stateless_with_tree_map_sees_each_packed_leaf_in_its_own_shape():
    tx = gradtx.stateless_with_tree_map(normalized_step)
    packed_u, _ = tx.update(gradtx.pack(TARGET), {}, gradtx.pack(ONLINE))
    u, _ = tx.update(TARGET, {}, ONLINE)
    for path, x in flat(packed_u.unpack()).items():
        np.testing.assert_allclose(x, flat(u)[path], rtol=1e-6)


def test_stateless_with_tree_map_errors():
    with pytest.raises(TypeError, match="stateless_with_tree_map: `f` must be a function"):
        gradtx.stateless_with_tree_map("add")


# --- tree_map_params ----------------------------------------------------------------------------

PARAMS = {"enc": {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}, "s": jnp.ones(()), "frozen": None}
GRADS = {"enc": {"w": _r(2, 3), "b": _r(3)}, "s": _r(), "frozen": None}


def test_tree_map_params_scales_the_moments_like_optax():
    tx, o_tx = gradtx.adam(0.1), optax.adam(0.1)
    _, state = tx.update(GRADS, tx.init(PARAMS), PARAMS)
    with jax.numpy_dtype_promotion("standard"):
        _, o_state = o_tx.update(GRADS, o_tx.init(PARAMS), PARAMS)
    doubled = gradtx.tree_map_params(tx, lambda x: 2 * x, state, params=PARAMS)
    o_doubled = optax.tree_map_params(o_tx, lambda x: 2 * x, o_state)
    # (optax rounds `(1 - b2) * g**2` differently in float32: the moments agree to 1e-5)
    for slot, o_tree in (("mu", o_doubled[0].mu), ("nu", o_doubled[0].nu)):
        for path, x in flat(o_tree).items():
            np.testing.assert_allclose(np.asarray(doubled[slot][path]), x, rtol=1e-4)
            np.testing.assert_allclose(
                np.asarray(doubled[slot][path]), 2 * np.asarray(state[slot][path])
            )
    assert int(doubled["count"]["s"]) == 1  # a step count, even of the scalar `s`: not a param


def test_tree_map_params_with_rest_trees_and_non_params():
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.masked(gradtx.adam(0.1), "enc/**"))
    state = tx.init(PARAMS)
    names = {"enc": {"w": ("data", None), "b": ("data",)}, "s": (), "frozen": None}
    specs = gradtx.tree_map_params(
        tx,
        lambda value, spec: spec,
        state,
        names,
        transform_non_params=lambda _: "scalar",
        is_leaf=lambda x: isinstance(x, tuple),
    )
    assert specs["masked"]["mu"]["enc/w"] == ("data", None)
    assert specs["masked"]["nu"]["enc/b"] == ("data",)
    assert specs["clip_by_global_norm"] == {"global_norm": "scalar", "clipped": "scalar"}
    assert set(specs["masked"]["count"].scalars) == {"scalar"}  # the step counts


def test_tree_map_params_reads_optax_states_inside_gradtx():
    tx = gradtx.chain(gradtx.clip(1.0), optax.adam(0.1))
    state = tx.init(PARAMS)
    zeros = jax.tree.map(jnp.zeros_like, PARAMS)
    ones = gradtx.tree_map_params(tx, lambda x, z: x + 1 + z, state, zeros)
    flat_ones = gradtx.state_dict(ones)
    np.testing.assert_array_equal(flat_ones["chain/scale_by_adam/mu/enc/w"], np.ones((2, 3)))
    assert int(flat_ones["chain/scale_by_adam/count"]) == 0


def test_tree_map_params_errors():
    tx = gradtx.adam(0.1)
    state = tx.init(PARAMS)
    with pytest.raises(TypeError, match="give `params=`"):
        gradtx.tree_map_params(tx, lambda x: x, state)
    with pytest.raises(ValueError, match="not made by `tx.init"):
        gradtx.tree_map_params(gradtx.sgd(0.1, momentum=0.9), lambda x: x, state, params=PARAMS)
    with pytest.raises(KeyError, match=r"`rest\[1\]` has no leaf at the parameter path 'enc/b'"):
        gradtx.tree_map_params(tx, lambda x, a, b: x, state, PARAMS, {"enc": {"w": 1}, "s": 1})
    packed = gradtx.pack({"w": jnp.ones(3)})
    with pytest.raises(TypeError, match="keeps packed buffers"):
        gradtx.tree_map_params(tx, lambda x, r: x, tx.init(packed), {"w": 0})
    with pytest.raises(TypeError, match="holds packed params"):
        gradtx.tree_map_params(tx, lambda x: x, tx.init(packed), params=packed)
