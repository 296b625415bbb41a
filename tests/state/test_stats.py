"""`gradtx.stats`: every statistic of a state, flat, with the state's own keys."""

from __future__ import annotations

import copy
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx

PARAMS = {"enc": {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}, "head": {"w": jnp.ones(2)}}


def _tx():
    schedule = gradtx.schedules.linear(0.1, 0.0, 10)
    encoder = gradtx.chain(
        gradtx.monitor("grad", ("global_norm", "norm")),
        gradtx.inject_hyperparams(gradtx.adamw)(learning_rate=schedule, weight_decay=0.01),
    )
    groups = gradtx.partition(
        {"encoder": encoder, "head": gradtx.sgd(0.1)}, {"encoder": "enc/**", "head": "head/**"}
    )
    return gradtx.chain(
        gradtx.clip_by_global_norm(1.0), gradtx.apply_if_finite(groups, max_consecutive_errors=2)
    )


def _grads(scale: float = 1.0):
    return jax.tree.map(lambda p: jnp.full_like(p, scale), PARAMS)


def test_the_statistics_of_a_whole_training_setup():
    tx = _tx()
    state = tx.init(PARAMS)
    for _ in range(3):
        _, state = tx.update(_grads(), state, PARAMS)
    got = gradtx.stats(state)
    inner = "apply_if_finite/inner/encoder"
    assert sorted(got) == sorted(
        [
            "clip_by_global_norm/clipped",
            "clip_by_global_norm/global_norm",
            "apply_if_finite/last_finite",
            "apply_if_finite/notfinite_count",
            "apply_if_finite/total_notfinite",
            f"{inner}/grad/global_norm",
            f"{inner}/grad/norm/enc/b",
            f"{inner}/grad/norm/enc/w",
            *(f"{inner}/adamw/hyperparams/{h}" for h in ("b1", "b2", "eps", "eps_root")),
            f"{inner}/adamw/hyperparams/learning_rate",
            f"{inner}/adamw/hyperparams/weight_decay",
        ]
    )
    assert float(got["clip_by_global_norm/global_norm"]) == pytest.approx(np.sqrt(8.0))
    assert bool(got["clip_by_global_norm/clipped"])
    # the learning rate the third step used: linear(0.1 -> 0, 10 steps) at step 2
    assert float(got[f"{inner}/adamw/hyperparams/learning_rate"]) == pytest.approx(0.08)
    assert int(got["apply_if_finite/total_notfinite"]) == 0


def test_keys_are_state_dict_keys_and_values_are_the_same_arrays():
    tx = _tx()
    _, state = tx.update(_grads(), tx.init(PARAMS), PARAMS)
    flat = gradtx.state_dict(state)
    for key, value in gradtx.stats(state).items():
        assert flat[key] is value, key


def test_skipped_steps_are_reported():
    tx = _tx()
    state = tx.init(PARAMS)
    _, state = tx.update(_grads(jnp.nan), state, PARAMS)
    _, state = tx.update(_grads(jnp.nan), state, PARAMS)
    got = gradtx.stats(state)
    assert int(got["apply_if_finite/notfinite_count"]) == 2
    assert int(got["apply_if_finite/total_notfinite"]) == 2
    assert not bool(got["apply_if_finite/last_finite"])


def test_stats_runs_inside_jit_and_gives_the_same_values():
    tx = _tx()
    _, state = tx.update(_grads(), tx.init(PARAMS), PARAMS)
    eager = gradtx.stats(state)
    jitted = jax.jit(gradtx.stats)(state)
    assert eager.keys() == jitted.keys()
    for key in eager:
        np.testing.assert_array_equal(eager[key], jitted[key], err_msg=key)


def test_a_plain_schedule_reports_the_rate_of_the_last_step():
    # No inject_hyperparams: the schedule given to adamw is recorded as it is used.
    tx = gradtx.adamw(gradtx.schedules.linear(0.1, 0.0, 10), weight_decay=0.01)
    state = tx.init(PARAMS)
    assert float(gradtx.stats(state)["scheduled/learning_rate"]) == pytest.approx(0.1)
    step = jax.jit(tx.update)
    for _ in range(4):
        _, state = step(_grads(), state, PARAMS)
    assert float(gradtx.stats(state)["scheduled/learning_rate"]) == pytest.approx(0.07)
    # A partial update: the paths that have taken the most steps give the reading.
    partial = {"enc": {"w": jnp.ones((2, 2)), "b": None}, "head": {"w": None}}
    _, state = tx.update(partial, state, PARAMS)
    assert int(state["schedule_count"]["enc/w"]) == 5
    assert int(state["schedule_count"]["head/w"]) == 4
    assert float(gradtx.stats(state)["scheduled/learning_rate"]) == pytest.approx(0.06)


