"""`monitor`: statistics of the updates at one point of a chain, checked against NumPy."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled import donated_step_program

import gradtx

ALL = ("global_norm", "max_abs", "nonfinite_count", "norm", "update_ratio")


def _params():
    return {
        "enc": {"w": jnp.arange(6.0).reshape(2, 3) - 2.0, "b": jnp.zeros(3)},
        "head": [jnp.array([1.0, -2.0])],
    }


def _grads():
    return {
        "enc": {"w": jnp.full((2, 3), 0.5), "b": jnp.array([1.0, -3.0, 0.0])},
        "head": [jnp.array([4.0, 0.0])],
    }


def _numpy_stats(grads: dict, params: dict) -> dict:
    g = gradtx.paths.leaves(grads)
    p = gradtx.paths.leaves(params)
    norms = {k: np.linalg.norm(np.asarray(v, np.float64)) for k, v in g.items()}
    pnorms = {k: np.linalg.norm(np.asarray(p[k], np.float64)) for k in g}
    total = np.sqrt(sum(n**2 for n in norms.values()))
    ptotal = np.sqrt(sum(n**2 for n in pnorms.values()))
    out = {
        "m/global_norm": total,
        "m/max_abs": max(np.abs(np.asarray(v)).max() for v in g.values()),
        "m/nonfinite_count": 0,
        "m/global_update_ratio": total / ptotal,
    }
    for k in g:
        out[f"m/norm/{k}"] = norms[k]
        ratio = norms[k] / pnorms[k] if pnorms[k] else (np.inf if norms[k] else 0.0)
        out[f"m/update_ratio/{k}"] = ratio
    return out


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_every_statistic_matches_numpy(jit):
    tx = gradtx.chain(gradtx.monitor("m", ALL))
    params, grads = _params(), _grads()
    update = jax.jit(tx.update) if jit else tx.update
    updates, state = update(grads, tx.init(params), params)
    got = gradtx.stats(state)
    expected = _numpy_stats(grads, params)
    assert set(got) == set(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(np.asarray(got[key], np.float64), value, rtol=1e-6, err_msg=key)
    assert got["m/update_ratio/enc/b"] == np.inf  # a zero param with a non-zero update
    assert got["m/nonfinite_count"].dtype == jnp.int32
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), updates, grads))


def test_updates_pass_through_unchanged_in_their_dtype():
    tx = gradtx.monitor("m", ALL)
    params = {"w": jnp.ones(3, jnp.bfloat16), "s": jnp.float32(2.0)}
    grads = {"w": jnp.array([1.0, 2.0, 3.0], jnp.bfloat16), "s": jnp.float32(-1.0)}
    updates, _ = tx.update(grads, tx.init(params), params)
    for path in ("w", "s"):
        assert updates[path].dtype == grads[path].dtype
        np.testing.assert_array_equal(updates[path], grads[path])


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_update_ratio_hands_on_every_update_bit_for_bit(jit):
    # It ties each update to its param's sum of squares (see the next test); the tie keeps
    # -0 and infinities bit for bit and a NaN a NaN (its payload is the device's, as the
    # numerics page says), whatever the params hold.
    tx = gradtx.monitor("m", ALL)
    params = {
        "finite": jnp.ones(4),
        "zero": jnp.zeros(4),
        "nan": jnp.array([1.0, jnp.nan, 0.0, 2.0]),
        "inf": jnp.array([jnp.inf, 1.0, 0.0, -1.0]),
        "half": jnp.ones(4, jnp.bfloat16),
    }
    row = jnp.array([-0.0, jnp.nan, -jnp.inf, 3.0])
    grads = {**{k: row for k in params}, "half": row.astype(jnp.bfloat16)}
    update = jax.jit(tx.update) if jit else tx.update
    updates, _ = update(grads, tx.init(params), params)
    for path, g in grads.items():
        assert updates[path].dtype == g.dtype
        got, want = np.asarray(updates[path]), np.asarray(g)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=path)
        bits = f"u{want.dtype.itemsize}"
        kept = ~np.isnan(want)
        assert got[kept].view(bits).tolist() == want[kept].view(bits).tolist(), path


@pytest.mark.parametrize("place", ["before adam", "after adam"])
def test_a_donated_step_with_update_ratio_writes_the_params_in_place(place):
    # The ratio reads the params the apply overwrites. Unordered, XLA copied every param
    # leaf first (3 copies here), and the copies added 38 MB to a 20M-param step's peak.
    monitor = gradtx.monitor("m", "update_ratio")
    parts = (monitor, gradtx.adam(1e-3)) if place == "before adam" else (gradtx.adam(1e-3), monitor)
    tx = gradtx.chain(*parts)
    params = {"enc": {"w": jnp.ones((64, 32)), "b": jnp.ones(32)}, "head": jnp.ones((32, 8))}
    grads = jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), params)

    entry = donated_step_program(tx, params, grads)
    assert re.findall(r"= \w+\[[0-9,]+\]\S* copy\(", entry) == []


def test_before_a_clip_it_sees_the_raw_norm_and_after_it_the_clipped_one():
    tx = gradtx.chain(
        gradtx.monitor("raw"), gradtx.clip_by_global_norm(1.0), gradtx.monitor("clipped")
    )
    params = {"w": jnp.zeros(2)}
    _, state = tx.update({"w": jnp.array([6.0, 8.0])}, tx.init(params), params)
    got = gradtx.stats(state)
    assert float(got["raw/global_norm"]) == 10.0
    assert float(got["clipped/global_norm"]) == pytest.approx(1.0, rel=1e-6)
    assert float(got["clip_by_global_norm/global_norm"]) == 10.0
    assert bool(got["clip_by_global_norm/clipped"])


def test_nonfinite_elements_are_counted_and_norms_follow_ieee():
    tx = gradtx.monitor("m", ("nonfinite_count", "max_abs", "global_norm"))
    params = {"a": jnp.zeros(3), "b": jnp.zeros(2)}
    grads = {"a": jnp.array([jnp.nan, 1.0, jnp.inf]), "b": jnp.array([-jnp.inf, 2.0])}
    _, state = tx.update(grads, tx.init(params))
    assert int(state["nonfinite_count"]) == 3
    assert bool(jnp.isnan(state["global_norm"]))


def test_inside_a_partition_it_sees_its_group_and_its_keys_carry_the_group():
    encoder = gradtx.chain(gradtx.monitor("grad", ("global_norm", "norm")), gradtx.adam(1e-3))
    tx = gradtx.partition(
        {"encoder": encoder, "head": gradtx.sgd(0.1)}, {"encoder": "enc/**", "head": "head/**"}
    )
    params, grads = _params(), _grads()
    _, state = jax.jit(tx.update)(grads, tx.init(params), params)
    got = gradtx.stats(state)
    enc = gradtx.paths.leaves(grads["enc"])
    expected = np.sqrt(sum(float(jnp.sum(jnp.square(g))) for g in enc.values()))
    assert float(got["encoder/grad/global_norm"]) == pytest.approx(expected, rel=1e-6)
    assert sorted(k for k in got if "/norm/" in k) == [
        "encoder/grad/norm/enc/b",
        "encoder/grad/norm/enc/w",
    ]


def test_inside_masked_it_sees_the_selected_paths_only():
    tx = gradtx.masked(gradtx.monitor("grad", ("global_norm", "norm")), "enc/**")
    params, grads = _params(), _grads()
    _, state = tx.update(grads, tx.init(params), params)
    got = gradtx.stats(state)
    assert set(got) == {"global_norm", "norm/enc/b", "norm/enc/w"}
    assert float(got["global_norm"]) == pytest.approx(np.sqrt(1.5 + 10.0), rel=1e-6)


def test_a_none_gradient_keeps_its_per_path_value_and_leaves_the_global_ones():
    tx = gradtx.monitor("m", ("global_norm", "norm"))
    params = {"a": jnp.zeros(2), "b": jnp.zeros(2)}
    _, state = tx.update({"a": jnp.array([3.0, 4.0]), "b": jnp.array([1.0, 0.0])}, tx.init(params))
    _, state = tx.update({"a": None, "b": jnp.array([0.0, 2.0])}, state)
    assert float(state["norm"]["a"]) == 5.0  # unchanged: no gradient this step
    assert float(state["norm"]["b"]) == 2.0
    assert float(state["global_norm"]) == 2.0


def test_statistics_are_computed_inside_the_step_with_no_host_transfer():
    tx = gradtx.chain(gradtx.monitor("m", ALL), gradtx.adam(1e-2))
    params, grads = _params(), _grads()
    step = jax.jit(tx.update)
    state = tx.init(params)
    with jax.transfer_guard("disallow"):
        _, state = step(grads, state, params)
        got = jax.jit(gradtx.stats)(state)
    assert set(got) == set(_numpy_stats(grads, params))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: gradtx.monitor("m", ("nrm",)), r"unknown statistics \['nrm'\] in `stats`"),
        (lambda: gradtx.monitor("a/b"), "without '/'"),
        (lambda: gradtx.monitor(""), "non-empty string"),
    ],
)
def test_bad_arguments_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_update_ratio_without_params_names_the_monitor():
    tx = gradtx.monitor("m", "update_ratio")
    params = {"w": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"monitor\('m'\): `update_ratio` needs the params"):
        tx.update({"w": jnp.ones(2)}, tx.init(params))


def test_a_path_unknown_at_init_is_named():
    tx = gradtx.monitor("m", "norm")
    with pytest.raises(KeyError, match="no statistics for path 'v'"):
        tx.update({"v": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))


def test_packed_params_are_refused_with_the_reason():
    packed = gradtx.pack({"w": jnp.ones(3), "b": jnp.zeros(2)})
    with pytest.raises(TypeError, match="keeps statistics per path"):
        gradtx.monitor("m").init(packed)
