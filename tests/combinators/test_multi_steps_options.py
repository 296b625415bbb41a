"""`multi_steps` with optax's options: a scheduled k, skip predicates, sums, `has_updated`.

Checked against the NumPy reference of tests/contract/references/wrappers.py and against
`optax.MultiSteps` (a second oracle); `accumulate` itself is in test_accumulate.py.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import references as ref
import references.wrappers as rh

import gradtx
from gradtx import schedules

PARAMS = {"enc": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}, "s": jnp.ones(()), "frozen": None}
RNG = np.random.default_rng(0)
GRADS = [
    {
        "enc": {
            "w": jnp.asarray(RNG.normal(size=(2, 3)), jnp.float32),
            "b": jnp.asarray(RNG.normal(size=3), jnp.float32),
        },
        "s": jnp.asarray(RNG.normal(), jnp.float32),
        "frozen": None,
    }
    for _ in range(14)
]
NAN_CALLS = (2, 9)  # calls whose gradient holds a NaN (or, below, an infinity)


def _with_bad_values(k: int, grads: dict) -> dict:
    if k == NAN_CALLS[0]:
        return {**grads, "enc": {**grads["enc"], "w": grads["enc"]["w"].at[0, 1].set(jnp.nan)}}
    if k == NAN_CALLS[1]:
        return {**grads, "s": jnp.asarray(jnp.inf)}
    return grads


SEQUENCE = [_with_bad_values(k, g) for k, g in enumerate(GRADS)]


def every_k(step: Any) -> Any:
    """1 call for the first optimizer step, 2 for the next two, then 3."""
    return jnp.where(step < 1, 1, jnp.where(step < 3, 2, 3))


def every_k_ref(t: int) -> int:
    return 1 if t < 1 else 2 if t < 3 else 3


def flat(tree: Any) -> dict[str, np.ndarray]:
    return {
        p: np.asarray(x, np.float64) for p, x in gradtx.paths.leaves(tree).items() if x is not None
    }


def run(tx: Any, sequence: list, jit: bool = True) -> tuple[list, list, Any]:
    """Updates, `has_updated` after each call, and the last state."""
    state = tx.init(PARAMS)
    step = jax.jit(tx.update) if jit else tx.update
    history, updated = [], []
    for grads in sequence:
        u, state = step(grads, state, PARAMS)
        history.append(u)
        updated.append(bool(gradtx.has_updated(state)))
    return history, updated, state


def run_optax(ms: optax.MultiSteps, sequence: list) -> tuple[list, list]:
    state = ms.init(PARAMS)
    history, updated = [], []
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int counts and floats
        for grads in sequence:
            u, state = ms.update(grads, state, PARAMS)
            history.append(u)
            updated.append(bool(ms.has_updated(state)))
    return history, updated


def run_reference(reference: ref.Reference, sequence: list) -> list:
    state = reference.init(flat(PARAMS))
    history = []
    for grads in sequence:
        u, state = reference.update(flat(grads), state, flat(PARAMS))
        history.append(u)
    return history


def _as_flat(x: dict) -> dict[str, np.ndarray]:
    """A reference's `{path: array}` as it is; a tree of updates flattened by path."""
    return x if all(isinstance(v, np.ndarray) for v in x.values()) else flat(x)


def assert_updates_close(history: list, want: list, rtol: float = 1e-6) -> None:
    for k, (got, expected) in enumerate(zip(history, want)):
        got, expected = _as_flat(got), _as_flat(expected)
        assert sorted(got) == sorted(expected), k
        for path in got:
            np.testing.assert_allclose(
                got[path], expected[path], rtol=rtol, atol=1e-7, err_msg=f"call {k}, {path}"
            )


# --- a scheduled k, skips and sums, against the reference and optax -----------------------------


@pytest.mark.parametrize("use_grad_mean", [True, False], ids=["mean", "sum"])
def test_scheduled_k_and_skipped_micro_steps(use_grad_mean):
    """k = 1, 2, 2, 3, ... optimizer by optimizer; the NaN and the infinity are skipped."""
    tx = gradtx.multi_steps(
        gradtx.sgd(0.1, momentum=0.9),
        every_k_schedule=every_k,
        should_skip_update_fn=gradtx.skip_not_finite,
        use_grad_mean=use_grad_mean,
    )
    history, updated, state = run(tx, SEQUENCE)

    reference = rh.multi_steps(
        ref.sgd(0.1, momentum=0.9), every_k_ref, rh.any_not_finite, use_grad_mean
    )
    assert_updates_close(history, run_reference(reference, SEQUENCE))

    ms = optax.MultiSteps(
        optax.sgd(0.1, momentum=0.9),
        every_k_schedule=every_k,
        use_grad_mean=use_grad_mean,
        should_skip_update_fn=optax.skip_not_finite,
    )
    o_history, o_updated = run_optax(ms, SEQUENCE)
    assert_updates_close(history, o_history)
    assert updated == o_updated
    # calls 0 | 1 (2: NaN) 3 | 4 5 | 6 7 8 (9: inf) | 10 11 12 | 13
    assert [k for k, done in enumerate(updated) if done and k not in NAN_CALLS] == [0, 3, 5, 8, 12]
    assert int(state["gradient_step"]) == 5 and int(state["micro_step"]) == 1
    assert int(state["skip_state"]["num_not_finite"]) == 0


