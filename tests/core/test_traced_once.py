"""Per-array math of some size is traced once per leaf signature, not once per leaf."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
import gradtx._core.per_array as elementwise
from gradtx._paths.cache import BoundedCache


def _params(n: int, dtype=jnp.float32) -> dict:
    rng = np.random.default_rng(0)
    return {
        f"layer{i}": {
            "kernel": jnp.asarray(rng.normal(size=(4, 3)), dtype),
            "bias": jnp.asarray(rng.normal(size=(3,)), dtype),
        }
        for i in range(n)
    }


def _step(tx):
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state

    return step


def _clipped_adamw():
    schedule = gradtx.schedules.warmup_cosine_decay(0.0, 1e-2, 2, 20)
    return gradtx.chain(
        gradtx.clip_by_global_norm(0.5),
        gradtx.adamw(schedule, weight_decay=0.1, mask="!**/bias"),
    )


def _top_level_eqns(tx, params) -> list:
    grads = jax.tree.map(jnp.ones_like, params)
    return jax.make_jaxpr(_step(tx))(params, tx.init(params), grads).jaxpr.eqns


def test_adam_traces_its_math_once_and_calls_it_per_leaf():
    tx = gradtx.adam(1e-3)
    small, large = _top_level_eqns(tx, _params(2)), _top_level_eqns(tx, _params(12))
    per_leaf = (len(large) - len(small)) / 20
    # Inline, one leaf's Adam step is over twenty operations; called, it is one call plus
    # the learning rate and the parameter update.
    assert per_leaf <= 4, per_leaf
    calls = [e for e in large if e.primitive.name in ("jit", "pjit")]
    assert len(calls) >= 24, len(calls)


def test_small_math_stays_inline():
    tx = gradtx.sgd(1e-2, momentum=0.9)
    eqns = _top_level_eqns(tx, _params(3))
    assert not [e for e in eqns if e.primitive.name in ("jit", "pjit")]


@pytest.mark.parametrize(("learning_rate", "negations"), [(1e-2, 0), (jnp.asarray(1e-2), 1)])
def test_sgd_traces_four_operations_per_leaf(learning_rate, negations):
    # Momentum (a multiply and an add), the learning rate and the parameter update; the
    # constant rate is negated once for the tree, and casts that change nothing are skipped.
    # A rate given as a number is a NumPy scalar here, negated before tracing: no `neg` at all.
    tx = gradtx.sgd(learning_rate, momentum=0.9)
    small, large = _top_level_eqns(tx, _params(2)), _top_level_eqns(tx, _params(12))
    assert (len(large) - len(small)) / 20 == 4
    assert [e.primitive.name for e in large].count("neg") == negations


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("flip_sign", [True, False])
def test_a_constant_learning_rate_is_applied_with_its_sign(dtype, flip_sign):
    tx = gradtx.scale_by_learning_rate(0.5, flip_sign=flip_sign)
    grads = {"a": jnp.asarray([1.0, -2.0], dtype), "b": jnp.asarray([4.0], dtype)}
    updates, _ = jax.jit(tx.update)(grads, tx.init(grads))
    sign = -1.0 if flip_sign else 1.0
    for path in grads:
        assert updates[path].dtype == dtype
        np.testing.assert_array_equal(
            np.asarray(updates[path], np.float32), sign * 0.5 * np.asarray(grads[path], np.float32)
        )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize(
    "make",
    [lambda: gradtx.adam(1e-2), _clipped_adamw, lambda: gradtx.bucketed(gradtx.adam(1e-2))],
    ids=["adam", "clipped-adamw", "bucketed-adam"],
)
def test_calling_the_math_gives_bit_for_bit_the_inline_results(monkeypatch, make, dtype):
    params = _params(5, dtype)
    rng = np.random.default_rng(1)
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)

    def run():
        jax.clear_caches()
        tx = make()
        step = jax.jit(_step(tx))
        p, s = params, tx.init(params)
        for _ in range(3):
            p, s = step(p, s, grads)
        return jax.tree.leaves((p, s))

    called = run()
    monkeypatch.setattr(elementwise, "_CALL_FROM", 10**9)  # everything inline
    monkeypatch.setattr(elementwise, "_calls", BoundedCache(4096))
    inline = run()
    assert len(called) == len(inline)
    for a, b in zip(called, inline):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_called_math_follows_new_hyperparameters_without_retracing():
    params = _params(2)
    grads = jax.tree.map(jnp.ones_like, params)
    traces = []

    @jax.jit
    def step(tx, params, state, grads):
        traces.append(1)
        return _step(tx)(params, state, grads)

    slow, fast = gradtx.adam(1e-3), gradtx.adam(1e-1)
    state = slow.init(params)
    p_slow, _ = step(slow, params, state, grads)
    p_fast, _ = step(fast, params, state, grads)
    assert len(traces) == 1
    moved_slow = float(jnp.abs(p_slow["layer0"]["bias"] - params["layer0"]["bias"]).max())
    moved_fast = float(jnp.abs(p_fast["layer0"]["bias"] - params["layer0"]["bias"]).max())
    np.testing.assert_allclose(moved_fast, 100 * moved_slow, rtol=1e-4)
