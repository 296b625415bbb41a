"""Updates are computed from the state exactly as it is stored (low-precision slots too), and
their dtype does not depend on how the learning rate was given."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from convergence_table import TABLE

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
    np.testing.assert_allclose(float(jax.jit(gradtx.global_norm)(tree)), expected, rtol=1e-6)
    # Differentiable too (the low-precision path reduces behind an optimization barrier).
    grad = jax.grad(gradtx.global_norm)(tree)
    for key in ("bf16", "f16"):
        assert grad[key].dtype == tree[key].dtype
        want = np.asarray(tree[key], np.float64) / expected
        np.testing.assert_allclose(np.asarray(grad[key], np.float64), want, rtol=1e-2, atol=1e-4)


def test_global_norm_reduces_small_leaves_together_and_large_ones_alone():
    from gradtx._layouts.packed import LARGE_LEAF

    rng = np.random.default_rng(1)
    tree = {
        "small": [jnp.asarray(rng.normal(size=(3, 5)), jnp.float32) for _ in range(40)],
        "bf16": jnp.asarray(rng.normal(size=7), jnp.bfloat16),
        "large": jnp.asarray(rng.normal(size=LARGE_LEAF), jnp.float32),
        "packed": gradtx.pack({"a": jnp.ones(3), "b": jnp.full((2, 2), 2.0)}),
        "none": None,
        "empty": jnp.zeros((0, 3)),
    }
    leaves = [x for x in jax.tree.leaves(tree)]
    expected = np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in leaves))
    np.testing.assert_allclose(float(jax.jit(gradtx.global_norm)(tree)), expected, rtol=1e-6)
    # One reduction for everything small (the packed buffer included), one for the large leaf.
    jaxpr = jax.make_jaxpr(gradtx.global_norm)(tree)
    reductions = [e for e in jaxpr.eqns if e.primitive.name == "reduce_sum"]
    assert len(reductions) == 2


# Every core optimizer, built with its learning rate as a Python float, a NumPy float32 or
# float64 scalar, or a JAX array: one step on float32 and bfloat16 params.
CORE_OPTIMIZERS = sorted({row.optimizer for row in TABLE})
LR_KINDS = {
    "python float": 0.01,
    "numpy float32": np.float32(0.01),
    "numpy float64": np.float64(0.01),
    "jax array": jnp.asarray(0.01),
}


@pytest.mark.parametrize("name", CORE_OPTIMIZERS)
def test_update_dtype_does_not_depend_on_the_learning_rate_type(name):
    make = getattr(gradtx, name)
    for dtype in (jnp.float32, jnp.bfloat16):
        params = {
            "w": jnp.linspace(-1.0, 1.0, 6, dtype=dtype).reshape(2, 3),
            "b": jnp.ones(3, dtype),
        }
        grads = jax.tree.map(lambda p: (p * 0.5 + 0.25).astype(p.dtype), params)

        def loss(p):  # for the methods that read the loss (Polyak, L-BFGS's line search)
            return sum(jnp.sum(x.astype(jnp.float32) ** 2) for x in jax.tree.leaves(p))

        extra = {"value": loss(params), "grad": grads, "value_fn": loss}
        results = {}
        for kind, lr in LR_KINDS.items():
            tx = make(lr)
            updates, _ = tx.update(grads, tx.init(params), params, **extra)
            assert all(u.dtype == dtype for u in jax.tree.leaves(updates)), (kind, dtype)
            results[kind] = updates
        first = results["python float"]
        for kind, updates in results.items():
            for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(updates)):
                np.testing.assert_array_equal(
                    np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=kind
                )


# --- the update dtype: promoted from the gradient and the state read -------------------------


def _bf16_problem() -> tuple[dict, list[dict]]:
    rng = np.random.default_rng(3)
    params = {
        "w": jnp.asarray(rng.normal(size=(4, 5)), jnp.bfloat16),
        "s": jnp.asarray(0.5, jnp.bfloat16),
    }
    grads = [
        jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.bfloat16), params)
        for _ in range(5)
    ]
    return params, grads


def test_bf16_params_with_float32_state_round_once_like_optax():
    """bf16 params, float32 moments: the update stays float32 and `apply_updates` rounds once,
    so five steps give optax's params bit for bit (optax adds in float32 too)."""
    import optax

    params, grads = _bf16_problem()
    tx = gradtx.adam(1e-2, mu_dtype=jnp.float32, nu_dtype=jnp.float32)
    opt = optax.adam(np.float32(1e-2), mu_dtype=jnp.float32)
    ours, theirs = params, params
    state, opt_state = (
        tx.init(ours),
        opt.init(jax.tree.map(lambda p: p.astype(jnp.float32), theirs)),
    )
    for g in grads:
        updates, state = tx.update(g, state, ours)
        assert all(u.dtype == jnp.float32 for u in jax.tree.leaves(updates))
        ours = gradtx.apply_updates(ours, updates)
        with jax.numpy_dtype_promotion("standard"):
            g32 = jax.tree.map(lambda x: x.astype(jnp.float32), g)
            opt_updates, opt_state = opt.update(g32, opt_state)
            theirs = optax.apply_updates(theirs, opt_updates)
    for key in params:
        assert ours[key].dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(ours[key]), np.asarray(theirs[key]))


def test_standalone_and_chained_updates_follow_the_state_dtype():
    """The rule holds for a transformation alone and inside a chain; bf16 state keeps bf16."""
    params, grads = _bf16_problem()
    for dtype in (jnp.float32, jnp.bfloat16):
        for tx in (
            gradtx.scale_by_adam(mu_dtype=dtype, nu_dtype=dtype),
            gradtx.chain(
                gradtx.clip_by_global_norm(1.0), gradtx.trace(0.9, accumulator_dtype=dtype)
            ),
            gradtx.sgd(0.1, momentum=0.9, accumulator_dtype=dtype),
        ):
            updates, _ = tx.update(grads[0], tx.init(params), params)
            for key, u in updates.items():
                assert u.dtype == dtype, (tx, key)
    # Stateless steps keep the gradient's dtype.
    tx = gradtx.chain(gradtx.clip(1.0), gradtx.scale(0.5))
    updates, _ = tx.update(grads[0], tx.init(params), params)
    assert {u.dtype for u in jax.tree.leaves(updates)} == {jnp.dtype(jnp.bfloat16)}


def test_one_rounding_is_closer_to_the_float32_step_than_two():
    """The float32 update rounds once into the bf16 param; rounding the update to bf16 first
    (the old rule) is never closer to the exact float32 sum, and on a random step often worse."""
    params, grads = _bf16_problem()
    tx = gradtx.adam(1e-2, mu_dtype=jnp.float32, nu_dtype=jnp.float32)
    updates, _ = tx.update(grads[0], tx.init(params), params)
    exact = np.asarray(params["w"], np.float64) + np.asarray(updates["w"], np.float64)
    once = np.asarray(gradtx.apply_updates(params, updates)["w"], np.float64)
    twice = np.asarray(
        gradtx.apply_updates(params, {"w": updates["w"].astype(jnp.bfloat16)})["w"], np.float64
    )
    assert np.all(np.abs(once - exact) <= np.abs(twice - exact))
