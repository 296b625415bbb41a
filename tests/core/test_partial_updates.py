"""Partial updates: None leaves and subset trees touch only their paths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx import schedules

LR, B1, B2, EPS = np.float32(0.1), np.float32(0.9), np.float32(0.999), np.float32(1e-8)


def _params(dtype=jnp.float32):
    return {
        "enc": {"w": jnp.ones((2, 3), dtype), "b": jnp.zeros(3, dtype)},
        "dec": {"w": jnp.full((3, 2), 0.5, dtype)},
        "scale": jnp.asarray(2.0, dtype),
    }


ALL = ["dec/w", "enc/b", "enc/w", "scale"]


def _grads(params, salt=1.0):
    return jax.tree.map(
        lambda p: (jnp.cos(p.astype(jnp.float32) * salt) + 0.1).astype(p.dtype), params
    )


def _optimizers():
    return [
        ("adam", gradtx.adam(LR, B1, B2, EPS)),
        ("adamw_schedule", gradtx.adamw(schedules.linear(0.1, 0.01, 5), weight_decay=0.1)),
        ("sgd_momentum", gradtx.sgd(0.1, momentum=0.9, nesterov=True)),
        (
            "chain",
            gradtx.chain(
                gradtx.clip_by_global_norm(1.0), gradtx.adam(LR, B1, B2, EPS, mu_dtype=jnp.bfloat16)
            ),
        ),
    ]


def _slot_entries(state):
    """`{(key without path, path): array}` for every per-path state entry."""
    out = {}
    for key, value in gradtx.state_dict(state).items():
        for path in ALL:
            if key.endswith("/" + path) or key == path:
                out[(key[: -len(path)], path)] = value
    return out


def _check_only_paths_moved(before, after, moved):
    old, new = _slot_entries(before), _slot_entries(after)
    assert old.keys() == new.keys()
    assert {p for _, p in old} == set(ALL)
    for (slot, path), value in old.items():
        if path in moved:
            continue
        assert new[(slot, path)].dtype == value.dtype
        np.testing.assert_array_equal(new[(slot, path)], value, err_msg=f"{slot}{path}")
    # And the moved paths did move (every slot of this optimizer changes on a step).
    for (slot, path), value in old.items():
        if path in moved:
            assert not np.array_equal(new[(slot, path)], value), f"{slot}{path}"


def _opt_ids():
    return [name for name, _ in _optimizers()]


@pytest.mark.parametrize("index", range(len(_optimizers())), ids=_opt_ids())
def test_none_leaves_update_only_present_paths(index):
    _, tx = _optimizers()[index]
    params = _params()
    state = tx.init(params)
    # one full step first, so that "unchanged" is not just "still zero"
    updates, state = tx.update(_grads(params), state, params)
    params = gradtx.apply_updates(params, updates)

    grads = _grads(params, 2.0)
    grads["enc"]["b"] = None
    grads["scale"] = None
    updates, new_state = tx.update(grads, state, params)
    assert updates["enc"]["b"] is None and updates["scale"] is None
    assert updates["enc"]["w"].shape == (2, 3)
    _check_only_paths_moved(state, new_state, {"enc/w", "dec/w"})

    new_params = gradtx.apply_updates(params, updates)
    assert new_params["enc"]["b"] is params["enc"]["b"]
    assert new_params["scale"] is params["scale"]
    assert not np.array_equal(new_params["dec"]["w"], params["dec"]["w"])


@pytest.mark.parametrize("index", range(len(_optimizers())), ids=_opt_ids())
def test_subset_tree_updates_only_its_paths(index):
    _, tx = _optimizers()[index]
    params = _params()
    state = tx.init(params)
    updates, state = tx.update(_grads(params), state, params)
    params = gradtx.apply_updates(params, updates)

    subset = {"enc": {"w": _grads(params, 3.0)["enc"]["w"]}}
    updates, new_state = tx.update(subset, state, params, partial=True)
    assert gradtx.paths.paths(updates) == ["enc/w"]
    _check_only_paths_moved(state, new_state, {"enc/w"})
    new_params = gradtx.apply_updates(params, updates)
    for path in ("enc/b", "dec/w", "scale"):
        assert gradtx.paths.leaves(new_params)[path] is gradtx.paths.leaves(params)[path]


def test_per_path_counts_advance_only_where_updated():
    tx = gradtx.adam(schedules.linear(0.1, 0.0, 10), B1, B2, EPS)
    params = _params()
    state = tx.init(params)
    plan = [ALL, ["enc/w"], ["enc/w", "scale"], ["enc/w"], []]
    for present in plan:
        grads = {
            path: (g if path in present else None)
            for path, g in gradtx.paths.leaves(_grads(params)).items()
        }
        grads = gradtx.paths.unflatten(params, grads)
        updates, state = tx.update(grads, state, params)
        params = gradtx.apply_updates(params, updates)
    expected = {"enc/w": 4, "scale": 2, "enc/b": 1, "dec/w": 1}
    for path, n in expected.items():
        assert int(state["count"][path]) == n, path
        assert int(state["schedule_count"][path]) == n, path


def test_bias_correction_uses_the_path_count():
    # After "a" took 5 steps, the first step of "b" is a fresh Adam step: -lr * g / (|g| + eps).
    tx = gradtx.adam(LR, B1, B2, EPS)
    params = {"a": jnp.zeros(2), "b": jnp.zeros(2)}
    state = tx.init(params)
    for _ in range(5):
        _, state = tx.update({"a": jnp.ones(2), "b": None}, state, params)
    g = jnp.asarray([0.5, -2.0])
    updates, state = tx.update({"a": None, "b": g}, state, params)
    expected = -LR * np.asarray(g) / (np.abs(np.asarray(g)) + EPS)
    np.testing.assert_allclose(updates["b"], expected, rtol=1e-6)
    assert int(state["count"]["b"]) == 1 and int(state["count"]["a"]) == 5


def test_partial_updates_under_jit():
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(LR, B1, B2, EPS))
    traces = []

    @jax.jit
    def step(params, state, grads):
        traces.append(None)
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state

    params = _params()
    state = tx.init(params)
    grads = _grads(params)
    grads["dec"]["w"] = None
    new_params, new_state = step(params, state, grads)
    np.testing.assert_array_equal(new_params["dec"]["w"], params["dec"]["w"])
    _check_only_paths_moved(state, new_state, {"enc/w", "enc/b", "scale"})
    assert int(new_state["adam"]["count"]["dec/w"]) == 0
    # The first partial update gives the step counts one value per path (they were shared):
    # the next step is traced once more, and from then on the layout stays.
    new_params, new_state = step(new_params, new_state, grads)
    step(new_params, new_state, grads)
    assert len(traces) == 2


def test_clip_by_global_norm_uses_only_present_leaves():
    tx = gradtx.clip_by_global_norm(1.0)
    params = {"a": jnp.zeros(2), "b": jnp.zeros(1)}
    updates, state = tx.update({"a": jnp.asarray([3.0, 4.0]), "b": None}, tx.init(params))
    np.testing.assert_allclose(updates["a"], [0.6, 0.8], rtol=1e-6)
    assert updates["b"] is None
    assert float(state["global_norm"]) == 5.0


def test_bf16_params_partial_update_keeps_dtypes():
    tx = gradtx.adam(LR, B1, B2, EPS, mu_dtype=jnp.float32)
    params = _params(jnp.bfloat16)
    state = tx.init(params)
    assert state["mu"]["enc/w"].dtype == jnp.float32
    assert state["nu"]["enc/w"].dtype == jnp.bfloat16
    grads = _grads(params)
    grads["enc"]["b"] = None
    updates, new_state = tx.update(grads, state, params)
    # The update read float32 state (`mu`), so it stays float32 until `apply_updates` rounds.
    assert updates["enc"]["w"].dtype == jnp.float32
    new_params = gradtx.apply_updates(params, updates)
    for path, leaf in gradtx.paths.leaves(new_params).items():
        assert leaf.dtype == jnp.bfloat16, path
    assert new_params["enc"]["b"] is params["enc"]["b"]
    for slot in ("mu", "nu", "count"):
        assert new_state[slot]["enc/b"].dtype == state[slot]["enc/b"].dtype
        np.testing.assert_array_equal(new_state[slot]["enc/b"], state[slot]["enc/b"])
        assert new_state[slot]["enc/w"].dtype == state[slot]["enc/w"].dtype


def test_all_none_update_is_a_no_op():
    tx = gradtx.adam(LR)
    params = _params()
    state = tx.init(params)
    _, state = tx.update(_grads(params), state, params)
    nones = jax.tree.map(lambda _: None, params)
    updates, new_state = tx.update(nones, state, params)
    assert all(u is None for u in gradtx.paths.leaves(updates).values())
    _check_only_paths_moved(state, new_state, set())
    assert gradtx.apply_updates(params, updates)["enc"]["w"] is params["enc"]["w"]