def test_scale_by_schedule_reports_its_step_size():
    tx = gradtx.chain(gradtx.scale_by_schedule(lambda count: 2 * count), gradtx.sgd(1.0))
    state = tx.init(PARAMS)
    for _ in range(3):
        _, state = tx.update(_grads(), state, PARAMS)
    assert float(gradtx.stats(state)["scale_by_schedule/scheduled/step_size"]) == 4.0


def test_a_state_without_statistics_gives_an_empty_dict():
    tx = gradtx.adam(1e-3)
    assert gradtx.stats(tx.init(PARAMS)) == {}


# More buffers are donated than the step returns, so XLA says some were not usable.
@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
def test_the_pre_step_norm_survives_donating_the_gradients():
    # Gradients, params and state are all donated: XLA may write the new params and state
    # into any of their buffers, and the monitor still reports the norm the gradients had.
    tx = gradtx.chain(gradtx.monitor("grad"), gradtx.adamw(1e-2))
    params = {"w": jnp.arange(4.0), "b": jnp.ones(3)}
    grads = {"w": jnp.array([3.0, 0.0, 4.0, 0.0]), "b": jnp.array([0.0, 12.0, 0.0])}
    expected = float(gradtx.tree.norm(grads))

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state

    donated = jax.jit(step, donate_argnums=(0, 1, 2))
    _, state = donated(params, tx.init(params), grads)
    assert float(gradtx.stats(state)["grad/global_norm"]) == expected == 13.0


def test_statistics_are_plain_dicts_that_jax_flattens_itself():
    # A custom pytree node costs Python calls on every jitted call that passes the state; a
    # plain dict is flattened and rebuilt by JAX in C++ (see gradtx/_core/statistics.py).
    schedule = gradtx.schedules.warmup_cosine_decay(0.0, 1e-3, 10, 100)
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(schedule, mask="!**/b"))
    state = tx.init(PARAMS)
    assert type(state["clip_by_global_norm"]) is dict
    assert type(state["adamw"]["scheduled"]) is dict
    plain = {"clipped": 0, "global_norm": 0}
    assert jax.tree.structure(state["clip_by_global_norm"]) == jax.tree.structure(plain)
    assert sorted(gradtx.stats(state)) == [
        "adamw/scheduled/learning_rate",
        "clip_by_global_norm/clipped",
        "clip_by_global_norm/global_norm",
    ]


def _rebuilt_states(tx, state, tmp_path):
    """The state after each way a training loop rebuilds one."""
    step = jax.jit(lambda s: tx.update(_grads(), s, PARAMS)[1])
    yield "jit", step(state)
    yield "jit twice", step(step(state))
    yield "tree.map", jax.tree.map(lambda x: x, state)
    yield "unflatten", jax.tree.unflatten(jax.tree.structure(state), jax.tree.leaves(state))
    yield "device_get", jax.device_get(state)
    yield "load_state_dict", gradtx.load_state_dict(tx, PARAMS, gradtx.state_dict(state))[0]
    yield "reconcile", gradtx.reconcile(tx, state, PARAMS)[0]
    gradtx.save(tmp_path / "ckpt.safetensors", PARAMS, state, tx=tx)
    yield "save/restore", gradtx.restore(tmp_path / "ckpt.safetensors", tx, PARAMS)[1]
    yield "pickle", pickle.loads(pickle.dumps(jax.device_get(state)))
    yield "deepcopy", copy.deepcopy(state)


def test_every_statistic_survives_every_rebuild_of_the_state(tmp_path):
    # The mark is in the keys of a plain dict, which JAX keeps in the tree structure, so it
    # must come back from jit, tree functions, checkpoints and copies alike.
    tx = _tx()
    _, state = tx.update(_grads(), tx.init(PARAMS), PARAMS)
    expected = gradtx.stats(state)
    assert len(expected) == 14
    for how, rebuilt in _rebuilt_states(tx, state, tmp_path):
        assert list(gradtx.stats(rebuilt)) == list(expected), how
