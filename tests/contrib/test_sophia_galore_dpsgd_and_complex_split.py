"""gradtx.contrib's Simplified AdEMAMix, Sophia, GaLore, DP-SGD, `normalize` and
`split_real_and_imaginary` beyond the contract suite: optax's signatures and defaults, the
published defaults against optax, Hutchinson's estimate on a full Hessian, GaLore's projector
refresh and axes, DP noise and streams, complex leaves split or native, errors.

The contract suite (tests/contract) runs one entry per name of these families.
"""

from __future__ import annotations

import inspect
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest
import references.contrib_adam_family as rca
import references.contrib_orthogonal as ror
import test_contract as tc
from optax.contrib import _sophia as optax_sophia
from registry import CONTRIB

import gradtx
from gradtx import contrib

NAMES = (
    "simplified_ademamix",
    "scale_by_simplified_ademamix",
    "sophia",
    "scale_by_sophia",
    "hutchinson_estimator_diag_hessian",
    "galore",
    "scale_by_galore",
    "dpsgd",
    "differentially_private_aggregate",
    "normalize",
    "split_real_and_imaginary",
)


def _f(x: float) -> np.float32:
    return np.float32(x)


def _close(got: Any, want: Any, rtol: float = 1e-5) -> None:
    """Leaves equal within `rtol` of each leaf's largest magnitude."""
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        wide = np.complex128 if jnp.iscomplexobj(x) else np.float64
        x, y = np.asarray(x, wide), np.asarray(y, wide)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * float(np.max(np.abs(y))))


def _run(tx: Any, oracle: Any, params: Any, grads: list, **extra: Any) -> None:
    """gradtx and optax side by side from the same params, their updates compared."""
    state, o_state = tx.init(params), oracle.init(params)
    p, po = params, params
    for g in grads:
        u, state = tx.update(g, state, p, **extra)
        with jax.numpy_dtype_promotion("standard"):
            uo, o_state = oracle.update(g, o_state, po, **extra)
        _close(u, uo)
        p, po = gradtx.apply_updates(p, u), optax.apply_updates(po, uo)