def test_a_skipped_call_changes_nothing_but_the_skip_state():
    tx = gradtx.multi_steps(
        gradtx.adam(0.1), every_k_schedule=3, should_skip_update_fn=gradtx.skip_not_finite
    )
    state = tx.init(PARAMS)
    _, state = tx.update(GRADS[0], state, PARAMS)
    u, new = jax.jit(tx.update)(SEQUENCE[2], state, PARAMS)
    assert all(not np.any(x) for x in flat(u).values())
    assert bool(new["skip_state"]["should_skip"]) and int(new["skip_state"]["num_not_finite"]) == 1
    before, after = gradtx.state_dict(state), gradtx.state_dict(new)
    for key in before:
        if not key.startswith("skip_state/"):
            np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_skip_large_updates_through_partial():
    """A micro-step whose squared norm reaches the bound is left out of the mean."""
    skip = functools.partial(gradtx.skip_large_updates, max_squared_norm=4.0)
    tx = gradtx.multi_steps(gradtx.sgd(1.0), 2, should_skip_update_fn=skip)
    params = {"w": jnp.zeros(2)}
    state = tx.init(params)
    outs = []
    for g in ([1.0, 1.0], [3.0, 0.0], [0.0, 1.0]):
        u, state = tx.update({"w": jnp.asarray(g)}, state)
        outs.append(np.asarray(u["w"]))
        norm = float(state["skip_state"]["norm_squared"])
        np.testing.assert_allclose(norm, np.sum(np.square(g)))
    np.testing.assert_array_equal(outs[1], [0.0, 0.0])  # 9 >= 4: skipped, the cycle waits
    np.testing.assert_allclose(outs[2], [-0.5, -1.0])  # the mean of the first and third

    ms = optax.MultiSteps(
        optax.sgd(1.0),
        2,
        should_skip_update_fn=functools.partial(optax.skip_large_updates, max_squared_norm=4.0),
    )
    o_state = ms.init(params)
    with jax.numpy_dtype_promotion("standard"):
        for g in ([1.0, 1.0], [3.0, 0.0], [0.0, 1.0]):
            o_u, o_state = ms.update({"w": jnp.asarray(g)}, o_state)
    np.testing.assert_allclose(o_u["w"], outs[2])


def test_int_schedule_is_accumulate_and_every_is_its_other_name():
    a = gradtx.multi_steps(gradtx.sgd(0.1), 3)
    b = gradtx.multi_steps(gradtx.sgd(0.1), every=3)
    c = gradtx.accumulate(gradtx.sgd(0.1), every=3)
    assert jax.tree.structure(a) == jax.tree.structure(b) == jax.tree.structure(c)
    assert sorted(gradtx.state_dict(a.init(PARAMS))) == sorted(gradtx.state_dict(c.init(PARAMS)))
    assert "gradient_step" not in a.init(PARAMS)  # the plain layout, as `accumulate`'s


def test_schedules_and_floats_give_k():
    """A gradtx schedule is a pytree (its numbers are leaves); floats round to the nearest int."""
    sched = schedules.piecewise_constant(2.0, {1: 1.5})  # 2, then 3
    tx = gradtx.multi_steps(gradtx.sgd(1.0), every_k_schedule=sched)
    assert any(isinstance(x, (np.ndarray, np.generic, jax.Array)) for x in jax.tree.leaves(tx))
    params = {"w": jnp.zeros(1)}
    state = tx.init(params)
    fired = []
    for _ in range(8):
        _, state = tx.update({"w": jnp.ones(1)}, state)
        fired.append(bool(gradtx.has_updated(state)))
    assert [k for k, f in enumerate(fired) if f] == [1, 4, 7]
    described = tx.describe(params, step=2)
    assert described["w"][0] == ("accumulate", {"every": 3})


