"""`apply_if_finite`: skipped steps leave no trace; the rest is the contract suite."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compiled import donated_step_program

import gradtx
from gradtx import schedules

PARAMS = {"w": jnp.array([1.0, -2.0, 0.5]), "b": jnp.array(0.3), "n": None}
RNG = np.random.default_rng(0)
GRADS = [
    {"w": jnp.asarray(RNG.normal(size=3), jnp.float32), "b": jnp.float32(RNG.normal()), "n": None}
    for _ in range(5)
]
NAN_GRAD = {"w": jnp.array([1.0, jnp.nan, 0.0]), "b": jnp.float32(0.5), "n": None}


def make(check_updates: bool = True) -> gradtx.Transformation:
    adam = gradtx.adam(schedules.linear(0.1, 0.01, 10))
    return gradtx.apply_if_finite(adam, 3, check_updates=check_updates)


CHECKS = pytest.mark.parametrize("check_updates", [True, False], ids=["updates", "gradients"])


@jax.jit
def step(tx, params, state, grads):
    u, state = tx.update(grads, state, params)
    return gradtx.apply_updates(params, u), state, u


def run(tx, grads_seq):
    params, state = PARAMS, tx.init(PARAMS)
    history = []
    for g in grads_seq:
        params, state, u = step(tx, params, state, g)
        history.append(u)
    return params, state, history


def assert_bitwise_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@CHECKS
def test_a_nan_step_is_as_if_the_batch_was_never_seen(check_updates):
    tx = make(check_updates)
    skipped_at_2 = GRADS[:2] + [NAN_GRAD] + GRADS[2:4]
    params, state, history = run(tx, skipped_at_2)
    ref_params, ref_state, _ = run(tx, GRADS[:4])

    assert_bitwise_equal(params, ref_params)
    assert_bitwise_equal(state["inner"], ref_state["inner"])  # moments, counts, schedule counts
    flat = gradtx.state_dict(state)
    assert int(flat["inner/count/w"]) == 4 and int(flat["inner/schedule_count/b"]) == 4
    assert int(flat["total_notfinite"]) == 1 and int(flat["notfinite_count"]) == 0
    assert bool(flat["last_finite"])
    # the skipped step's updates are zeros, None leaves stay None
    np.testing.assert_array_equal(history[2]["w"], np.zeros(3, np.float32))
    assert history[2]["n"] is None and float(history[2]["b"]) == 0.0


@CHECKS
def test_counts_after_a_nan_step_are_readable(check_updates):
    tx = make(check_updates)
    _, state, _ = run(tx, GRADS[:1] + [NAN_GRAD])
    flat = gradtx.state_dict(state)
    assert int(flat["notfinite_count"]) == 1 and int(flat["total_notfinite"]) == 1
    assert not bool(flat["last_finite"])
    assert int(flat["inner/count/w"]) == 1


def test_a_non_finite_update_from_a_finite_gradient_is_skipped():
    tx = gradtx.apply_if_finite(gradtx.chain(gradtx.trace(0.5), gradtx.scale(1e30)), 1)
    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    u, new = tx.update({"w": jnp.array([1e10, 1.0])}, state)  # 1e40 overflows to inf
    np.testing.assert_array_equal(u["w"], [0.0, 0.0])
    assert_bitwise_equal(new["inner"], state["inner"])
    assert int(new["notfinite_count"]) == 1


def test_checking_the_gradients_alone_applies_an_update_that_overflows():
    """`check_updates=False` is optax's check: finite gradients take the step, even one
    whose update overflows inside the inner transformation."""
    inner = gradtx.chain(gradtx.trace(0.5), gradtx.scale(1e30))
    tx = gradtx.apply_if_finite(inner, 1, check_updates=False)
    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    u, new = tx.update({"w": jnp.array([1e10, 1.0])}, state)
    assert np.isinf(np.asarray(u["w"][0])) and float(u["w"][1]) == float(np.float32(1e30))
    assert int(new["notfinite_count"]) == 0 and bool(new["last_finite"])
    u, new = tx.update({"w": jnp.array([jnp.nan, 1.0])}, new)  # a NaN gradient is skipped
    np.testing.assert_array_equal(u["w"], [0.0, 0.0])
    assert int(new["notfinite_count"]) == 1 and not bool(new["last_finite"])


@pytest.mark.parametrize(
    "make, elementwise",
    [
        (lambda: gradtx.adam(1e-3), True),
        (lambda: gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(1e-3)), False),
    ],
    ids=["adam", "clip-adam"],
)
def test_a_step_that_is_checked_first_writes_the_inner_state_in_place(make, elementwise):
    """Where the verdict comes before the inner step runs, a cond runs it and the donated
    step keeps no second copy of Adam's moments to choose from: always when the gradients
    alone are checked, and when the updates are checked too of an elementwise step (computed
    once for the check alone, writing nothing). Other steps keep their new state aside until
    the check, so their program writes more arrays of the leaf's size."""
    params = {"w": jnp.zeros((256, 256))}

    def leaf_sized_arrays(check_updates: bool) -> int:
        tx = gradtx.apply_if_finite(make(), 3, check_updates=check_updates)
        return donated_step_program(tx, params, params).count("= f32[256,256]")

    if elementwise:
        assert leaf_sized_arrays(False) == leaf_sized_arrays(True)
    else:
        assert leaf_sized_arrays(False) < leaf_sized_arrays(True)