def _grads(params: Any, n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [
        jax.tree.map(lambda x: jnp.asarray(rng.normal(size=np.shape(x)), x.dtype), params)
        for _ in range(n)
    ]


# --- coverage and signatures ---------------------------------------------------------------------


def test_one_registry_entry_per_name():
    names = [e.name for e in CONTRIB if e.name.removeprefix("contrib.") in NAMES]
    assert sorted(names) == sorted(f"contrib.{n}" for n in NAMES)
    assert set(NAMES) <= set(contrib.__all__)


@pytest.mark.parametrize("name", NAMES)
def test_optax_arguments_and_defaults(name):
    """The arguments, their order and their defaults are optax 0.2.8's (a default optax
    gives as an object, the Hessian estimator, is `None` here and means the same)."""
    theirs = getattr(optax.contrib, name, None) or getattr(optax_sophia, name)
    mine = inspect.signature(getattr(contrib, name)).parameters
    for (a, p), (b, q) in zip(mine.items(), inspect.signature(theirs).parameters.items()):
        assert a == b
        if name.endswith("sophia") and a == "hessian_diagonal_fn":
            assert p.default is None
            continue
        assert p.default == q.default, a
    assert len(mine) == len(inspect.signature(theirs).parameters)


# --- Simplified AdEMAMix -------------------------------------------------------------------------


def test_simplified_ademamix_defaults_match_optax_and_the_reference():
    params = {"w": jnp.asarray([[0.5, -1.0], [2.0, 0.1]]), "b": jnp.asarray([0.3, -0.2])}
    grads = _grads(params, 8)
    oracle = optax.contrib.simplified_ademamix(
        _f(0.01), b1=_f(0.99), b2=_f(0.95), alpha=_f(0.0), eps=_f(1e-8), eps_root=_f(0.0)
    )
    _run(contrib.simplified_ademamix(0.01), oracle, params, grads)
    tx, reference = contrib.scale_by_simplified_ademamix(), rca.scale_by_simplified_ademamix()
    state, r_state = tx.init(params), reference.init(gradtx.paths.leaves(params))
    for g in grads:
        u, state = tx.update(g, state)
        want, r_state = reference.update(gradtx.paths.leaves(g), r_state, {})
        _close(gradtx.paths.leaves(u), want)


# --- Sophia --------------------------------------------------------------------------------------

A = np.array([[2.0, 0.5, 0.0], [0.5, 1.0, -0.3], [0.0, -0.3, 3.0]])


def _objective(p: Any) -> jax.Array:
    w = p["w"]
    return 0.5 * w @ jnp.asarray(A, jnp.float32) @ w + jnp.sum(p["b"] ** 4)


def test_hutchinson_is_hvp_times_the_documented_signs():
    """(H r) * r with r drawn from each path's stream: fold_in(key, crc32(path)), split."""
    params = {"w": jnp.asarray([1.0, -1.0, 0.5]), "b": jnp.asarray([0.5, -2.0])}
    tx = contrib.hutchinson_estimator_diag_hessian(7)
    state = tx.init(params)
    for _ in range(3):
        h, state = tx.update(params, state, params, obj_fn=_objective)
    # The third draw of each stream, by hand.
    signs = {}
    for path, n in (("w", 3), ("b", 2)):
        key = jax.random.fold_in(jax.random.key(7), zlib.crc32(path.encode()))
        for _ in range(3):
            key, sample = jax.random.split(key)
        signs[path] = np.asarray(jax.random.rademacher(sample, (n,), jnp.float32), np.float64)
    b = np.asarray(params["b"], np.float64)
    want_w = (A @ signs["w"]) * signs["w"]
    want_b = (12 * b**2 * signs["b"]) * signs["b"]
    _close(h["w"], want_w)
    _close(h["b"], want_b)


def test_hutchinson_is_unbiased_and_skips_absent_paths():
    params = {"w": jnp.asarray([1.0, -1.0, 0.5]), "b": jnp.asarray([0.5, -2.0])}
    tx = contrib.hutchinson_estimator_diag_hessian(0)

    @jax.jit
    def mean_estimate(state):
        def body(state, _):
            h, state = tx.update({"w": params["w"], "b": None}, state, params, obj_fn=_objective)
            return state, h["w"]

        state, hs = jax.lax.scan(body, state, None, length=4000)
        return jnp.mean(hs, axis=0), state

    state = tx.init(params)
    mean, new = mean_estimate(state)
    np.testing.assert_allclose(np.asarray(mean), np.diag(A), atol=0.05)
    np.testing.assert_array_equal(new["key"]["b"], state["key"]["b"])  # no gradient: no draw


def test_sophia_defaults_match_optax_where_the_estimate_is_exact():
    """On a separable objective the Hessian is diagonal and Hutchinson's estimate exact, so
    optax's other random signs give the same steps."""

    def separable(p: Any) -> jax.Array:
        return jnp.sum(jnp.linspace(0.5, 2.0, 6).reshape(2, 3) * p["w"] ** 2) + jnp.sum(p["b"] ** 4)

    params = {"w": jnp.asarray([[1.0, -2.0, 0.5], [0.3, 1.5, -1.0]]), "b": jnp.asarray([0.7])}
    grads = [jax.grad(separable)(params)] * 12
    oracle = optax.contrib.sophia(
        _f(0.1), b1=_f(0.965), b2=_f(0.99), eps=_f(1e-8), weight_decay=_f(1e-4), gamma=_f(0.01)
    )
    _run(contrib.sophia(0.1), oracle, params, grads, obj_fn=separable)


def test_sophia_estimates_every_update_interval_steps_and_clips():
    params = {"w": jnp.asarray([1.0, -1.0, 0.5]), "b": jnp.asarray([0.5, -2.0])}
    tx = contrib.scale_by_sophia(b2=0.5, update_interval=3)
    state = tx.init(params)
    seen = []
    for _ in range(7):
        grads = jax.grad(_objective)(params)
        u, state = tx.update(grads, state, params, obj_fn=_objective)
        seen.append(np.asarray(state["nu"]["w"]))
        assert float(jnp.max(jnp.abs(u["w"]))) <= 1.0
    changed = [not np.array_equal(a, b) for a, b in zip(seen, seen[1:])]
    assert changed == [False, False, True, False, False, True]  # steps 4 and 7 refresh


def test_sophia_prints_its_win_rate(capfd):
    params = {"w": jnp.asarray([1.0, -1.0, 0.5]), "b": jnp.asarray([0.5, -2.0])}
    tx = contrib.scale_by_sophia(verbose=True, print_win_rate_every_n_steps=1)
    tx.update(jax.grad(_objective)(params), tx.init(params), params, obj_fn=_objective)
    jax.effects_barrier()
    assert "Sophia optimizer win rate: 0.0" in capfd.readouterr().out


def test_sophia_errors():
    params = {"w": jnp.ones(3), "b": jnp.ones(2)}
    tx = contrib.sophia(0.1)
    with pytest.raises(ValueError, match="obj_fn"):
        tx.update(params, tx.init(params), params)
    with pytest.raises(ValueError, match="needs the params"):
        tx.update(params, tx.init(params), obj_fn=_objective)
    with pytest.raises(ValueError, match="update_interval"):
        contrib.sophia(0.1, update_interval=0)
    with pytest.raises(ValueError, match="print_win_rate_every_n_steps"):
        contrib.scale_by_sophia(verbose=True)
    with pytest.raises(ValueError, match="`b1`"):
        contrib.sophia(0.1, b1=1.5)
    with pytest.raises(TypeError, match="packed params"):
        tx.init(gradtx.pack(params))


def test_sophia_treats_a_complex_leaf_as_its_pair_of_reals():
    """A complex leaf gives what its real view `stack([re, im])` gives, the Hessian estimate
    included (a sign per part; `jax.grad` at a complex leaf is `df/dre - i df/dim`)."""
    w = jnp.asarray([1.0 - 0.5j, -1.0 + 2.0j, 0.5 + 0.1j], jnp.complex64)
    b = jnp.asarray([0.5, -2.0])

    def real_view_objective(p: Any) -> jax.Array:
        x = p["w"].reshape(6)  # re then im
        return 0.5 * x @ jnp.asarray(np.kron(np.eye(2), A), jnp.float32) @ x + jnp.sum(p["b"] ** 4)

    def complex_objective(p: Any) -> jax.Array:
        return real_view_objective({"w": jnp.stack([p["w"].real, p["w"].imag]), "b": p["b"]})

    tx = contrib.sophia(0.1, update_interval=2)
    # The same path, so the same random stream: a sign per element of the real view.
    zp, xp = {"w": w, "b": b}, {"w": jnp.stack([w.real, w.imag]), "b": b}
    zs, xs = tx.init(zp), tx.init(xp)
    for _ in range(4):
        g = jax.grad(complex_objective)(zp)
        zu, zs = tx.update({"w": jnp.conj(g["w"]), "b": g["b"]}, zs, zp, obj_fn=complex_objective)
        xu, xs = tx.update(jax.grad(real_view_objective)(xp), xs, xp, obj_fn=real_view_objective)
        _close(jnp.stack([zu["w"].real, zu["w"].imag]), xu["w"], rtol=1e-6)
        _close(zs["nu"]["w"], xs["nu"]["w"], rtol=1e-6)
        zp, xp = gradtx.apply_updates(zp, zu), gradtx.apply_updates(xp, xu)


# --- GaLore --------------------------------------------------------------------------------------


def _adam() -> Any:
    return optax.scale_by_adam(b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8))