def test_one_compilation_for_every_step_and_for_an_equal_transformation():
    traces = []

    @jax.jit
    def step(tx, state, grads):
        traces.append(1)
        return tx.update(grads, state, PARAMS)

    def make(lr):
        return gradtx.multi_steps(
            gradtx.sgd(lr),
            every_k_schedule=schedules.piecewise_constant(1.0, {2: 2.0}),
            should_skip_update_fn=gradtx.skip_not_finite,
        )

    state = make(0.1).init(PARAMS)
    for k, grads in enumerate(SEQUENCE[:6]):
        _, state = step(make(0.1 * (k + 1)), state, grads)
    assert len(traces) == 1 and step._cache_size() == 1


def test_inside_scan_equals_eager_calls():
    tx = gradtx.multi_steps(
        gradtx.adam(0.05), every_k_schedule=every_k, should_skip_update_fn=gradtx.skip_not_finite
    )
    stack = jax.tree.map(lambda *xs: jnp.stack(xs), *SEQUENCE)

    @jax.jit
    def scanned(state, stack):
        def body(state, grads):
            u, state = tx.update(grads, state, PARAMS)
            return state, (u, gradtx.has_updated(state))

        return jax.lax.scan(body, state, stack)

    _, (history, updated) = scanned(tx.init(PARAMS), stack)
    e_history, e_updated, _ = run(tx, SEQUENCE, jit=False)
    assert list(np.asarray(updated)) == e_updated
    for k, u in enumerate(e_history):
        for path, x in flat(u).items():
            np.testing.assert_allclose(flat(history)[path][k], x, rtol=1e-6, atol=1e-7)


# --- has_updated --------------------------------------------------------------------------------


def test_has_updated_before_and_after_the_first_step():
    counted = gradtx.multi_steps(gradtx.sgd(0.1), every_k_schedule=lambda step: 2)
    state = counted.init({"w": jnp.zeros(1)})
    assert not bool(gradtx.has_updated(state))  # optax's answer before any call
    plain = gradtx.multi_steps(gradtx.sgd(0.1), 2)
    assert bool(gradtx.has_updated(plain.init({"w": jnp.zeros(1)})))  # no gradient_step kept
    chained = gradtx.chain(gradtx.clip(1.0), plain)
    state = chained.init({"w": jnp.zeros(1)})
    with pytest.raises(KeyError, match=r"has_updated: .*state\['accumulate'\]"):
        gradtx.has_updated(state)
    assert bool(gradtx.has_updated(state["accumulate"]))


# --- the predicates, against NumPy and optax ---------------------------------------------------


def test_skip_not_finite_counts_like_numpy_and_optax():
    tree = {
        "a": jnp.array([1.0, jnp.nan, jnp.inf, -jnp.inf]),
        "b": [jnp.array([[jnp.nan, 2.0]], jnp.bfloat16), None],
        "i": jnp.arange(3),
    }
    skip, aux = gradtx.skip_not_finite(tree, jnp.int32(4), None)
    count = sum(
        int(np.sum(~np.isfinite(np.asarray(x, np.float64)))) for x in (tree["a"], tree["b"][0])
    )
    assert int(aux["num_not_finite"]) == count == 4
    assert bool(skip) and bool(aux["should_skip"])
    assert aux["num_not_finite"].dtype == jnp.int32 and skip.dtype == jnp.bool_
    o_skip, o_aux = optax.skip_not_finite(tree, jnp.int32(4), None)
    assert bool(o_skip) and int(o_aux["num_not_finite"]) == count
    skip, aux = jax.jit(gradtx.skip_not_finite)({"a": jnp.ones(2)}, 0, None)
    assert not bool(skip) and int(aux["num_not_finite"]) == 0


@pytest.mark.parametrize("bound", [24.9, 25.0, 26.0])
def test_skip_large_updates_against_numpy_and_optax(bound):
    tree = {"w": jnp.array([3.0, 0.0]), "b": [jnp.array(4.0, jnp.bfloat16), None]}
    skip, aux = gradtx.skip_large_updates(tree, 0, None, bound)
    want = 3.0**2 + 4.0**2
    np.testing.assert_allclose(float(aux["norm_squared"]), want)
    assert bool(skip) == (not want < bound)
    assert aux["norm_squared"].dtype == jnp.float32  # accumulated in float32 for bf16 leaves
    with jax.numpy_dtype_promotion("standard"):
        o_skip, o_aux = optax.skip_large_updates(tree, 0, None, bound)
    assert bool(o_skip) == bool(skip)
    nan = gradtx.skip_large_updates({"w": jnp.array([jnp.nan])}, 0, None, 1.0)[0]
    assert bool(nan)  # a NaN norm is not below the bound


