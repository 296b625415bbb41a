"""The adaptive-moment family beyond the contract: variants and invariants (step budgets are in
test_convergence.py)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
import references.adam_family as ra

import gradtx
from gradtx._transforms.adam_variants import radam_rho

# --- rmsprop variants ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "keys"),
    [
        ({}, ["nu/w"]),
        ({"centered": True}, ["mu/w", "nu/w"]),
        ({"momentum": 0.9}, ["nu/w", "trace/w"]),
        (
            {"bias_correction": True, "momentum": 0.5, "nesterov": True},
            ["count/w", "nu/w", "trace/w"],
        ),
        ({"centered": True, "bias_correction": True}, ["count/w", "mu/w", "nu/w"]),
    ],
)
def test_rmsprop_state_keys(kwargs, keys):
    tx = gradtx.rmsprop(0.1, **kwargs)
    assert sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)}))) == keys


def test_rmsprop_first_steps_closed_form():
    """Plain, centered and momentum variants on two steps of known gradients."""
    lr, d, eps = 0.1, 0.9, 1e-8
    g1, g2 = 2.0, -1.0
    params = {"w": jnp.zeros(1)}
    grads = [{"w": jnp.array([g1])}, {"w": jnp.array([g2])}]

    def run(tx):
        state, out = tx.init(params), []
        for g in grads:
            u, state = tx.update(g, state)
            out.append(float(u["w"][0]))
        return out

    nu1 = (1 - d) * g1**2
    nu2 = d * nu1 + (1 - d) * g2**2
    mu1 = (1 - d) * g1
    mu2 = d * mu1 + (1 - d) * g2
    plain = [-lr * g1 / math.sqrt(nu1 + eps), -lr * g2 / math.sqrt(nu2 + eps)]
    centered = [
        -lr * g1 / math.sqrt(nu1 - mu1**2 + eps),
        -lr * g2 / math.sqrt(nu2 - mu2**2 + eps),
    ]
    np.testing.assert_allclose(run(gradtx.rmsprop(lr)), plain, rtol=1e-6)
    np.testing.assert_allclose(run(gradtx.rmsprop(lr, centered=True)), centered, rtol=1e-6)
    # The second momentum step is a difference of two terms of about 0.15 that cancel to
    # about 0.01: float32 rounding of the terms (which depends on whether the processor
    # fuses multiply-adds) shows up tenfold in its relative error, hence the atol.
    momentum = [plain[0], plain[1] + 0.5 * plain[0]]
    got = run(gradtx.rmsprop(lr, momentum=0.5))
    np.testing.assert_allclose(got, momentum, rtol=1e-6, atol=1e-7)
    nesterov = [plain[0] * 1.5, plain[1] + 0.5 * momentum[1]]
    got = run(gradtx.rmsprop(lr, momentum=0.5, nesterov=True))
    np.testing.assert_allclose(got, nesterov, rtol=1e-6, atol=1e-7)


def test_rmsprop_misuse():
    with pytest.raises(ValueError, match="nesterov=True needs a `momentum`"):
        gradtx.rmsprop(0.1, nesterov=True)
    with pytest.raises(ValueError, match="only with centered=True"):
        gradtx.rmsprop(0.1, mu_dtype=jnp.float32)


def test_scale_by_rms_matches_adam_without_first_moment():
    """As documented: scale_by_rms(b2, eps outside, bias-corrected) is Adam with b1=0."""
    rng = np.random.default_rng(0)
    rms = gradtx.scale_by_rms(0.99, 1e-8, eps_in_sqrt=False, bias_correction=True)
    adam = gradtx.scale_by_adam(b1=0.0, b2=0.99)
    params = {"w": jnp.zeros(5)}
    s1, s2 = rms.init(params), adam.init(params)
    for _ in range(4):
        g = {"w": jnp.asarray(rng.normal(size=5), jnp.float32)}
        u1, s1 = rms.update(g, s1)
        u2, s2 = adam.update(g, s2)
        np.testing.assert_allclose(np.asarray(u1["w"]), np.asarray(u2["w"]), rtol=1e-6)


# --- amsgrad ------------------------------------------------------------------------------------


def test_amsgrad_nu_max_is_monotonic_and_bounds_the_step():
    tx = gradtx.scale_by_amsgrad(b2=0.9)
    adam = gradtx.scale_by_adam(b2=0.9)
    params = {"w": jnp.zeros(3)}
    state, adam_state = tx.init(params), adam.init(params)
    grads = [10.0, 0.1, 0.1, 0.1, 0.1, 0.1, 5.0, 0.1, 0.1]
    previous = np.zeros(3)
    for k, g in enumerate(grads, start=1):
        gw = {"w": jnp.full(3, g, jnp.float32)}
        u, state = tx.update(gw, state)
        ua, adam_state = adam.update(gw, adam_state)
        nu_max = np.asarray(state["nu_max"]["w"], np.float64)
        nu_hat = np.asarray(state["nu"]["w"], np.float64) / (1 - np.float32(0.9) ** k)
        assert np.all(nu_max >= previous), k
        assert np.all(nu_max >= nu_hat * (1 - 1e-6)), k
        # the max never lets the step exceed Adam's (same first moment, larger denominator)
        assert np.all(np.abs(np.asarray(u["w"])) <= np.abs(np.asarray(ua["w"])) * (1 + 1e-6)), k
        previous = nu_max
    assert np.all(previous > 50)  # the spike of 10 is still remembered


# --- radam --------------------------------------------------------------------------------------


def test_radam_switches_to_the_adaptive_step_at_the_threshold():
    """With b2 = 0.999, rho_5 = 4.996 and rho_6 = 5.994: steps 1-5 are bias-corrected
    momentum (exactly), step 6 on is Adam's step times r_t."""
    b1, b2 = 0.9, 0.999
    assert radam_rho(jnp.float32(b2), jnp.float32(5)) < 5 <= radam_rho(jnp.float32(b2), 6.0)
    tx = gradtx.scale_by_radam(b1, b2)
    rng = np.random.default_rng(3)
    state = tx.init({"w": jnp.zeros(4)})
    m = np.zeros(4)
    v = np.zeros(4)
    b1f, b2f = float(np.float32(b1)), float(np.float32(b2))
    for t in range(1, 9):
        g = rng.normal(size=4)
        u, state = tx.update({"w": jnp.asarray(g, jnp.float32)}, state)
        g = np.asarray(jnp.asarray(g, jnp.float32), np.float64)
        m = b1f * m + (1 - b1f) * g
        v = b2f * v + (1 - b2f) * g * g
        m_hat = m / (1 - b1f**t)
        if t <= 5:
            want = m_hat
        else:
            rho, rho_inf = ra.radam_rho(b2, t), 2 / (1 - b2f) - 1
            r = math.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
            want = r * m_hat / (np.sqrt(v / (1 - b2f**t)) + 1e-8)
            assert np.all(np.abs(want) < np.abs(m_hat) / np.sqrt(v / (1 - b2f**t)))
        np.testing.assert_allclose(np.asarray(u["w"], np.float64), want, rtol=2e-5, err_msg=t)