def test_galore_refreshes_its_projector_like_optax():
    """With a gap of 2 the SVD runs at steps 1, 3, 5, ...; JAX's SVD gives gradtx and optax
    the same singular vectors (signs included), so the two agree step by step."""
    rng = np.random.default_rng(0)
    params = {
        "tall": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32),
        "wide": jnp.asarray(rng.normal(size=(2, 4)), jnp.float32),
        "b": jnp.zeros(3),
    }
    tx = contrib.galore(0.1, rank=2, update_proj_gap=2, weight_decay=0.01)
    oracle = optax.contrib.galore(
        _f(0.1), rank=2, update_proj_gap=2, base_optimizer=_adam(), weight_decay=_f(0.01)
    )
    _run(tx, oracle, params, _grads(params, 6))
    state = tx.init(params)
    assert state["projector"]["tall"].shape == (5, 2)
    assert state["projector"]["wide"].shape == (4, 2)
    assert state["base_optimizer"]["mu"]["tall"].shape == (2, 3)
    assert state["base_optimizer"]["mu"]["wide"].shape == (2, 2)


def test_galore_dimension_numbers_match_optax():
    rng = np.random.default_rng(1)
    params = {"attn": jnp.asarray(rng.normal(size=(6, 2, 3)), jnp.float32), "w": jnp.ones((3, 3))}
    dims = contrib.GaLoreDimensionNumbers(reduction_axis=0, output_axis=(1, 2))
    tx = contrib.scale_by_galore(rank=2, weight_dimension_numbers={"attn": dims})
    oracle = optax.contrib.scale_by_galore(
        rank=2,
        base_optimizer=_adam(),
        weight_dimension_numbers={
            "attn": optax.contrib.GaLoreDimensionNumbers(0, (1, 2)),
            "w": None,
        },
    )
    _run(tx, oracle, params, _grads(params, 3))
    assert set(tx.init(params)["projector"]) == {"attn"}  # "w" is not selected