@CHECKS
@pytest.mark.parametrize("max_errors", [0, 2])
def test_max_consecutive_errors_then_the_step_is_applied(max_errors, check_updates):
    """Up to `max_errors` non-finite steps in a row are skipped, the next one is applied as it
    is (NaN included); a finite step resets the run. Same as optax, step by step, for an
    inner transformation whose state a NaN cannot poison (a schedule's step count)."""
    decay = schedules.exponential_decay(1.0, 1, 0.5)
    tx = gradtx.apply_if_finite(gradtx.scale_by_schedule(decay), max_errors, check_updates)
    oracle = optax.apply_if_finite(
        optax.scale_by_schedule(optax.exponential_decay(1.0, 1, np.float32(0.5))), max_errors
    )
    nan = {"w": jnp.array([jnp.nan, 1.0])}
    ok = {"w": jnp.array([1.0, 2.0])}
    params = {"w": jnp.zeros(2)}
    state, o_state = tx.init(params), oracle.init(params)
    applied = []
    for g in [ok, nan, nan, nan, ok, nan]:
        u, state = jax.jit(tx.update)(g, state)
        with jax.numpy_dtype_promotion("standard"):
            o_u, o_state = oracle.update(g, o_state)
        np.testing.assert_array_equal(u["w"], o_u["w"])
        assert int(state["inner"]["schedule_count"]["w"]) == int(o_state.inner_state.count)
        assert int(state["notfinite_count"]) == int(o_state.notfinite_count)
        assert int(state["total_notfinite"]) == int(o_state.total_notfinite)
        assert bool(state["last_finite"]) == bool(o_state.last_finite)
        applied.append(bool(np.any(u["w"] != 0)))
    # with max_errors=2, the third NaN step in a row goes through, a lone one does not
    expected = {0: [True] * 6, 2: [True, False, False, True, True, False]}
    assert applied == expected[max_errors]
    assert int(state["total_notfinite"]) == 4


def test_a_state_poisoned_by_an_applied_nan_keeps_counting():
    """Unlike optax, the output updates are checked too: once a NaN went into a momentum
    buffer (max_consecutive_errors=0), the later steps' updates are NaN and are counted."""
    tx = gradtx.apply_if_finite(gradtx.sgd(0.1, momentum=0.9), 0)
    state = tx.init({"w": jnp.zeros(2)})
    _, state = tx.update({"w": jnp.array([jnp.nan, 1.0])}, state)
    u, state = tx.update({"w": jnp.array([1.0, 1.0])}, state)  # applied: count 2 > 0
    assert bool(jnp.isnan(u["w"][0])) and not bool(state["last_finite"])
    assert int(state["notfinite_count"]) == 2 and int(state["total_notfinite"]) == 2


@CHECKS
def test_inside_scan_equals_the_eager_run(check_updates):
    tx = make(check_updates)
    seq = GRADS[:2] + [NAN_GRAD] + GRADS[2:4]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *seq)

    @jax.jit
    def scanned(params, state, stack):
        def body(carry, g):
            params, state = carry
            u, state = tx.update(g, state, params)
            return (gradtx.apply_updates(params, u), state), None

        return jax.lax.scan(body, (params, state), stack)[0]

    params, state = scanned(PARAMS, tx.init(PARAMS), stacked)
    e_params, e_state, _ = run(tx, seq)
    assert_bitwise_equal(state, e_state)
    for path in ("w", "b"):
        np.testing.assert_allclose(params[path], e_params[path], rtol=1e-6)


