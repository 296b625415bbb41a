"""Updates are computed from the state exactly as it is stored (low-precision slots too)."""

import jax.numpy as jnp
import numpy as np

import gradtx


def test_adam_update_uses_the_rounded_moments_it_keeps():
    params = {"w": jnp.linspace(-1.0, 1.0, 7, dtype=jnp.float32)}
    grads = {"w": jnp.linspace(0.3, -0.7, 7, dtype=jnp.float32)}
    tx = gradtx.scale_by_adam(mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16)
    updates, state = tx.update(grads, tx.init(params), params)
    mu = np.asarray(state["mu"]["w"], np.float32)
    nu = np.asarray(state["nu"]["w"], np.float32)
    b1, b2, eps = np.float32(0.9), np.float32(0.999), np.float32(1e-8)
    expected = (mu / (1 - b1)) / (np.sqrt(nu / (1 - b2)) + eps)
    np.testing.assert_allclose(updates["w"], expected, rtol=2e-6)
    # ...which differs from the update computed from unrounded moments
    g = np.asarray(grads["w"])
    unrounded = ((1 - b1) * g / (1 - b1)) / (np.sqrt((1 - b2) * g * g / (1 - b2)) + eps)
    assert np.max(np.abs(np.asarray(updates["w"]) - unrounded)) > 1e-4


def test_trace_update_is_the_stored_trace():
    params = {"w": jnp.linspace(-1.0, 1.0, 5)}
    tx = gradtx.trace(0.9, accumulator_dtype=jnp.bfloat16)
    state = tx.init(params)
    for k in range(3):
        updates, state = tx.update({"w": jnp.full(5, 0.123 + k)}, state, params)
    np.testing.assert_array_equal(
        np.asarray(updates["w"]), np.asarray(state["trace"]["w"].astype(jnp.float32))
    )


def test_global_norm_of_low_precision_leaves_accumulates_in_float32():
    rng = np.random.default_rng(0)
    tree = {
        "bf16": jnp.asarray(rng.normal(size=(64, 33)), jnp.bfloat16),
        "f16": jnp.asarray(rng.normal(size=(100,)), jnp.float16),
        "f32": jnp.asarray(rng.normal(size=(7,)), jnp.float32),
        "empty": jnp.zeros((0,), jnp.bfloat16),
    }
    expected = np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in tree.values()))
    norm = gradtx.global_norm(tree)
    assert norm.dtype == jnp.float32
    np.testing.assert_allclose(float(norm), expected, rtol=1e-6)