def test_galore_matches_the_reference_with_sgd_inside():
    params = {"m": jnp.asarray(np.random.default_rng(2).normal(size=(4, 3)), jnp.float32)}
    grads = _grads(params, 5)
    tx = contrib.scale_by_galore(rank=1, base_optimizer=gradtx.sgd(1.0, momentum=0.5))
    from references import sgd

    reference = ror.scale_by_galore(rank=1, inner=sgd(1.0, momentum=0.5))
    state, r_state = tx.init(params), reference.init(gradtx.paths.leaves(params))
    for g in grads:
        u, state = tx.update(g, state)
        want, r_state = reference.update(gradtx.paths.leaves(g), r_state, {})
        _close(u["m"], want["m"])


def test_galore_errors():
    with pytest.raises(ValueError, match="`rank`"):
        contrib.galore(0.1, rank=0)
    with pytest.raises(ValueError, match="update_proj_gap"):
        contrib.galore(0.1, update_proj_gap=0)
    dims = contrib.GaLoreDimensionNumbers(0, 0)
    with pytest.raises(ValueError, match="exactly once"):
        contrib.scale_by_galore(weight_dimension_numbers=dims).init({"w": jnp.ones((2, 3))})
    full = contrib.GaLoreDimensionNumbers()
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        contrib.scale_by_galore(weight_dimension_numbers={"b": full}).init({"b": jnp.ones(3)})
    with pytest.raises(ValueError, match="two entries"):
        contrib.scale_by_galore(weight_dimension_numbers={"w": full, "*": full}).init(
            {"w": jnp.ones((2, 3))}
        )
    with pytest.raises(TypeError, match="GaLoreDimensionNumbers"):
        contrib.scale_by_galore(weight_dimension_numbers={"w": (0, 1)})
    with pytest.raises(TypeError, match="complex"):
        contrib.scale_by_galore(weight_dimension_numbers={"z": full}).init(
            {"z": jnp.ones((2, 2), jnp.complex64)}
        )
    with pytest.raises(TypeError, match="packed params"):
        contrib.galore(0.1).init(gradtx.pack({"w": jnp.ones((2, 3))}))


# --- DP-SGD --------------------------------------------------------------------------------------


