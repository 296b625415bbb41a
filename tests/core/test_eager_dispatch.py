"""Eager (un-jitted) calls run one cached compiled program per structure."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx._core import outermost_call


def _params(n=6):
    return {"layers": [{"w": jnp.full((3, 2), float(i)), "b": jnp.zeros(2)} for i in range(n)]}


def test_eager_update_compiles_once_per_structure():
    params = _params()
    grads = jax.tree.map(jnp.ones_like, params)
    before = outermost_call._compiled._cache_size()
    tx = gradtx.adam(1e-3)
    state = tx.init(params)
    updates, state = tx.update(grads, state, params)
    after_first = outermost_call._compiled._cache_size()
    assert after_first == before + 1
    # Same structure, new learning rate and new state values: the cached program is reused.
    tx2 = gradtx.adam(5e-3)
    for _ in range(3):
        updates, state = tx2.update(grads, state, params)
    assert outermost_call._compiled._cache_size() == after_first


def test_eager_update_equals_jitted_update():
    params = _params()
    grads = jax.tree.map(lambda p: jnp.sin(p) + 0.5, params)
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(1e-2, mask="!**/b"))
    state = tx.init(params)
    eager = tx.update(grads, state, params)
    jitted = jax.jit(tx.update)(grads, state, params)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_array_equal(a, b)


def test_disable_jit_runs_the_python_code():
    traced = []

    class Spy(gradtx.Transformation):
        def init_state(self, params):
            return {}

        def step(self, updates, state, params=None, **extra):
            traced.append(isinstance(jax.tree.leaves(updates)[0], jax.core.Tracer))
            return updates, state

    params = _params(1)
    Spy().update(params, {}, params)
    with jax.disable_jit():
        Spy().update(params, {}, params)
    assert traced == [True, False]


def test_a_class_that_writes_its_own_update_keeps_it_and_runs_as_written():
    calls = []

    def update(self, updates, state, params=None, **extra):
        calls.append(isinstance(jax.tree.leaves(updates)[0], jax.core.Tracer))
        return updates, state

    class OwnUpdate(gradtx.Transformation):
        def init(self, params):
            return {}

    OwnUpdate.update = update  # as a class body would define it
    assert OwnUpdate.update is update
    params = _params(1)
    tx = OwnUpdate()
    tx.update(params, {}, params)  # no eager dispatch: the user's function, called eagerly
    assert calls == [False]
    # combinators call its `step`, which is that `update`, with no outermost work of its own
    gradtx.chain(tx).update(params, gradtx.chain(tx).init(params), params)
    assert calls[-1] is True


def test_a_class_without_a_step_or_a_state_maker_fails_when_instantiated():
    class NoStep(gradtx.Transformation):
        def init_state(self, params):
            return {}

    class NoState(gradtx.Transformation):
        def step(self, updates, state, params=None, **extra):
            return updates, state

    with pytest.raises(TypeError, match="NoStep defines neither `step` nor `update`"):
        NoStep()
    with pytest.raises(TypeError, match="NoState defines neither `init_state` nor `init`"):
        NoState()


def test_non_array_extra_arguments_fall_back_to_direct_calls():
    params = _params(1)
    tx = gradtx.sgd(0.1)
    updates, _ = tx.update(params, tx.init(params), params, note="a string")
    np.testing.assert_allclose(updates["layers"][0]["w"], -0.1 * params["layers"][0]["w"])


def test_apply_updates_returns_untouched_params_as_the_same_arrays():
    params = _params(2)
    updates = {"layers": [{"w": jnp.ones((3, 2)), "b": None}, None]}
    out = gradtx.apply_updates(params, updates)
    assert out["layers"][0]["b"] is params["layers"][0]["b"]
    assert out["layers"][1]["w"] is params["layers"][1]["w"]
    np.testing.assert_array_equal(out["layers"][0]["w"], params["layers"][0]["w"] + 1)