@pytest.mark.parametrize("b2", [0.9, 0.99, 0.999, 0.9999])
def test_radam_rho_is_accurate_in_float32(b2):
    """rho_t within 1e-6 relative of the float64 value for t = 1..20000, while the formula as
    written in float32 loses digits to cancellation for b2 near 1."""
    ts = np.arange(1, 20001)
    got = np.asarray(radam_rho(jnp.float32(b2), jnp.asarray(ts, jnp.float32)), np.float64)
    want = np.array([ra.radam_rho(b2, int(t)) for t in ts])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    b = np.float32(b2)
    naive = (np.float32(2) / (1 - b) - 1) - 2 * ts.astype(np.float32) * b ** ts.astype(
        np.float32
    ) / (1 - b ** ts.astype(np.float32))
    if b2 >= 0.999:
        assert np.max(np.abs(naive - want) / np.abs(want)) > 1e-5


def test_radam_counts_steps_per_path():
    """A path that starts receiving gradients late starts its own warm-up."""
    tx = gradtx.scale_by_radam()
    params = {"a": jnp.zeros(2), "b": jnp.zeros(2)}
    state = tx.init(params)
    for _ in range(7):
        _, state = tx.update({"a": jnp.ones(2), "b": None}, state)
    u, state = tx.update({"a": jnp.ones(2), "b": jnp.full(2, 3.0)}, state)
    np.testing.assert_allclose(np.asarray(u["b"]), [3.0, 3.0], rtol=1e-6)  # momentum, t = 1
    assert int(state["count"]["a"]) == 8 and int(state["count"]["b"]) == 1