def _per_example(n: int = 6) -> dict:
    rng = np.random.default_rng(3)
    return {
        "w": jnp.asarray(rng.normal(size=(n, 3, 2)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(n, 2)), jnp.float32),
    }


PARAMS_DP = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}


def test_dp_aggregate_without_noise_matches_optax():
    examples = _per_example()
    tx = contrib.differentially_private_aggregate(1.5, 0.0, key=0)
    u, state = tx.update(examples, tx.init(PARAMS_DP), PARAMS_DP)
    oracle = optax.contrib.differentially_private_aggregate(_f(1.5), _f(0.0), key=0)
    want, _ = oracle.update(examples, oracle.init(PARAMS_DP))
    _close(u, want)
    norms = np.sqrt(sum(np.sum(np.asarray(g).reshape(6, -1) ** 2, 1) for g in examples.values()))
    assert int(state["num_clipped"]) == int(np.sum(norms > 1.5))


def test_dpsgd_without_noise_matches_optax():
    tx = contrib.dpsgd(0.1, 1.0, 0.0, seed=0, momentum=0.9, nesterov=True)
    with pytest.warns(DeprecationWarning):  # optax 0.2.8's `dpsgd` passes on `seed`
        oracle = optax.contrib.dpsgd(
            _f(0.1), _f(1.0), _f(0.0), seed=0, momentum=_f(0.9), nesterov=True
        )
    state, o_state = tx.init(PARAMS_DP), oracle.init(PARAMS_DP)
    for k in range(3):
        examples = jax.tree.map(lambda x, k=k: x * (k + 1), _per_example())
        u, state = tx.update(examples, state, PARAMS_DP)
        with jax.numpy_dtype_promotion("standard"):
            want, o_state = oracle.update(examples, o_state, PARAMS_DP)
        _close(u, want)


def test_dp_noise_has_the_documented_scale_and_streams():
    big = {"w": jnp.zeros((1, 200, 50)), "b": jnp.zeros((1, 3))}
    params = {"w": jnp.zeros((200, 50)), "b": jnp.zeros(3)}
    tx = contrib.differentially_private_aggregate(2.0, 1.5, key=5)
    u, state = tx.update(big, tx.init(params), params)
    assert abs(float(jnp.std(u["w"])) / 3.0 - 1.0) < 0.03  # sigma C / B = 1.5 * 2 / 1
    # The path's stream: fold_in(key, crc32(path)), split, normal.
    key = jax.random.fold_in(jax.random.key(5), zlib.crc32(b"b"))
    _, sample = jax.random.split(key)
    np.testing.assert_allclose(u["b"], 3.0 * jax.random.normal(sample, (3,)), rtol=1e-6)
    # Without the other path the noise of "b" is the same.
    alone, _ = tx.update({"w": None, "b": big["b"]}, tx.init(params), params)
    np.testing.assert_array_equal(alone["b"], u["b"])
    assert alone["w"] is None
    # A second step draws new noise; `seed` is the older name of `key`.
    again, _ = tx.update(big, state, params)
    assert not np.array_equal(again["b"], u["b"])
    old, _ = contrib.differentially_private_aggregate(2.0, 1.5, seed=5).update(
        big, tx.init(params), params
    )
    np.testing.assert_array_equal(old["b"], u["b"])


def test_dp_errors():
    with pytest.raises(ValueError, match="not both"):
        contrib.differentially_private_aggregate(1.0, 1.0, key=1, seed=2)
    with pytest.raises(ValueError, match="l2_norm_clip"):
        contrib.dpsgd(0.1, -1.0, 1.0, seed=0)
    tx = contrib.dpsgd(0.1, 1.0, 1.0, seed=0)
    with pytest.raises(ValueError, match="batch size"):
        tx.update({"w": jnp.ones((4, 3, 2)), "b": jnp.ones((5, 2))}, tx.init(PARAMS_DP))
    with pytest.raises(TypeError, match="packed params"):
        tx.init(gradtx.pack(PARAMS_DP))