def test_describe_frozen_paths_and_errors():
    tx = make()
    described = tx.describe({"w": jnp.zeros(2)})
    options = {"max_consecutive_errors": 3, "check_updates": True}
    assert described["w"][0] == ("apply_if_finite", options)
    assert [name for name, _ in described["w"][1:]] == ["scale_by_adam", "scale_by_learning_rate"]
    assert tx.frozen_paths({"w": jnp.zeros(2)}) == frozenset()
    with pytest.raises(ValueError, match="max_consecutive_errors"):
        gradtx.apply_if_finite(gradtx.sgd(0.1), -1)
    with pytest.raises(TypeError, match="check_updates"):
        gradtx.apply_if_finite(gradtx.sgd(0.1), 1, check_updates="gradients")
    with pytest.raises(KeyError, match="notfinite_count"):
        tx.update({"w": jnp.ones(2)}, {"inner": {}})


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16, jnp.complex64])
def test_all_finite_agrees_with_isfinite_and_writes_no_mask(dtype):
    """One sum per leaf: no boolean array of the leaf's size is written (the mask and its
    reduction were six kernels per leaf)."""
    from gradtx._combinators.finite import all_finite

    cases = ([1.0, -2.0], [1.0, np.inf], [np.nan, 1.0], [-np.inf, 0.0], [6e4, -6e4])
    for values in cases:
        x = jnp.asarray(values).astype(dtype)
        assert bool(all_finite({"a": x, "b": None})) == bool(jnp.all(jnp.isfinite(x))), values
    leaf = jax.ShapeDtypeStruct((1 << 20,), dtype)
    program = jax.jit(all_finite).lower({"w": leaf}).compile().as_text()
    assert "pred[1048576]" not in program


@pytest.mark.parametrize("size", [8, 1 << 16])
def test_the_check_of_computed_updates_agrees_with_isfinite(size):
    """The check reads `g * 0 + u * 0` (0, or NaN where either is not finite). Small leaves
    are summed; large ones are checked through a byte mask, one kernel computing it and one
    reducing it, with no float array of the leaf's size written."""
    from gradtx._combinators.finite import _check_computed

    base = jnp.linspace(-1.0, 1.0, size)
    for bad in (None, np.nan, np.inf, -np.inf):
        x = base if bad is None else base.at[size // 3].set(bad)
        for grads, computed in ((x, base), (base, x)):  # a bad gradient, then a bad update
            checked = _check_computed(
                {"a": grads, "b": None, "c": jnp.ones(3)},
                {"a": computed, "b": None, "c": jnp.zeros(3)},
            )
            assert bool(checked) == (bad is None)
    program = jax.jit(lambda x: _check_computed(x, jnp.sqrt(x))).lower(base).compile().as_text()
    entry = program[program.index("ENTRY") :]
    masked = size >= 1 << 16
    assert (f"u8[{size}]" in entry) == masked
    assert f"f32[{size}]{{0}} fusion(" not in entry


def test_the_check_of_leaves_of_one_shape_is_traced_once():
    """Each leaf's check is a call of one jitted function, traced once for all the leaves of
    one shape and dtype: six leaves make six calls of one jaxpr, and a seventh leaf of
    another shape one more."""
    params = {f"w{i}": jnp.zeros((8, 8)) for i in range(6)} | {"b": jnp.zeros(8)}
    tx = gradtx.apply_if_finite(gradtx.adam(1e-3), 3)
    jaxpr = jax.make_jaxpr(lambda g, s: tx.update(g, s, params))(params, tx.init(params))
    checks = [e for e in jaxpr.jaxpr.eqns if e.params.get("name") == "_leaf_finite"]
    assert len(checks) == 7
    assert len({id(e.params["jaxpr"]) for e in checks}) == 2


@pytest.mark.parametrize("shape, times", [((16, 16), 1), ((256, 256), 2)], ids=["small", "large"])
def test_a_checked_elementwise_step_computes_a_small_leaf_once(shape, times):
    """Adam's square root appears once per small leaf in the donated step's program when its
    updates are checked, as when the gradients alone are: the updates computed for the check
    are the ones taken, and the branch computes the state alone. A large leaf's updates are
    computed again in the branch (the check reads them as a byte mask, on every core)."""
    params = {f"w{i}": jnp.zeros(shape) for i in range(6)}

    def square_roots(check_updates: bool) -> int:
        tx = gradtx.apply_if_finite(gradtx.adam(1e-3), 3, check_updates=check_updates)
        program = donated_step_program(tx, params, params, whole=True)
        return len(re.findall(r"= f32\[[0-9,]+\]\{[0-9,]*\} sqrt\(", program))

    assert square_roots(False) == 6
    assert square_roots(True) == 6 * times
