"""Bugs and limits that optax's own test suite found when run against gradtx, fixed."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx import schedules


def test_bfloat16_scalar_hyperparameters_are_injected_hyperparameters():
    tx = gradtx.inject_hyperparams(gradtx.adam)(
        learning_rate=0.1, b2=jnp.asarray(0.99, jnp.bfloat16)
    )
    state = tx.init({"w": jnp.ones(2)})
    assert "b2" in gradtx.hyperparams(state)
    state = gradtx.set_hyperparams(state, {"b2": 0.9})
    np.testing.assert_allclose(float(gradtx.hyperparams(state)["b2"]), 0.9, rtol=1e-6)


@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey], ids=["typed", "raw"])
def test_prng_keys_pass_through_inject_hyperparams_as_data(make_key):
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.full(3, 0.5)}
    injected = gradtx.inject_hyperparams(gradtx.noisy_sgd)(learning_rate=0.1, seed=make_key(7))
    plain = gradtx.noisy_sgd(0.1, seed=make_key(7))
    state, plain_state = injected.init(params), plain.init(params)
    assert "seed" not in gradtx.hyperparams(state)
    step = jax.jit(lambda g, s: injected.update(g, s, params))
    for _ in range(2):
        u, state = step(grads, state)
        v, plain_state = plain.update(grads, plain_state, params)
        np.testing.assert_array_equal(u["w"], v["w"])


def test_python_scalar_params():
    tx = gradtx.adam(0.1)
    params = {"a": 1.0, "b": np.float32(2.0)}
    updates, _ = tx.update({"a": 0.5, "b": np.float32(0.5)}, tx.init(params), params)
    np.testing.assert_allclose(updates["a"], -0.1, rtol=1e-5)
    with pytest.raises(TypeError, match="parameter at 'b' has dtype int32"):
        tx.init({"a": 1.0, "b": 2})


def test_schedule_lengths_beyond_int32():
    value = schedules.cosine_decay(1000.0, decay_steps=1e10)(jnp.int32(10**9))
    exact = 1000.0 * 0.5 * (1 + math.cos(math.pi * 1e9 / 1e10))
    np.testing.assert_allclose(float(value), exact, rtol=1e-6)  # 975.5282581...
    linear = schedules.linear(1.0, 0.0, 3e10)(jnp.int32(3 * 10**9 // 10))
    np.testing.assert_allclose(float(linear), 0.99, rtol=1e-6)
    assert float(schedules.cosine_decay(1.0, 10)(5)) == pytest.approx(0.5, rel=1e-6)


def test_an_empty_mask_suggests_something_masked_accepts():
    with pytest.raises(Exception, match="leave the transformation out") as info:
        gradtx.masked(gradtx.adam(0.1), lambda path, leaf: False).init({"w": jnp.ones(2)})
    assert "strict=False" not in str(info.value)


def test_integer_per_example_gradients_name_the_path():
    tx = gradtx.per_example_global_norm_clip(1.0)
    with pytest.raises(TypeError, match="gradient at 'w' has dtype int32"):
        tx.update({"w": jnp.ones((4, 2), jnp.int32)}, tx.init({"w": jnp.ones(2)}))


def test_lion_without_momentum_decay_is_the_sign_of_the_interpolation():
    b1 = 0.9
    tx = gradtx.scale_by_lion(b1=b1, b2=0.0)
    params = {"w": jnp.zeros(3)}
    state = tx.init(params)
    g1, g2 = jnp.array([1.0, -2.0, 0.5]), jnp.array([-3.0, 1.0, 0.5])
    _, state = tx.update({"w": g1}, state)
    u, _ = tx.update({"w": g2}, state)
    np.testing.assert_array_equal(u["w"], np.sign(b1 * np.asarray(g1) + (1 - b1) * np.asarray(g2)))
