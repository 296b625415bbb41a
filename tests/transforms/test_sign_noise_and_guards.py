"""Specifics of the sign-based and miscellaneous transformations (the rest is the contract)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx

# --- scale_by_polyak: the `value` argument ------------------------------------------------------


def test_polyak_step_from_value():
    tx = gradtx.scale_by_polyak(f_min=1.0, max_learning_rate=10.0)
    grads = {"a": jnp.array([3.0]), "b": {"c": jnp.array([4.0]), "n": None}}
    u, state = tx.update(grads, tx.init(grads), value=6.0)
    # (6 - 1) / (9 + 16) = 0.2
    np.testing.assert_allclose(u["a"], [0.6], rtol=1e-6)
    np.testing.assert_allclose(u["b"]["c"], [0.8], rtol=1e-6)
    assert u["b"]["n"] is None and state == {}


def test_polyak_step_is_capped_and_zero_for_zero_gradient():
    tx = gradtx.scale_by_polyak(max_learning_rate=0.5)
    u, _ = tx.update({"w": jnp.array([1.0])}, {}, value=100.0)
    np.testing.assert_allclose(u["w"], [0.5])
    u, _ = tx.update({"w": jnp.zeros(2)}, {}, value=1.0)
    np.testing.assert_array_equal(u["w"], [0.0, 0.0])


def test_polyak_sps_plus_clips_a_negative_gap():
    grads = {"w": jnp.array([1.0, -1.0])}
    sps = gradtx.scale_by_polyak(f_min=2.0).update(grads, {}, value=1.5)[0]["w"]
    plus = gradtx.scale_by_polyak(f_min=2.0, variant="sps+").update(grads, {}, value=1.5)[0]
    np.testing.assert_allclose(sps, [-0.25, 0.25])
    np.testing.assert_array_equal(plus["w"], [0.0, 0.0])
    with pytest.raises(ValueError, match="variant"):
        gradtx.scale_by_polyak(variant="sps-")


@pytest.mark.parametrize("make", [gradtx.scale_by_polyak, gradtx.polyak_sgd])
def test_polyak_without_value_names_the_argument(make):
    tx = make()
    params = {"w": jnp.ones(2)}
    with pytest.raises(TypeError, match=r"`value` argument.*value=loss"):
        tx.update(params, tx.init(params), params)


def test_polyak_value_is_traced_under_jit():
    tx = gradtx.polyak_sgd()
    traces = []

    @jax.jit
    def step(params, state, loss):
        traces.append(1)
        return tx.update({"w": jnp.array([2.0])}, state, params, value=loss)[0]

    params = {"w": jnp.array([1.0])}
    state = tx.init(params)
    np.testing.assert_allclose(step(params, state, 1.0)["w"], [-0.5])
    np.testing.assert_allclose(step(params, state, 2.0)["w"], [-1.0])
    assert len(traces) == 1


# --- add_noise ----------------------------------------------------------------------------------

PARAMS = {"a": jnp.zeros((64, 64)), "b": jnp.zeros(7)}


def _noise_steps(tx, n, params=PARAMS):
    state = tx.init(params)
    out = []
    for _ in range(n):
        u, state = tx.update(params, state)
        out.append(u)
    return out, state


def test_add_noise_is_reproducible_from_the_seed_and_new_at_each_step():
    first, _ = _noise_steps(gradtx.add_noise(0.01, 0.55, seed=1), 2)
    again, _ = _noise_steps(gradtx.add_noise(0.01, 0.55, seed=1), 2)
    other, _ = _noise_steps(gradtx.add_noise(0.01, 0.55, seed=2), 1)
    typed, _ = _noise_steps(gradtx.add_noise(0.01, 0.55, seed=jax.random.key(1)), 1)
    raw, _ = _noise_steps(gradtx.add_noise(0.01, 0.55, seed=jax.random.PRNGKey(1)), 1)
    for x, y in zip(jax.tree.leaves(first), jax.tree.leaves(again)):
        np.testing.assert_array_equal(x, y)
    for u in (typed[0], raw[0]):
        np.testing.assert_array_equal(u["a"], first[0]["a"])
    assert not np.any(np.asarray(first[0]["a"]) == np.asarray(first[1]["a"]))
    assert not np.any(np.asarray(first[0]["a"]) == np.asarray(other[0]["a"]))
    assert not np.any(np.asarray(first[0]["a"][0, :7]) == np.asarray(first[0]["b"]))


def test_add_noise_variance_decays():
    eta, gamma = 0.04, 0.55
    history, state = _noise_steps(gradtx.add_noise(eta, gamma, seed=0), 3)
    for t, u in enumerate(history, start=1):
        std = float(np.std(np.asarray(u["a"])))
        expected = np.sqrt(eta / t**gamma)
        assert abs(std / expected - 1) < 0.05, (t, std, expected)
        assert abs(float(np.mean(np.asarray(u["a"])))) < 4 * expected / 64
    assert int(state["count"]["a"]) == 3


def test_add_noise_streams_are_per_path():
    tx = gradtx.add_noise(0.01, 0.55, seed=0)
    state = tx.init(PARAMS)
    both, _ = tx.update(PARAMS, state)
    alone, new_state = tx.update({"a": None, "b": PARAMS["b"]}, state)
    np.testing.assert_array_equal(alone["b"], both["b"])
    np.testing.assert_array_equal(new_state["rng_key"]["a"], state["rng_key"]["a"])
    assert int(new_state["count"]["a"]) == 0


def test_add_noise_rejects_a_bad_seed():
    with pytest.raises(TypeError, match="seed"):
        gradtx.add_noise(0.01, 0.55, seed=jnp.array([1.5, 2.0]))


# --- zero_nans and keep_params_nonnegative ------------------------------------------------------


def test_zero_nans_replaces_nans_keeps_infs_and_flags_per_path():
    tx = gradtx.zero_nans()
    grads = {"a": jnp.array([jnp.nan, 1.0, jnp.inf]), "b": jnp.array([2.0], jnp.bfloat16)}
    state = tx.init(grads)
    assert not bool(state["found_nan"]["a"])
    u, state = tx.update(grads, state)
    np.testing.assert_array_equal(u["a"], [0.0, 1.0, np.inf])
    assert u["b"].dtype == jnp.bfloat16
    assert bool(state["found_nan"]["a"]) and not bool(state["found_nan"]["b"])
    # a path without an update keeps its flag; a clean update clears it
    _, kept = tx.update({"a": None, "b": grads["b"]}, state)
    assert bool(kept["found_nan"]["a"])
    _, cleared = tx.update({"a": jnp.ones(3), "b": grads["b"]}, state)
    assert not bool(cleared["found_nan"]["a"])


def test_keep_params_nonnegative_stops_at_zero():
    tx = gradtx.chain(gradtx.sgd(1.0), gradtx.keep_params_nonnegative())
    params = {"w": jnp.array([1.0, 0.5, 0.0, 2.0])}
    grads = {"w": jnp.array([0.5, 2.0, 1.0, -1.0])}
    u, _ = tx.update(grads, tx.init(params), params)
    new = gradtx.apply_updates(params, u)
    np.testing.assert_array_equal(new["w"], [0.5, 0.0, 0.0, 3.0])
    with pytest.raises(ValueError, match="needs the params"):
        gradtx.keep_params_nonnegative().update(grads, {})


# --- scale_by_rprop: the update is the current step's (optax 0.2.8 lags one step) ---------------


def test_rprop_steps_follow_the_sign_history():
    tx = gradtx.scale_by_rprop(0.1, eta_minus=0.5, eta_plus=1.2)
    state = tx.init({"w": jnp.zeros(1)})
    got = []
    for g in [1.0, 1.0, 1.0, -1.0, 1.0, 1.0]:
        u, state = tx.update({"w": jnp.array([g])}, state)
        got.append(float(u["w"][0]))
    # a sign change skips the step and halves the size; the next step does not halve again
    np.testing.assert_allclose(got, [0.1, 0.12, 0.144, 0.0, 0.072, 0.0864], rtol=1e-6)


# --- scale_by_novograd --------------------------------------------------------------------------


def test_novograd_needs_params_only_with_weight_decay():
    grads = {"w": jnp.ones(2)}
    tx = gradtx.scale_by_novograd()
    tx.update(grads, tx.init(grads))
    decayed = gradtx.scale_by_novograd(weight_decay=0.1)
    with pytest.raises(ValueError, match="needs the params"):
        decayed.update(grads, decayed.init(grads))
    assert gradtx.scale_by_novograd().per_leaf_structure
    assert gradtx.centralize().per_leaf_structure


# --- lion: one read of the momentum, so a donated step matches -----------------------------------


def test_lion_donated_step_matches_undonated():
    tx = gradtx.lion(0.01, weight_decay=0.1, mu_dtype=jnp.bfloat16)

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state

    plain = jax.jit(step)
    donated = jax.jit(step, donate_argnums=(0, 1))
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(8, 16)), jnp.float32)}
    p1, s1 = params, tx.init(params)
    p2, s2 = jax.tree.map(jnp.copy, params), tx.init(params)
    for _ in range(3):
        grads = {"w": jnp.asarray(rng.normal(size=(8, 16)), jnp.float32)}
        p1, s1 = plain(p1, s1, grads)
        old = jax.tree.leaves((p2, s2))
        p2, s2 = donated(p2, s2, grads)
        assert all(x.is_deleted() for x in old)
    np.testing.assert_array_equal(p1["w"], p2["w"])
    assert s1["mu"]["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(s1["mu"]["w"], np.float32), np.asarray(s2["mu"]["w"], np.float32)
    )


# --- nesterov ----------------------------------------------------------------------------------


def test_nesterov_is_sgd_with_nesterov_momentum():
    params = {"w": jnp.ones(3)}
    grads = [{"w": jnp.array([1.0, -2.0, 0.5]) * k} for k in (1.0, 0.5, -1.0)]
    a, b = gradtx.nesterov(0.1, 0.8), gradtx.sgd(0.1, momentum=0.8, nesterov=True)
    sa, sb = a.init(params), b.init(params)
    assert gradtx.state_dict(sa).keys() == gradtx.state_dict(sb).keys()
    for g in grads:
        (ua, sa), (ub, sb) = a.update(g, sa), b.update(g, sb)
        np.testing.assert_array_equal(ua["w"], ub["w"])


# --- scale_gradient ----------------------------------------------------------------------------


def test_scale_gradient_scales_only_the_backward_pass():
    x = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([3.0], jnp.bfloat16), "i": jnp.array([4])}
    assert gradtx.scale_gradient(x, 0.5)["i"] is x["i"]
    for key in ("a", "b"):
        np.testing.assert_array_equal(gradtx.scale_gradient(x, 0.5)[key], x[key])

    def loss(x, s):
        y = gradtx.scale_gradient(x, s)
        return jnp.sum(y["a"] ** 2) + jnp.sum(y["b"].astype(jnp.float32) ** 2)

    grad = jax.jit(jax.grad(loss, allow_int=True))(x, 0.25)
    np.testing.assert_allclose(grad["a"], [0.5, 1.0])
    assert grad["b"].dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(grad["b"], np.float32), [1.5])
    zero = jax.grad(loss, allow_int=True)(x, 0.0)
    np.testing.assert_array_equal(zero["a"], [0.0, 0.0])


# --- convergence within a step budget -----------------------------------------------------------


def parabola(x):
    """A badly scaled quadratic, minimum 0 at (1, -2, 0.5)."""
    c = jnp.array([1.0, -2.0, 0.5])
    a = jnp.array([1.0, 4.0, 0.25])
    return jnp.sum(a * (x["x"] - c) ** 2)


def rosenbrock(x):
    """Rosenbrock's valley, minimum 0 at (1, 1)."""
    u, v = x["x"][0], x["x"][1]
    return (1 - u) ** 2 + 100 * (v - u * u) ** 2


