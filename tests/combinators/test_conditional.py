"""`conditionally_transform` and `conditionally_mask`; the rest is the contract suite."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx
from gradtx import schedules
from gradtx._core.module import Module, hyperparam

GRADS = [{"w": jnp.array([1.0, -2.0]) * (t + 1), "n": None} for t in range(6)]


def odd_steps(step: Any) -> Any:
    return step % 2 == 1


@pytest.mark.parametrize("masked", [False, True], ids=["transform", "mask"])
def test_explicit_expectations(masked):
    """sgd(0.1) with momentum 0.5 at steps 1, 3, 5; steps 0, 2, 4 pass the gradient through
    (`conditionally_transform`) or give zeros (`conditionally_mask`), the trace unchanged."""
    make = gradtx.conditionally_mask if masked else gradtx.conditionally_transform
    tx = make(gradtx.sgd(0.1, momentum=0.5), odd_steps)
    state = tx.init({"w": jnp.zeros(2), "n": None})
    trace = np.zeros(2)
    for t, g in enumerate(GRADS):
        u, state = jax.jit(tx.update)(g, state)
        assert u["n"] is None
        if t % 2 == 1:
            trace = np.asarray(g["w"]) + 0.5 * trace
            want = -0.1 * trace
        else:
            want = np.zeros(2) if masked else np.asarray(g["w"])
        np.testing.assert_allclose(u["w"], want, rtol=1e-6)
        np.testing.assert_allclose(state["inner"]["trace"]["w"], trace, rtol=1e-6)
        assert int(state["step"]) == t + 1 and state["step"].dtype == jnp.int32


@pytest.mark.parametrize("masked", [False, True], ids=["transform", "mask"])
def test_matches_optax(masked):
    lr = schedules.cosine_decay(0.1, 5)
    fn = lambda step: step >= 2  # noqa: E731
    if masked:
        tx, oracle = gradtx.conditionally_mask, optax.conditionally_mask
    else:
        tx, oracle = gradtx.conditionally_transform, optax.conditionally_transform
    tx = tx(gradtx.adam(lr), fn)
    f32 = np.float32
    schedule = optax.cosine_decay_schedule(f32(0.1), 5)
    opt = optax.adam(schedule, b1=f32(0.9), b2=f32(0.999), eps=f32(1e-8))
    oracle = oracle(opt, fn)
    params = {"w": jnp.zeros(2)}
    state, o_state = tx.init(params), oracle.init(params)
    for g in GRADS:
        g = {"w": g["w"]}
        u, state = tx.update(g, state)
        with jax.numpy_dtype_promotion("standard"):
            o_u, o_state = oracle.update(g, o_state)
        np.testing.assert_allclose(u["w"], o_u["w"], rtol=1e-6)
        assert int(state["step"]) == int(o_state.step)
        assert int(state["inner"]["count"]["w"]) == int(o_state.inner_state[0].count)
        assert int(state["inner"]["schedule_count"]["w"]) == int(o_state.inner_state[-1].count)


def test_extra_arguments_reach_the_condition_only_when_forwarded():
    def small_loss(step: Any, *, loss: Any) -> Any:
        return loss < 1.0

    tx = gradtx.conditionally_mask(gradtx.sgd(1.0), small_loss, forward_extra_args=True)
    state = tx.init({"w": jnp.zeros(1)})
    g = {"w": jnp.ones(1)}
    u, state = tx.update(g, state, loss=2.0)
    np.testing.assert_array_equal(u["w"], [0.0])
    u, state = jax.jit(lambda g, s, loss: tx.update(g, s, loss=loss))(g, state, 0.5)
    np.testing.assert_array_equal(u["w"], [-1.0])
    # without forwarding, the condition is called with the step only (extras still reach tx)
    plain = gradtx.conditionally_mask(gradtx.sgd(1.0), odd_steps)
    u, _ = plain.update(g, plain.init({"w": jnp.zeros(1)}), loss=2.0)
    np.testing.assert_array_equal(u["w"], [0.0])


class FromStep(Module):
    """A condition whose threshold is a traced leaf: changing it does not recompile."""

    start: Any = hyperparam()

    def __call__(self, step: Any) -> Any:
        return step.astype(jnp.float32) >= self.start


def test_inner_runs_under_cond_and_a_module_condition_is_traced():
    traces = []

    @jax.jit
    def step(tx, grads, state):
        traces.append(1)
        return tx.update(grads, state)

    params = {"w": jnp.ones(2)}
    for start in (0.0, 5.0):
        tx = gradtx.conditionally_mask(gradtx.adam(0.1), FromStep(start))
        u, state = step(tx, params, tx.init(params))
        assert bool(jnp.all(u["w"] == 0)) == (start > 0)
    assert len(traces) == 1
    jaxpr = jax.make_jaxpr(lambda g, s: tx.update(g, s))(params, tx.init(params))
    assert "cond" in str(jaxpr)


def test_describe_frozen_paths_and_errors():
    tx = gradtx.conditionally_transform(gradtx.sgd(0.1), odd_steps)
    params = {"w": jnp.zeros(2)}
    assert tx.describe(params, step=0)["w"] == [("conditionally_transform", {"active": False})]
    active = tx.describe(params, step=1)["w"]
    assert active[0] == ("conditionally_transform", {"active": True})
    assert active[1][0] == "scale_by_learning_rate"
    assert tx.frozen_paths(params) == frozenset()
    with pytest.raises(TypeError, match="should_transform_fn"):
        gradtx.conditionally_transform(gradtx.sgd(0.1), 3)
    bad = gradtx.conditionally_mask(gradtx.sgd(0.1), lambda step: jnp.ones(2, bool))
    with pytest.raises(ValueError, match="one boolean"):
        bad.update(params, bad.init(params))
    with pytest.raises(KeyError, match="step"):
        tx.update(params, {"inner": {}})
