"""State tools: state_dict keys, load_state_dict, reconcile, checkpoints on disk."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx import schedules

SLOTS = ("count", "mu", "nu", "schedule_count")


def _params(n_layers=2):
    key = jax.random.key(0)
    layers = []
    for i in range(n_layers):
        kw, kb = jax.random.split(jax.random.fold_in(key, i))
        layers.append(
            {"w": jax.random.normal(kw, (3, 3)), "b": jax.random.normal(kb, (3,))},
        )
    return {"enc": {"layers": layers}, "head": {"w": jnp.ones((3, 1))}}


def _paths(n_layers=2):
    out = []
    for i in range(n_layers):
        out += [f"enc/layers/{i}/b", f"enc/layers/{i}/w"]
    return out + ["head/w"]


def _tx():
    sched = schedules.warmup_cosine_decay(0.0, 1e-2, 2, 20)
    return gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(sched, mask="!**/b"))


def _grads(params, scale=1.0):
    return jax.tree.map(lambda p: scale * jnp.cos(p) + 0.5, params)


def _train(tx, params, state, steps=3):
    for i in range(steps):
        updates, state = tx.update(_grads(params, 1.0 + i), state, params)
        params = gradtx.apply_updates(params, updates)
    return params, state


def _assert_bitwise_equal(a, b):
    assert set(a) == set(b)
    for key in a:
        x, y = np.asarray(a[key]), np.asarray(b[key])
        assert x.dtype == y.dtype, key
        assert x.shape == y.shape, key
        np.testing.assert_array_equal(x, y, err_msg=key)


def test_state_dict_keys_of_chain_with_adamw():
    tx, params = _tx(), _params()
    flat = gradtx.state_dict(tx.init(params))
    expected = {"clip_by_global_norm/global_norm", "clip_by_global_norm/clipped"}
    expected |= {f"adamw/{slot}/{path}" for slot in SLOTS for path in _paths()}
    expected.add("adamw/scheduled/learning_rate")  # the schedule's value, for `stats`
    assert set(flat) == expected
    assert "adamw/mu/enc/layers/0/w" in flat
    assert "adamw/schedule_count/head/w" in flat
    assert flat["adamw/mu/enc/layers/1/w"].shape == (3, 3)
    assert flat["adamw/mu/enc/layers/1/w"].dtype == jnp.float32
    assert flat["adamw/count/head/w"].dtype == jnp.int32
    assert flat["adamw/count/head/w"].shape == ()
    assert flat["clip_by_global_norm/global_norm"].shape == ()


def test_state_dict_without_schedule_has_no_schedule_count():
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(1e-3, mask="!**/b"))
    flat = gradtx.state_dict(tx.init(_params()))
    assert not any("schedule_count" in k for k in flat)
    assert {k.split("/")[1] for k in flat if k.startswith("adamw/")} == {"mu", "nu", "count"}


def test_state_dict_keys_of_named_chain():
    tx = gradtx.named_chain(
        ("clip", gradtx.clip_by_global_norm(1.0)),
        ("opt", gradtx.adam(1e-3)),
        ("momentum", gradtx.trace(0.9)),
    )
    flat = gradtx.state_dict(tx.init(_params()))
    expected = {"clip/global_norm", "clip/clipped"}
    expected |= {f"opt/{slot}/{p}" for slot in ("mu", "nu", "count") for p in _paths()}
    expected |= {f"momentum/trace/{p}" for p in _paths()}
    assert set(flat) == expected


def test_state_dict_values_are_the_state_arrays():
    tx, params = _tx(), _params()
    _, state = _train(tx, params, tx.init(params), steps=2)
    flat = gradtx.state_dict(state)
    assert flat["adamw/mu/head/w"] is state["adamw"]["mu"]["head/w"]
    assert int(flat["adamw/count/head/w"]) == 2
    assert int(flat["adamw/schedule_count/enc/layers/0/b"]) == 2


def test_load_state_dict_round_trip_is_bitwise():
    tx, params = _tx(), _params()
    params, state = _train(tx, params, tx.init(params))
    flat = gradtx.state_dict(state)
    loaded, report = gradtx.load_state_dict(tx, params, flat)
    assert report.clean
    assert report.missing == () and report.unexpected == () and report.mismatched == {}
    assert jax.tree.structure(loaded) == jax.tree.structure(state)
    _assert_bitwise_equal(gradtx.state_dict(loaded), flat)
    # Continuing from the loaded state is the same as continuing from the original.
    a = _train(tx, params, state, steps=2)
    b = _train(tx, params, loaded, steps=2)
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_load_state_dict_into_shape_dtype_structs():
    tx, params = _tx(), _params()
    _, state = _train(tx, params, tx.init(params))
    flat = gradtx.state_dict(state)
    abstract = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    loaded, report = gradtx.load_state_dict(tx, abstract, flat)
    assert report.clean
    _assert_bitwise_equal(gradtx.state_dict(loaded), flat)


def test_strict_load_reports_missing_unexpected_and_changed_keys():
    tx, params = _tx(), _params()
    _, state = _train(tx, params, tx.init(params))
    flat = dict(gradtx.state_dict(state))
    del flat["adamw/mu/head/w"]
    flat["adamw/mu/head/bias"] = np.zeros(3, np.float32)
    flat["adamw/nu/enc/layers/0/w"] = np.zeros((3, 4), np.float32)
    flat["adamw/count/enc/layers/0/b"] = np.zeros((), np.float32)
    with pytest.raises(gradtx.StateMismatchError, match=r"missing \(1\): adamw/mu/head/w") as info:
        gradtx.load_state_dict(tx, params, flat)
    message = str(info.value)
    assert "unexpected (1): adamw/mu/head/bias" in message
    assert "changed: adamw/nu/enc/layers/0/w: loaded ((3, 4), 'float32')" in message
    assert "expected ((3, 3), 'float32')" in message
    assert "re-initialised, every slot and count (2): enc/layers/0/b, enc/layers/0/w" in message
    assert "strict=False" in message
    report = info.value.report
    assert report.missing == ("adamw/mu/head/w",)
    assert report.unexpected == ("adamw/mu/head/bias",)
    assert report.mismatched == {
        "adamw/nu/enc/layers/0/w": (((3, 4), "float32"), ((3, 3), "float32")),
        "adamw/count/enc/layers/0/b": (((), "float32"), ((), "int32")),
    }
    # A changed key starts its whole path over: every slot of it, and its step count.
    assert report.reinitialised == ("enc/layers/0/b", "enc/layers/0/w")
    assert not report.clean


def test_state_mismatch_error_is_a_key_error():
    tx, params = _tx(), _params()
    with pytest.raises(KeyError, match="missing"):
        gradtx.load_state_dict(tx, params, {})


def test_non_strict_load_initialises_new_keys_and_drops_unexpected():
    tx, params = _tx(), _params()
    _, state = _train(tx, params, tx.init(params))
    flat = dict(gradtx.state_dict(state))
    original = dict(flat)
    del flat["adamw/mu/head/w"]
    del flat["adamw/count/head/w"]
    flat["adamw/mu/head/bias"] = np.ones(3, np.float32)
    flat["adamw/nu/enc/layers/0/w"] = np.ones((2, 2), np.float32)
    loaded, report = gradtx.load_state_dict(tx, params, flat, strict=False)
    assert report.missing == ("adamw/count/head/w", "adamw/mu/head/w")
    assert report.unexpected == ("adamw/mu/head/bias",)
    assert set(report.mismatched) == {"adamw/nu/enc/layers/0/w"}
    out = gradtx.state_dict(loaded)
    assert set(out) == set(original)
    fresh = gradtx.state_dict(tx.init(params))
    assert report.reinitialised == ("enc/layers/0/w",)
    # The changed path starts over whole (mu and count too), like the missing ones.
    anew = {f"adamw/{s}/enc/layers/0/w" for s in ("mu", "nu", "count", "schedule_count")}
    anew |= {"adamw/mu/head/w", "adamw/count/head/w"}
    for key in anew:
        np.testing.assert_array_equal(out[key], fresh[key])
        assert out[key].dtype == fresh[key].dtype
    np.testing.assert_array_equal(out["adamw/mu/head/w"], np.zeros((3, 1), np.float32))
    assert int(out["adamw/count/head/w"]) == 0
    for key in set(original) - anew:
        np.testing.assert_array_equal(out[key], original[key], err_msg=key)
    # Where the moment was kept but the count was reset, continuing still works.
    _train(tx, params, loaded, steps=1)


def test_round_trip_through_npz_file(tmp_path):
    tx, params = _tx(), _params()
    params, state = _train(tx, params, tx.init(params))
    flat = {k: np.asarray(v) for k, v in gradtx.state_dict(state).items()}
    path = tmp_path / "opt_state.npz"
    np.savez(path, **flat)
    with np.load(path) as data:
        restored = {k: data[k] for k in data.files}
    assert set(restored) == set(flat)
    loaded, report = gradtx.load_state_dict(tx, params, restored)
    assert report.clean
    _assert_bitwise_equal(gradtx.state_dict(loaded), flat)
    for leaf in jax.tree.leaves(loaded):
        assert isinstance(leaf, jax.Array)
    a = _train(tx, params, state, steps=2)
    b = _train(tx, params, loaded, steps=2)
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_reconcile_after_adding_a_layer():
    tx, params = _tx(), _params(2)
    params, state = _train(tx, params, tx.init(params))
    old = gradtx.state_dict(state)
    new_layer = {"w": jnp.full((3, 3), 0.1), "b": jnp.full((3,), 0.2)}
    grown = {
        "enc": {"layers": [*params["enc"]["layers"], new_layer]},
        "head": params["head"],
    }
    new_state, report = gradtx.reconcile(tx, state, grown)
    new_keys = {f"adamw/{slot}/enc/layers/2/{n}" for slot in SLOTS for n in ("b", "w")}
    assert set(report.missing) == new_keys
    assert report.unexpected == () and report.mismatched == {}
    flat = gradtx.state_dict(new_state)
    assert set(flat) == set(old) | new_keys
    for key, value in old.items():
        np.testing.assert_array_equal(flat[key], value, err_msg=key)
        assert flat[key].dtype == value.dtype
    for n, shape in (("w", (3, 3)), ("b", (3,))):
        for slot in ("mu", "nu"):
            np.testing.assert_array_equal(
                flat[f"adamw/{slot}/enc/layers/2/{n}"], np.zeros(shape, np.float32)
            )
        assert int(flat[f"adamw/count/enc/layers/2/{n}"]) == 0
        assert int(flat[f"adamw/schedule_count/enc/layers/2/{n}"]) == 0
    assert int(flat["adamw/count/enc/layers/0/w"]) == 3


def test_reconcile_after_removing_a_layer_reports_dropped_keys():
    tx, params = _tx(), _params(3)
    params, state = _train(tx, params, tx.init(params))
    old = gradtx.state_dict(state)
    shrunk = {"enc": {"layers": params["enc"]["layers"][:2]}, "head": params["head"]}
    new_state, report = gradtx.reconcile(tx, state, shrunk)
    dropped = {f"adamw/{slot}/enc/layers/2/{n}" for slot in SLOTS for n in ("b", "w")}
    assert set(report.unexpected) == dropped
    assert report.missing == () and report.mismatched == {}
    flat = gradtx.state_dict(new_state)
    assert set(flat) == set(old) - dropped
    for key in flat:
        np.testing.assert_array_equal(flat[key], old[key], err_msg=key)
    _train(tx, shrunk, new_state, steps=1)


def test_reconcile_with_unchanged_params_is_clean_and_bitwise():
    tx, params = _tx(), _params()
    params, state = _train(tx, params, tx.init(params))
    same, report = gradtx.reconcile(tx, state, params)
    assert report.clean
    _assert_bitwise_equal(gradtx.state_dict(same), gradtx.state_dict(state))


def test_load_report_str():
    report = gradtx.LoadReport(missing=("a/x",), unexpected=("b/y", "b/z"))
    text = str(report)
    assert "missing (1): a/x" in text
    assert "unexpected (2): b/y, b/z" in text
    assert str(gradtx.LoadReport()) == "all keys matched"