P0, R0 = (0.0, 0.0, 0.0), (-1.2, 1.0)
CONVERGENCE = [
    # (id, optimizer, problem, start, steps, final loss below); the budgets have about 2x margin
    ("lion", gradtx.lion(0.01, weight_decay=0.0), parabola, P0, 800, 1e-6),
    ("sign_sgd", gradtx.sign_sgd(0.01), parabola, P0, 300, 1e-6),
    ("signum", gradtx.signum(0.01), parabola, P0, 300, 5e-3),  # sign steps oscillate
    ("rprop", gradtx.rprop(0.01), rosenbrock, R0, 3200, 1e-5),
    ("noisy_sgd", gradtx.noisy_sgd(0.1, eta=1e-4, seed=0), parabola, P0, 200, 1e-5),
    ("polyak_sgd", gradtx.polyak_sgd(), parabola, P0, 50, 1e-6),
    ("polyak_sgd-rosenbrock", gradtx.polyak_sgd(), rosenbrock, R0, 800, 1e-4),
    ("optimistic", gradtx.optimistic_gradient_descent(0.05), parabola, P0, 200, 1e-5),
    ("novograd", gradtx.novograd(0.02), parabola, P0, 100, 2e-3),  # normalised steps: a floor
    ("fromage", gradtx.fromage(0.01), parabola, (0.5, 0.5, 0.5), 800, 1e-5),
    ("nesterov", gradtx.nesterov(1e-3, 0.9), rosenbrock, R0, 1600, 1e-5),
]


@functools.partial(jax.jit, static_argnums=(1, 3))
def _minimise(tx, problem, start, steps):
    params = {"x": jnp.asarray(start, jnp.float32)}

    def body(carry, _):
        params, state = carry
        loss, grads = jax.value_and_grad(problem)(params)
        updates, state = tx.update(grads, state, params, value=loss)
        return (gradtx.apply_updates(params, updates), state), None

    (params, _), _ = jax.lax.scan(body, (params, tx.init(params)), None, length=steps)
    return problem(params)


@pytest.mark.parametrize(
    "tx, problem, start, steps, tol", [pytest.param(*c[1:], id=c[0]) for c in CONVERGENCE]
)
def test_converges_within_budget(tx, problem, start, steps, tol):
    initial = float(problem({"x": jnp.asarray(start, jnp.float32)}))
    final = float(_minimise(tx, problem, start, steps))
    assert final < tol < initial, (initial, final)