# --- adan, yogi, adagrad, adadelta --------------------------------------------------------------


def test_adan_first_step_of_a_late_path_has_no_gradient_difference():
    tx = gradtx.scale_by_adan()
    params = {"a": jnp.zeros(2), "b": jnp.zeros(2)}
    state = tx.init(params)
    _, state = tx.update({"a": jnp.ones(2), "b": None}, state)
    _, state = tx.update({"a": -jnp.ones(2), "b": None}, state)
    g = {"a": jnp.ones(2), "b": jnp.array([2.0, -4.0])}
    u, state = tx.update(g, state)
    fresh, _ = tx.update({"b": g["b"]}, tx.init({"b": params["b"]}))
    np.testing.assert_array_equal(np.asarray(u["b"]), np.asarray(fresh["b"]))
    np.testing.assert_array_equal(np.asarray(state["delta"]["b"]), [0.0, 0.0])
    assert not np.array_equal(np.asarray(state["delta"]["a"]), [0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(state["prev_grad"]["b"]), [2.0, -4.0])


def test_yogi_second_moment_moves_additively():
    """nu_1 = v0 + (1 - b2) g^2 when v0 < g^2; it then falls by (1 - b2) g^2 when g^2 < nu."""
    tx = gradtx.scale_by_yogi(b2=0.9, initial_accumulator_value=1e-6)
    state = tx.init({"w": jnp.zeros(1)})
    _, state = tx.update({"w": jnp.array([10.0])}, state)
    np.testing.assert_allclose(float(state["nu"]["w"][0]), 1e-6 + 0.1 * 100, rtol=1e-6)
    _, state = tx.update({"w": jnp.array([1.0])}, state)
    np.testing.assert_allclose(float(state["nu"]["w"][0]), 1e-6 + 10 - 0.1, rtol=1e-6)


def test_rss_zero_gradient_from_zero_start_is_zero_not_nan():
    tx = gradtx.scale_by_rss(initial_accumulator_value=0.0, eps=0.0)
    u, _ = tx.update({"w": jnp.zeros(2)}, tx.init({"w": jnp.zeros(2)}))
    np.testing.assert_array_equal(np.asarray(u["w"]), [0.0, 0.0])


def test_weight_decay_step_is_left_out_only_for_a_literal_zero():
    params = {"w": jnp.ones(2)}
    grads = {"w": jnp.ones(2)}
    for make in (gradtx.adadelta, gradtx.adan):
        tx = make(0.1)
        tx.update(grads, tx.init(params))  # no params needed
        decayed = make(0.1, weight_decay=0.5)
        with pytest.raises(ValueError, match="needs the params"):
            decayed.update(grads, decayed.init(params))
        masked = make(0.1, weight_decay=0.0, mask="w")
        assert len(masked.transforms) == len(tx.transforms) + 1


def test_adadelta_decay_is_added_before_the_rescaling():
    params = {"w": jnp.array([2.0, -1.0])}
    g = {"w": jnp.array([0.5, 0.25])}
    u, _ = gradtx.adadelta(1.0, weight_decay=0.1).update(
        g, gradtx.adadelta(1.0, weight_decay=0.1).init(params), params
    )
    coupled = {"w": g["w"] + 0.1 * params["w"]}
    want, _ = gradtx.adadelta(1.0).update(coupled, gradtx.adadelta(1.0).init(params))
    np.testing.assert_allclose(np.asarray(u["w"]), np.asarray(want["w"]), rtol=1e-6)