# --- normalize -----------------------------------------------------------------------------------


def test_normalize_matches_optax_and_keeps_a_zero_gradient():
    grads = {"a": jnp.asarray([3.0, 0.0]), "b": {"c": jnp.asarray(4.0)}, "d": None}
    tx = contrib.normalize()
    u, _ = tx.update(grads, tx.init(grads))
    want, _ = optax.contrib.normalize().update(grads, None)
    _close(u, want)
    zero, _ = tx.update({"a": jnp.zeros(2)}, {})
    np.testing.assert_array_equal(zero["a"], np.zeros(2))  # optax: NaN
    half, _ = tx.update({"a": jnp.asarray([3.0, 4.0], jnp.bfloat16)}, {})
    assert half["a"].dtype == jnp.bfloat16


# --- split_real_and_imaginary --------------------------------------------------------------------

Z = {"z": jnp.asarray([1.0 + 2.0j, -0.5 + 0.1j, 0.3 - 1.0j]), "r": jnp.asarray([0.5, -1.0])}


def _complex_grads(n: int) -> list:
    rng = np.random.default_rng(4)
    return [
        {
            "z": jnp.asarray(rng.normal(size=3) + 1j * rng.normal(size=3), jnp.complex64),
            "r": jnp.asarray(rng.normal(size=2), jnp.float32),
        }
        for _ in range(n)
    ]


def test_split_matches_optax_and_gradtx_native_pairs_of_reals():
    grads = _complex_grads(5)
    tx = contrib.split_real_and_imaginary(gradtx.adam(0.1))
    oracle = optax.contrib.split_real_and_imaginary(
        optax.adam(_f(0.1), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8))
    )
    _run(tx, oracle, Z, grads)
    native = gradtx.adam(0.1)
    s1, s2 = native.init(Z), tx.init(Z)
    for g in grads:  # elementwise: the two conventions agree
        u1, s1 = native.update(g, s1, Z)
        u2, s2 = tx.update(g, s2, Z)
        np.testing.assert_array_equal(u1["z"], u2["z"])
        assert u2["z"].dtype == jnp.complex64


def test_split_differs_from_native_for_per_leaf_norms():
    """A per-leaf norm sees each part alone when split, the whole complex leaf natively."""
    tx = gradtx.scale_by_trust_ratio()
    g = {"z": jnp.asarray([1.0 + 0.0j, 0.0 + 3.0j])}
    params = {"z": jnp.asarray([2.0 + 0.0j, 0.0 + 1.0j])}
    native, _ = tx.update(g, tx.init(params), params)
    split_tx = contrib.split_real_and_imaginary(tx)
    split, _ = split_tx.update(g, split_tx.init(params), params)
    assert not np.allclose(native["z"], split["z"])


def test_split_keeps_the_state_of_a_leaf_without_gradient():
    tx = contrib.split_real_and_imaginary(gradtx.adam(0.1))
    _, state = tx.update(_complex_grads(1)[0], tx.init(Z), Z)
    for params in (Z, None):
        u, new = tx.update({"z": None, "r": jnp.ones(2)}, state, params)
        assert u["z"] is None
        before, after = gradtx.state_dict(state), gradtx.state_dict(new)
        for key in before:
            if "/z/" in key:
                np.testing.assert_array_equal(after[key], before[key])
        assert int(after["inner/count/r"]) == 2


def test_split_around_an_optax_transformation():
    tx = contrib.split_real_and_imaginary(optax.sgd(_f(0.1)))
    u, _ = tx.update({"z": jnp.asarray([1.0 - 2.0j]), "r": jnp.ones(2)}, tx.init(Z), Z)
    np.testing.assert_allclose(u["z"], np.asarray([-0.1 + 0.2j]), rtol=1e-6)


def test_contract_tree_has_no_complex_leaves():
    """The contract's params are real, where the split changes nothing (hence these tests)."""
    assert not any(jnp.iscomplexobj(x) for x in jax.tree.leaves(tc.PARAMS))