def test_packed_params_and_predicates():
    packed = gradtx.pack({"w": jnp.ones(3), "b": jnp.zeros(2)})
    tx = gradtx.multi_steps(gradtx.sgd(1.0), 2, should_skip_update_fn=gradtx.skip_not_finite)
    state = tx.init(packed)
    bad = packed.replace((packed.buffers[0].at[0].set(jnp.nan),))
    u, state = tx.update(bad, state)
    assert int(state["skip_state"]["num_not_finite"]) == 1 and int(state["micro_step"]) == 0
    _, state = tx.update(packed, state)
    u, state = tx.update(packed, state)
    np.testing.assert_allclose(u.buffers[0], -np.asarray(packed.buffers[0]))


# --- errors -------------------------------------------------------------------------------------


def not_a_bool(updates: Any, gradient_step: Any, params: Any) -> tuple:
    return jnp.int32(1), {}


def test_argument_errors():
    sgd = gradtx.sgd(0.1)
    with pytest.raises(ValueError, match="every_k_schedule` must be an integer >= 1"):
        gradtx.multi_steps(sgd, every_k_schedule=0)
    with pytest.raises(ValueError, match="`every` must be an integer >= 1"):
        gradtx.multi_steps(sgd, every=-1)
    with pytest.raises(ValueError, match="every_k_schedule` must be an integer >= 1 or a schedule"):
        gradtx.multi_steps(sgd, every_k_schedule=2.0)
    with pytest.raises(TypeError, match="not both"):
        gradtx.multi_steps(sgd, 2, every=2)
    with pytest.raises(TypeError, match="missing `every_k_schedule`"):
        gradtx.multi_steps(sgd)
    with pytest.raises(TypeError, match="should_skip_update_fn` must be a function"):
        gradtx.multi_steps(sgd, 2, should_skip_update_fn="finite")
    with pytest.raises(TypeError, match="use_grad_mean"):
        gradtx.multi_steps(sgd, 2, use_grad_mean=1)
    with pytest.raises(ValueError, match="should_skip_update_fn` must return .* bool scalar"):
        gradtx.multi_steps(sgd, 2, should_skip_update_fn=not_a_bool).init({"w": jnp.ones(1)})
    tx = gradtx.multi_steps(sgd, every_k_schedule=every_k)
    with pytest.raises(KeyError, match="gradient_step"):
        tx.update({"w": jnp.ones(1)}, {"micro_step": 0, "acc": {}, "inner": {}})


# --- the updates have the inner optimizer's dtype --------------------------------------------

INNER = {
    "adam": lambda: gradtx.adam(0.1),
    "adam-f32-mu": lambda: gradtx.adam(0.1, mu_dtype=jnp.float32),
    "sgd": lambda: gradtx.sgd(0.1),
    "clip-adam": lambda: gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1)),
}


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("inner", sorted(INNER))
def test_updates_have_the_inner_optimizers_dtype(inner, dtype, k):
    """After k equal gradients the mean is that gradient, so the wrapper's updates equal the
    inner optimizer's in value (within an ulp of the update's dtype: XLA may divide the sum by
    k as a product with 1/k) and in dtype: bf16 for Adam on bf16 params (bf16 moments),
    float32 with float32 moments. The zeros of the calls that take no step have that dtype
    too, and so do the updates of an accumulating step inside a chain (the accumulators,
    float32 for bf16 params, are not a state the updates read)."""
    rtol = 2.0**-7 if dtype == jnp.bfloat16 else 1e-6
    params = {"w": jnp.asarray([1.0, -2.0, 0.5], dtype), "b": jnp.zeros((), dtype)}
    g = {"w": jnp.asarray([0.375, -1.25, 2.0], dtype), "b": jnp.asarray(-0.5, dtype)}
    plain = INNER[inner]()
    want, _ = plain.update(g, plain.init(params), params)
    for tx in (
        gradtx.multi_steps(INNER[inner](), every_k_schedule=k),
        gradtx.accumulate(INNER[inner](), k),
        gradtx.chain(gradtx.scale(1.0), gradtx.accumulate(INNER[inner](), k)),
    ):
        step = jax.jit(tx.update)
        state = tx.init(params)
        for call in range(k):
            u, state = step(g, state, params)
            for path in ("w", "b"):
                assert u[path].dtype == want[path].dtype, (call, path, u[path].dtype)
        for path in ("w", "b"):
            np.testing.assert_allclose(
                np.asarray(u[path], np.float32), np.asarray(want[path], np.float32), rtol=rtol
            )
    if dtype == jnp.bfloat16 and inner != "adam-f32-mu":
        assert want["w"].dtype == jnp.bfloat16
