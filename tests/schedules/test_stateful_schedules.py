"""Stateful schedules in `inject_hyperparams`: a learning rate lowered on a plateau of `value`.

The schedule's state lives in the injected state, addressed by the hyperparameter's name.
Checked step by step against optax's `inject_stateful_hyperparams` (with the same rule written
as an optax `StatefulSchedule`) and a plain Python reference, eagerly, under `jit` and
`lax.scan`, and across `gradtx.save` / `gradtx.restore` in the middle of a run.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx
from gradtx import schedules

# The loss fed as `value=` at each step: it improves, stalls, improves, stalls again.
VALUES = [5.0, 4.0, 4.2, 4.1, 3.9, 3.95, 3.96, 3.97, 2.0, 2.5, 2.4, 2.3, 2.2, 2.1]
N = len(VALUES)
SPLIT = 6  # where the run is saved and restored
INIT, FACTOR, PATIENCE, RTOL = 0.1, 0.5, 2, 1e-3


class Plateau(schedules.StatefulSchedule):
    """`init_value` times `factor` for every `patience` steps in a row without improvement.

    A step improves when `value < best * (1 - rtol)`; the count of steps without improvement
    restarts after each reduction.
    """

    init_value: Any
    factor: Any = FACTOR
    patience: Any = PATIENCE
    rtol: Any = RTOL

    def init(self) -> dict:
        return {
            "best": jnp.full((), jnp.inf, jnp.float32),
            "plateau": jnp.zeros((), jnp.int32),
            "scale": jnp.ones((), jnp.float32),
        }

    def update(self, state: dict, *, value: Any, **extra: Any) -> dict:
        value = jnp.asarray(value, jnp.float32)
        better = value < state["best"] * (1 - jnp.float32(self.rtol))
        plateau = jnp.where(better, 0, state["plateau"] + 1)
        reduce = plateau >= self.patience
        return {
            "best": jnp.where(better, value, state["best"]),
            "plateau": jnp.where(reduce, 0, plateau),
            "scale": jnp.where(reduce, state["scale"] * jnp.float32(self.factor), state["scale"]),
        }

    def value(self, state: dict, **extra: Any) -> jax.Array:
        return jnp.float32(self.init_value) * state["scale"]


class OptaxPlateau(optax.schedules.StatefulSchedule):
    """The same rule as an optax stateful schedule (`__call__` gives the value)."""

    def __init__(self, init_value: float) -> None:
        self.init_value = init_value

    def init(self) -> dict:
        return {
            "best": jnp.full((), jnp.inf, jnp.float32),
            "plateau": jnp.zeros((), jnp.int32),
            "scale": jnp.ones((), jnp.float32),
        }

    def update(self, state: dict, **extra: Any) -> dict:
        value = jnp.asarray(extra["value"], jnp.float32)
        better = value < state["best"] * (1 - RTOL)
        plateau = jnp.where(better, 0, state["plateau"] + 1)
        reduce = plateau >= PATIENCE
        return {
            "best": jnp.where(better, value, state["best"]),
            "plateau": jnp.where(reduce, 0, plateau),
            "scale": jnp.where(reduce, state["scale"] * FACTOR, state["scale"]),
        }

    def __call__(self, state: dict, **extra: Any) -> jax.Array:
        return self.init_value * state["scale"]


def reference_learning_rates(values: list[float]) -> list[float]:
    """The learning rate of each step, in plain Python floats (float64)."""
    best, plateau, scale, out = math.inf, 0, 1.0, []
    for value in values:
        out.append(INIT * scale)  # the step runs with the state before its own value
        better = value < best * (1 - RTOL)
        best = value if better else best
        plateau = 0 if better else plateau + 1
        if plateau >= PATIENCE:
            scale, plateau = scale * FACTOR, 0
    return out


def _params() -> dict:
    return {"w": jnp.array([1.0, -2.0, 0.5]), "b": jnp.array(0.25)}


def _grads(params: dict) -> dict:
    return jax.tree.map(lambda p: 2.0 * p, params)  # the gradient of sum(p**2)


def _tx(learning_rate: Any = None) -> gradtx.Transformation:
    schedule = Plateau(INIT) if learning_rate is None else learning_rate
    return gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=schedule, momentum=0.9)


def _gradtx_run(tx: Any, params: dict, state: Any, values: list[float]) -> tuple:
    learning_rates = []
    for value in values:
        updates, state = tx.update(_grads(params), state, params, value=value)
        params = gradtx.apply_updates(params, updates)
        learning_rates.append(float(gradtx.hyperparams(state)["learning_rate"]))
    return params, state, learning_rates


def _close(a: Any, b: Any) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


# --- against optax and the reference --------------------------------------------------------------


def test_plateau_learning_rates_match_the_reference():
    expected = reference_learning_rates(VALUES)
    assert len(set(expected)) >= 3  # the rule fires on VALUES: the check is not vacuous
    params = _params()
    tx = _tx()
    _, _, learning_rates = _gradtx_run(tx, params, tx.init(params), VALUES)
    np.testing.assert_allclose(learning_rates, expected, rtol=1e-7)


def test_step_by_step_as_optax_inject_stateful_hyperparams():
    params = opt_params = _params()
    tx = _tx()
    with warnings.catch_warnings():  # optax deprecates the name for its inject_hyperparams
        warnings.simplefilter("ignore", DeprecationWarning)
        opt = optax.inject_stateful_hyperparams(optax.sgd)(
            learning_rate=OptaxPlateau(INIT), momentum=0.9
        )
    state, opt_state = tx.init(params), opt.init(opt_params)
    for value in VALUES:
        updates, state = tx.update(_grads(params), state, params, value=value)
        with jax.numpy_dtype_promotion("standard"):
            opt_updates, opt_state = opt.update(
                _grads(opt_params), opt_state, opt_params, value=value
            )
        _close(updates, opt_updates)
        _close(gradtx.hyperparams(state), opt_state.hyperparams)
        own = state.schedule_states["learning_rate"]
        _close(own, opt_state.hyperparams_states["learning_rate"])
        params = gradtx.apply_updates(params, updates)
        opt_params = optax.apply_updates(opt_params, opt_updates)
    _close(params, opt_params)


def test_an_optax_stateful_schedule_runs_in_gradtx_inject_hyperparams():
    params = _params()
    ours, theirs = _tx(), _tx(OptaxPlateau(INIT))
    p1, s1, lr1 = _gradtx_run(ours, params, ours.init(params), VALUES)
    p2, s2, lr2 = _gradtx_run(theirs, params, theirs.init(params), VALUES)
    assert lr1 == lr2
    _close(p1, p2)
    assert sorted(gradtx.state_dict(s2)) == sorted(gradtx.state_dict(s1))


# --- jit, scan, vmap ------------------------------------------------------------------------------


@jax.jit
def _step(tx: Any, params: dict, state: Any, value: jax.Array) -> tuple:
    updates, state = tx.update(_grads(params), state, params, value=value)
    return gradtx.apply_updates(params, updates), state


def test_under_jit_as_eagerly_and_without_recompiling():
    params = _params()
    tx = _tx()
    expected, expected_state, expected_rates = _gradtx_run(tx, params, tx.init(params), VALUES)
    state = tx.init(params)
    rates = []
    for value in VALUES:
        params, state = _step(tx, params, state, jnp.float32(value))
        rates.append(float(gradtx.hyperparams(state)["learning_rate"]))
    _close(params, expected)
    _close(gradtx.state_dict(state), gradtx.state_dict(expected_state))
    assert rates == expected_rates
    compiled = _step._cache_size()
    _step(_tx(Plateau(0.3)), params, state, jnp.float32(1.0))  # a new value: no recompilation
    assert _step._cache_size() == compiled


def test_under_lax_scan_as_eagerly():
    params = _params()
    tx = _tx()
    expected, expected_state, expected_rates = _gradtx_run(tx, params, tx.init(params), VALUES)

    def body(carry: tuple, value: jax.Array) -> tuple:
        params, state = carry
        updates, state = tx.update(_grads(params), state, params, value=value)
        learning_rate = gradtx.hyperparams(state)["learning_rate"]
        return (gradtx.apply_updates(params, updates), state), learning_rate

    run = jax.jit(lambda p, s: jax.lax.scan(body, (p, s), jnp.asarray(VALUES, jnp.float32)))
    (params, state), rates = run(params, tx.init(params))
    _close(params, expected)
    _close(gradtx.state_dict(state), gradtx.state_dict(expected_state))
    np.testing.assert_allclose(np.asarray(rates), expected_rates, rtol=1e-7)


def test_vmap_sweeps_the_schedule_s_numbers():
    params = _params()

    def final_rate(init_value: jax.Array) -> jax.Array:
        tx = _tx(Plateau(init_value))
        state = tx.init(params)
        for value in VALUES:
            _, state = tx.update(_grads(params), state, params, value=value)
        return gradtx.hyperparams(state)["learning_rate"]

    rates = jax.vmap(final_rate)(jnp.array([0.1, 0.4], jnp.float32))
    last = reference_learning_rates(VALUES)[-1]
    np.testing.assert_allclose(np.asarray(rates), [last, 4 * last], rtol=1e-6)


# --- checkpoints and names ------------------------------------------------------------------------


def test_save_and_restore_mid_run_continues_as_uninterrupted(tmp_path):
    params = _params()
    tx = _tx()
    expected, expected_state, _ = _gradtx_run(tx, params, tx.init(params), VALUES)
    halfway, state, _ = _gradtx_run(tx, params, tx.init(params), VALUES[:SPLIT])
    assert float(state.schedule_states["learning_rate"]["scale"]) == FACTOR  # mid-plateau
    path = tmp_path / "run.safetensors"
    gradtx.save(path, halfway, state, tx=tx)
    fresh = _tx()  # an equal transformation, built anew
    restored_params, restored, report = gradtx.restore(path, fresh, _params())
    assert report.clean
    _close(restored.schedule_states, state.schedule_states)
    params, state, _ = _gradtx_run(fresh, restored_params, restored, VALUES[SPLIT:])
    np.testing.assert_array_equal(np.asarray(params["w"]), np.asarray(expected["w"]))
    _close(gradtx.state_dict(state), gradtx.state_dict(expected_state))


def test_the_schedule_state_is_addressed_by_name():
    params = _params()
    tx = gradtx.chain(gradtx.clip_by_global_norm(10.0), _tx())
    state = tx.init(params)
    keys = [k for k in gradtx.state_dict(state) if "schedule_states" in k]
    assert keys == [
        "sgd/schedule_states/learning_rate/best",
        "sgd/schedule_states/learning_rate/plateau",
        "sgd/schedule_states/learning_rate/scale",
    ]
    assert sorted(gradtx.hyperparams(state)) == ["sgd/learning_rate", "sgd/momentum"]
    assert float(gradtx.hyperparams(state)["sgd/learning_rate"]) == pytest.approx(INIT)
    _, state = tx.update(_grads(params), state, params, value=1.0)
    # Setting another hyperparameter keeps the schedule's state.
    changed = gradtx.set_hyperparams(state, {"sgd/momentum": 0.5})
    assert float(gradtx.hyperparams(changed)["sgd/momentum"]) == 0.5
    _close(changed["sgd"].schedule_states, state["sgd"].schedule_states)
    with pytest.raises(ValueError, match="'sgd/learning_rate' follows a schedule"):
        gradtx.set_hyperparams(state, {"sgd/learning_rate": 0.5})
    stats = gradtx.stats(state)
    assert float(stats["sgd/hyperparams/learning_rate"]) == pytest.approx(INIT)


def test_explain_shows_the_value_at_init():
    tx = _tx()
    text = str(gradtx.explain(tx, _params()))
    assert "0.1" in text


# --- WrappedSchedule ------------------------------------------------------------------------------


def test_wrapped_schedule_gives_the_schedule_it_wraps():
    linear = schedules.linear(0.1, 0.01, 8)
    params = _params()
    plain, wrapped = _tx(linear), _tx(schedules.WrappedSchedule(linear))
    p1, _, lr1 = _gradtx_run(plain, params, plain.init(params), VALUES)
    p2, s2, lr2 = _gradtx_run(wrapped, params, wrapped.init(params), VALUES)
    assert lr1 == lr2
    _close(p1, p2)
    assert int(s2.schedule_states["learning_rate"]) == N


def test_wrapped_schedule_as_optax_wrapped_schedule():
    theirs = optax.WrappedSchedule(optax.linear_schedule(0.1, 0.01, 8))
    ours = schedules.WrappedSchedule(schedules.linear(0.1, 0.01, 8))
    state, opt_state = ours.init(), theirs.init()
    for _ in range(12):
        np.testing.assert_allclose(ours.value(state), theirs(opt_state), rtol=1e-6)
        with jax.numpy_dtype_promotion("standard"):
            state, opt_state = ours.update(state), theirs.update(opt_state)
    assert int(state) == 12


def test_wrapped_schedule_takes_a_function_or_a_number():
    assert (
        float(
            schedules.WrappedSchedule(lambda step: 0.5 * step.astype(jnp.float32)).value(
                jnp.int32(3)
            )
        )
        == 1.5
    )
    assert float(schedules.WrappedSchedule(0.25).value(jnp.int32(3))) == 0.25


# --- misuse ---------------------------------------------------------------------------------------


def test_a_stateful_schedule_outside_inject_hyperparams_says_where_it_belongs():
    with pytest.raises(TypeError, match=r"Plateau is a stateful schedule.*inject_hyperparams"):
        gradtx.sgd(learning_rate=Plateau(INIT)).init(_params())


class _Drifting(Plateau):
    def update(self, state: dict, **extra: Any) -> dict:
        return {**state, "plateau": state["plateau"].astype(jnp.float32)}


class _VectorValued(Plateau):
    def value(self, state: dict, **extra: Any) -> jax.Array:
        return jnp.ones(3)


def test_an_update_that_changes_the_state_s_dtype_is_refused():
    params = _params()
    tx = _tx(_Drifting(INIT))
    with pytest.raises(TypeError, match=r"`learning_rate` \(_Drifting\) returned from `update`"):
        tx.update(_grads(params), tx.init(params), params, value=1.0)


def test_a_value_that_is_not_a_scalar_is_refused_at_init():
    with pytest.raises(TypeError, match=r"must return a real number from `value` .*shape \(3,\)"):
        _tx(_VectorValued(INIT)).init(_params())


def test_a_state_from_another_transformation_is_refused():
    params = _params()
    plain = gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=0.1, momentum=0.9)
    with pytest.raises(TypeError, match=r"stateful schedules \[\], but .* are \['learning_rate'\]"):
        _tx().update(_grads(params), plain.init(params), params, value=1.0)
