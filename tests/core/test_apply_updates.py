"""apply_updates: matched by path, dtypes kept, missing updates leave params untouched."""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx


def test_adds_by_path():
    params = {"a": jnp.asarray([1.0, 2.0]), "b": {"c": jnp.asarray(3.0)}}
    updates = {"a": jnp.asarray([0.5, -1.0]), "b": {"c": jnp.asarray(-3.0)}}
    out = gradtx.apply_updates(params, updates)
    np.testing.assert_array_equal(out["a"], [1.5, 1.0])
    np.testing.assert_array_equal(out["b"]["c"], 0.0)
    # nothing modified in place
    np.testing.assert_array_equal(params["a"], [1.0, 2.0])


def test_bf16_param_with_f32_update_keeps_bf16():
    params = {"w": jnp.ones(4, jnp.bfloat16), "b": jnp.zeros(2, jnp.float32)}
    updates = {"w": jnp.full(4, 0.5, jnp.float32), "b": jnp.full(2, 0.25, jnp.bfloat16)}
    out = gradtx.apply_updates(params, updates)
    assert out["w"].dtype == jnp.bfloat16
    assert out["b"].dtype == jnp.float32
    np.testing.assert_array_equal(out["w"].astype(jnp.float32), np.full(4, 1.5, np.float32))
    np.testing.assert_array_equal(out["b"], np.full(2, 0.25, np.float32))


def test_bf16_sum_is_computed_in_the_wider_dtype():
    # 256 + (1 + 2**-9) is 257.002 in float32, which rounds to 258 in bf16. Adding in bf16
    # would first round the update to 1.0, and 256 + 1 = 257 rounds (to even) to 256.
    params = {"w": jnp.asarray([256.0], jnp.bfloat16)}
    update = jnp.asarray([1.0 + 2.0**-9], jnp.float32)
    out = gradtx.apply_updates(params, {"w": update})
    expected = jnp.asarray(np.float32(256.0) + np.float32(1.0 + 2.0**-9)).astype(jnp.bfloat16)
    assert out["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(out["w"], expected)


def test_f32_param_with_bf16_update_keeps_f32():
    params = {"w": jnp.full(3, 0.1, jnp.float32)}
    out = gradtx.apply_updates(params, {"w": jnp.full(3, 2.0, jnp.bfloat16)})
    assert out["w"].dtype == jnp.float32
    np.testing.assert_allclose(out["w"], np.full(3, np.float32(0.1) + np.float32(2.0)))


def test_under_jit_keeps_dtypes():
    params = {"w": jnp.ones((2, 2), jnp.bfloat16), "b": jnp.ones(2, jnp.float16)}
    updates = {"w": jnp.full((2, 2), 0.5), "b": jnp.full(2, 0.5)}
    out = jax.jit(gradtx.apply_updates)(params, updates)
    assert out["w"].dtype == jnp.bfloat16
    assert out["b"].dtype == jnp.float16
    np.testing.assert_array_equal(out["b"], np.full(2, 1.5, np.float16))


def test_none_update_leaves_param_unchanged():
    w, b = jnp.ones(2), jnp.zeros(3, jnp.bfloat16)
    out = gradtx.apply_updates({"w": w, "b": b}, {"w": jnp.ones(2), "b": None})
    assert out["b"] is b
    np.testing.assert_array_equal(out["w"], [2.0, 2.0])


def test_missing_update_leaves_param_unchanged():
    w, b = jnp.ones(2), jnp.zeros(3, jnp.bfloat16)
    params = {"enc": {"w": w, "b": b}, "head": [w, b]}
    out = gradtx.apply_updates(params, {"head": {1: jnp.ones(3)}} | {"enc": {"w": jnp.ones(2)}})
    assert out["enc"]["b"] is b
    assert out["head"][0] is w
    np.testing.assert_array_equal(out["enc"]["w"], [2.0, 2.0])
    assert out["head"][1].dtype == jnp.bfloat16
    np.testing.assert_array_equal(out["head"][1].astype(jnp.float32), np.ones(3))


def test_empty_updates_return_params_as_they_are():
    params = {"a": jnp.ones(1), "b": [jnp.zeros(2)]}
    out = gradtx.apply_updates(params, {})
    assert out["a"] is params["a"] and out["b"][0] is params["b"][0]
    out = gradtx.apply_updates(params, None)
    assert out["a"] is params["a"]


def test_none_params_stay_none():
    params = {"a": jnp.ones(1), "frozen": None}
    out = gradtx.apply_updates(params, {"a": jnp.ones(1), "frozen": None})
    assert out["frozen"] is None


class Pair(NamedTuple):
    w: jax.Array
    b: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
    w: jax.Array
    b: jax.Array


@pytest.mark.parametrize(
    "make_params,make_updates",
    [
        (lambda w, b: Layer(w, b), lambda w, b: {"w": w, "b": b}),
        (lambda w, b: {"w": w, "b": b}, lambda w, b: Layer(w, b)),
        (lambda w, b: Pair(w, b), lambda w, b: Layer(w, b)),
        (lambda w, b: {"b": b, "w": w}, lambda w, b: Pair(w, b)),
    ],
    ids=["dataclass+dict", "dict+dataclass", "namedtuple+dataclass", "dict+namedtuple"],
)
def test_containers_may_differ_when_paths_agree(make_params, make_updates):
    params = make_params(jnp.ones((2, 2)), jnp.zeros(2))
    updates = make_updates(jnp.full((2, 2), 0.5), jnp.full(2, -1.0))
    out = gradtx.apply_updates(params, updates)
    assert type(out) is type(params)
    leaves = gradtx.paths.leaves(out)
    np.testing.assert_array_equal(leaves["w"], np.full((2, 2), 1.5))
    np.testing.assert_array_equal(leaves["b"], np.full(2, -1.0))


def test_list_params_with_dict_updates_by_index_path():
    params = {"layers": [jnp.ones(1), jnp.ones(1), jnp.ones(1)]}
    out = gradtx.apply_updates(params, {"layers": {2: jnp.ones(1)}})
    assert isinstance(out["layers"], list)
    assert out["layers"][0] is params["layers"][0]
    np.testing.assert_array_equal(out["layers"][2], [2.0])


def test_numpy_and_python_scalar_params():
    params = {"a": np.ones(2, np.float32), "s": jnp.float32(1.0)}
    out = gradtx.apply_updates(params, {"a": jnp.ones(2), "s": jnp.float32(0.5)})
    np.testing.assert_array_equal(out["a"], [2.0, 2.0])
    assert out["a"].dtype == np.float32
    assert float(out["s"]) == 1.5


def test_update_for_unknown_path():
    with pytest.raises(KeyError, match=r"update for path 'enc/bias' but no parameter there"):
        gradtx.apply_updates({"enc": {"w": jnp.ones(1)}}, {"enc": {"bias": jnp.ones(1)}})


def test_update_for_a_none_param():
    with pytest.raises(KeyError, match=r"update for path 'frozen'"):
        gradtx.apply_updates({"frozen": None}, {"frozen": jnp.ones(1)})


def test_shape_mismatch_names_the_path():
    with pytest.raises(ValueError, match=r"at path 'enc/w' the update has shape \(3,\) but the"):
        gradtx.apply_updates({"enc": {"w": jnp.ones(2)}}, {"enc": {"w": jnp.ones(3)}})
