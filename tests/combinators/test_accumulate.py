"""Gradient accumulation (`accumulate` / `multi_steps`); the rest is the contract suite."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled import FLOAT_ARRAY_COPY, copies_in_called_computations, donated_step_program

import gradtx
from gradtx import schedules

# --- k micro-batches equal one step on the whole batch ------------------------------------------

RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.normal(size=(6, 3)), jnp.float32)
Y = jnp.asarray(RNG.normal(size=(6,)), jnp.float32)
PARAMS = {"w": jnp.asarray(RNG.normal(size=(3,)), jnp.float32), "b": jnp.zeros(()), "n": None}


def loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean squared error over the examples of the batch."""
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def grads(params: dict, x: jax.Array, y: jax.Array) -> dict:
    g = jax.grad(lambda p: loss({**p, "n": None}, x, y))({"w": params["w"], "b": params["b"]})
    return {**g, "n": None}


@pytest.mark.parametrize(
    "make, rtol",
    [(lambda: gradtx.sgd(0.1, momentum=0.9), 1e-6), (lambda: gradtx.adam(0.1), 1e-5)],
    ids=["sgd-momentum", "adam"],
)
def test_micro_batches_equal_one_step_on_the_whole_batch(make, rtol):
    """Three micro-batches of 2 examples then one optimizer step == one step on all 6, for two
    optimizer steps. The gradients differ only by float32 rounding of the mean (summed in
    another order), so updates and state agree within `rtol` (1e-5 for adam, whose update
    divides by sqrt(nu), 1e-6 for sgd)."""
    inner = make()
    tx = gradtx.accumulate(inner, every=3)

    @jax.jit
    def micro_step(params, state, x, y):
        u, state = tx.update(grads(params, x, y), state, params)
        return gradtx.apply_updates(params, u), state, u

    @jax.jit
    def full_step(params, state):
        u, state = inner.update(grads(params, X, Y), state, params)
        return gradtx.apply_updates(params, u), state, u

    params, state = PARAMS, tx.init(PARAMS)
    ref_params, ref_state = PARAMS, inner.init(PARAMS)
    for _ in range(2):
        for j in range(3):
            params, state, u = micro_step(params, state, X[2 * j : 2 * j + 2], Y[2 * j : 2 * j + 2])
            if j < 2:  # no optimizer step yet: zero updates, params unchanged
                np.testing.assert_array_equal(u["w"], np.zeros(3, np.float32))
                assert int(state["micro_step"]) == j + 1
        ref_params, ref_state, ref_u = full_step(ref_params, ref_state)
        for path in ("w", "b"):
            np.testing.assert_allclose(u[path], ref_u[path], rtol=rtol, atol=1e-7)
            np.testing.assert_allclose(params[path], ref_params[path], rtol=rtol, atol=1e-7)
        flat, ref_flat = gradtx.state_dict(state["inner"]), gradtx.state_dict(ref_state)
        assert sorted(flat) == sorted(ref_flat)
        for key in flat:
            np.testing.assert_allclose(flat[key], ref_flat[key], rtol=rtol, atol=1e-7, err_msg=key)
        assert int(state["micro_step"]) == 0
        assert all(not np.any(np.asarray(a)) for a in state["acc"].values())  # reset


def test_inner_schedule_counts_optimizer_steps():
    lr = schedules.linear(1.0, 0.0, 4)  # 1, 0.75, 0.5, ...
    tx = gradtx.accumulate(gradtx.sgd(lr), every=2)
    params = {"w": jnp.zeros(2)}
    state = tx.init(params)
    outs = []
    for g in ([1.0, 2.0], [3.0, 4.0], [1.0, 1.0], [3.0, 3.0]):
        u, state = tx.update({"w": jnp.asarray(g)}, state)
        outs.append(np.asarray(u["w"]))
    np.testing.assert_allclose(outs[1], [-2.0, -3.0])  # lr(0) * mean
    np.testing.assert_allclose(outs[3], [-1.5, -1.5])  # lr(1) * mean
    np.testing.assert_array_equal(outs[0], [0.0, 0.0])
    assert int(state["inner"]["schedule_count"]["w"]) == 2  # optimizer steps, not 4 calls


def test_low_precision_params_accumulate_in_float32():
    """Four bf16 gradients 1, 2^-9, 2^-9, 2^-9: in bf16, 1 + 2^-9 rounds back to 1, so a bf16
    accumulator loses the small ones; float32 keeps them and the mean rounds up."""
    params = {"w": jnp.zeros(1, jnp.bfloat16)}
    sequence = [1.0, 2.0**-9, 2.0**-9, 2.0**-9]

    def run(tx):
        state = tx.init(params)
        for g in sequence:
            u, state = tx.update({"w": jnp.full(1, g, jnp.bfloat16)}, state)
        return u["w"], state

    u, state = run(gradtx.accumulate(gradtx.sgd(1.0), every=4))
    assert state["acc"]["w"].dtype == jnp.float32
    # The exact mean 0.25 + 3 * 2^-11 is rounded once, to the gradient's dtype, before the
    # inner step: 0.25 + 2^-9 in bf16, as SGD's update on bf16 gradients is bf16.
    assert u.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(u, np.float32), [-(0.25 + 2.0**-9)])

    u, state = run(gradtx.accumulate(gradtx.sgd(1.0), every=4, accumulator_dtype="param"))
    assert state["acc"]["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(u, np.float32), [-0.25])

    f16 = gradtx.accumulate(gradtx.sgd(1.0), 2).init({"w": jnp.zeros(1, jnp.float16)})
    f32 = gradtx.accumulate(gradtx.sgd(1.0), 2).init({"w": jnp.zeros(1)})
    asked = gradtx.accumulate(gradtx.sgd(1.0), 2, accumulator_dtype=jnp.bfloat16)
    assert f16["acc"]["w"].dtype == jnp.float32 and f32["acc"]["w"].dtype == jnp.float32
    assert asked.init({"w": jnp.zeros(1)})["acc"]["w"].dtype == jnp.bfloat16


# --- frozen paths -------------------------------------------------------------------------------


class ClaimsFrozen(gradtx.Transformation):
    """A stand-in for a transformation that freezes `frozen`: it says so, and (unlike a real
    one) returns its updates unchanged, so the test sees what it was given."""

    name: ClassVar[str] = "claims_frozen"
    inner: Any = None
    frozen: tuple = ("b",)

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        return self.inner.update(updates, state, params, **extra)

    def frozen_paths(self, params: Any) -> frozenset[str]:
        return frozenset(self.frozen)

    def describe(self, params: Any, step: Any = 0) -> dict:
        return self.inner.describe(params, step)


def test_accumulators_only_for_trainable_paths():
    params = {"w": jnp.zeros(2), "b": jnp.zeros(()), "n": None}
    tx = gradtx.accumulate(ClaimsFrozen(gradtx.identity()), every=2)
    state = tx.init(params)
    assert sorted(gradtx.state_dict(state)) == ["acc/w", "micro_step"]
    assert tx.frozen_paths(params) == frozenset({"b"})

    step = jax.jit(tx.update)
    g1 = {"w": jnp.array([1.0, 2.0]), "b": jnp.array(5.0), "n": None}
    g2 = {"w": jnp.array([3.0, 6.0]), "b": jnp.array(7.0), "n": None}
    u, state = step(g1, state, params)
    assert u["n"] is None and float(u["b"]) == 0.0
    u, state = step(g2, state, params)
    np.testing.assert_array_equal(u["w"], [2.0, 4.0])  # the mean
    assert float(u["b"]) == 7.0  # a frozen path passes its raw gradient to the inner

    # A path that is neither trainable nor frozen has no accumulator: the params changed.
    with pytest.raises(KeyError, match="no accumulator for path 'c'"):
        tx.update({**g1, "c": jnp.ones(1)}, tx.init(params), {**params, "c": jnp.ones(1)})


def test_describe_and_frozen_paths_delegate():
    params = {"w": jnp.zeros(2), "b": jnp.zeros(())}
    tx = gradtx.accumulate(ClaimsFrozen(gradtx.sgd(schedules.linear(1.0, 0.0, 4))), every=2)
    described = tx.describe(params, step=4)  # four calls: the inner is at its step 2
    assert described["w"][0] == ("accumulate", {"every": 2})
    name, hyper = described["w"][-1]
    assert name == "scale_by_learning_rate" and hyper["learning_rate"] == pytest.approx(0.5)
    assert ("accumulate", {"every": 2}) not in described["b"]


# --- composition, None leaves, partial trees ----------------------------------------------------


def test_composes_with_chain():
    tx = gradtx.chain(gradtx.clip(1.0), gradtx.accumulate(gradtx.adam(0.1), every=2))
    params = {"w": jnp.zeros(2)}
    state = tx.init(params)
    assert sorted(gradtx.state_dict(state)) == [
        "accumulate/acc/w",
        "accumulate/inner/count/w",
        "accumulate/inner/mu/w",
        "accumulate/inner/nu/w",
        "accumulate/micro_step",
    ]
    _, state = tx.update({"w": jnp.array([3.0, -0.5])}, state)
    u, state = tx.update({"w": jnp.array([1.0, 0.5])}, state)
    # clipped then averaged: [1, 0] -> adam's first step is -lr * sign
    np.testing.assert_allclose(u["w"], [-0.1, 0.0], atol=1e-6)

    inside = gradtx.accumulate(gradtx.chain(gradtx.clip(1.0), gradtx.sgd(1.0)), every=2)
    state = inside.init(params)
    _, state = inside.update({"w": jnp.array([3.0, -0.5])}, state)
    u, _ = inside.update({"w": jnp.array([1.0, 0.5])}, state)
    np.testing.assert_allclose(u["w"], [-1.0, 0.0])  # mean [2, 0], then clipped


def test_none_and_partial_updates_leave_other_paths_alone():
    params = {"w": jnp.zeros(2), "b": jnp.zeros(1)}
    tx = gradtx.accumulate(gradtx.adam(0.1), every=2)
    state = tx.init(params)
    _, state = tx.update({"w": jnp.ones(2), "b": jnp.ones(1)}, state)
    u, new = tx.update({"w": jnp.ones(2), "b": None}, state)  # fires for w only
    assert u["b"] is None
    np.testing.assert_array_equal(new["acc"]["b"], state["acc"]["b"])  # kept for b
    assert int(new["inner"]["count"]["b"]) == 0 and int(new["inner"]["count"]["w"]) == 1
    u, partial = tx.update({"w": jnp.full(2, 2.0)}, state, partial=True)  # some paths only
    assert set(u) == {"w"}
    np.testing.assert_array_equal(partial["acc"]["b"], state["acc"]["b"])
    np.testing.assert_array_equal(partial["acc"]["w"], [0.0, 0.0])


def test_inner_runs_under_cond_and_state_matches_eagerly():
    tx = gradtx.multi_steps(gradtx.sgd(0.1, momentum=0.9), every=2)
    params = {"w": jnp.ones(3)}
    jaxpr = jax.make_jaxpr(lambda g, s: tx.update(g, s))(params, tx.init(params))
    assert "cond" in str(jaxpr)
    # packed params: one accumulator buffer, same state_dict keys
    packed = gradtx.pack({"w": jnp.ones(3), "v": jnp.ones(2)})
    state = tx.init(packed)
    assert sorted(gradtx.state_dict(state)) == [
        "acc/v",
        "acc/w",
        "inner/trace/v",
        "inner/trace/w",
        "micro_step",
    ]


@pytest.mark.parametrize(
    "make",
    [
        lambda: gradtx.accumulate(gradtx.sgd(0.1, momentum=0.9), every=3),
        lambda: gradtx.accumulate(gradtx.adam(0.1), every=3),
        lambda: gradtx.multi_steps(
            gradtx.adam(0.1), schedules.constant(3.0), should_skip_update_fn=gradtx.skip_not_finite
        ),
    ],
    ids=["sgd-momentum", "adam", "multi_steps-adam-skip"],
)
def test_a_donated_step_copies_no_param_or_state(make):
    """The accumulators are summed and reset outside the cond, in place: returned by a branch,
    every accumulator was copied on every call (around SGD on 3.1M floats, 2.1x optax's
    step). The waiting branch passes the gradients through as its updates, zeroed after the
    cond: one copy of each, which compiled and ran faster than zeros made in the branch."""
    params = {"w": jnp.ones((64, 32)), "b": jnp.ones(32)}
    program = donated_step_program(make(), params, params, whole=True)
    assert FLOAT_ARRAY_COPY.findall(program[program.index("ENTRY") :]) == []
    assert sorted(copies_in_called_computations(program)) == ["g['b']", "g['w']"]


def _prints_its_scale(updates: Any, params: Any) -> Any:
    """An elementwise step that also prints a scalar: an effect, so it must not run on
    every micro-step."""
    jax.debug.print("scale {}", jnp.float32(0.5))
    return jax.tree.map(lambda g: 0.5 * g, updates)


@pytest.mark.parametrize(
    "inner, branches",
    [
        (lambda: gradtx.sgd(0.1), False),
        (lambda: gradtx.sgd(schedules.cosine_decay(0.1, 10)), False),
        (lambda: gradtx.chain(gradtx.clip(0.5), gradtx.scale(-0.1)), False),
        (lambda: gradtx.sgd(0.1, momentum=0.9), True),  # per-element state
        (lambda: gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.sgd(0.1)), True),
        (lambda: gradtx.noisy_sgd(0.1), True),  # random bits
        (lambda: gradtx.chain(gradtx.stateless(_prints_its_scale), gradtx.sgd(0.1)), True),
    ],
    ids=[
        "sgd",
        "sgd-schedule",
        "clip-scale",
        "sgd-momentum",
        "clipped-norm",
        "noisy_sgd",
        "host-callback",
    ],
)
def test_an_elementwise_step_without_arrays_in_its_state_runs_every_call(inner, branches):
    """Such a step is computed on every call and selected, which XLA fuses with the sum and
    the apply; any other runs under a `lax.cond`, only when the cycle is complete."""
    tx = gradtx.accumulate(inner(), every=3)
    params = {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}
    jaxpr = jax.make_jaxpr(lambda g, s: tx.update(g, s, params))(params, tx.init(params))
    assert ("cond[" in str(jaxpr)) is branches


@pytest.mark.parametrize("skip", [None, gradtx.skip_not_finite], ids=["fixed", "skip"])
def test_a_selected_step_equals_the_branched_one(skip):
    """`trace(0.0)` adds nothing to SGD's update but keeps per-element state, so the same
    math runs under the cond: the accumulators and micro-steps agree to the bit, NaN
    micro-steps included, and the params to rounding (XLA may fuse the selected update's
    multiply with the apply's add)."""
    params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(4, 3), "b": jnp.ones(3)}
    selected = gradtx.multi_steps(gradtx.sgd(0.3), 3, should_skip_update_fn=skip)
    inner = gradtx.chain(gradtx.sgd(0.3), gradtx.trace(0.0))
    branched = gradtx.multi_steps(inner, 3, should_skip_update_fn=skip)
    grads = []
    for i in range(7):
        g = jax.tree.map(lambda x: jnp.asarray(RNG.normal(size=x.shape), x.dtype), params)
        if i == 4 and skip is not None:
            g = {**g, "w": g["w"].at[0, 0].set(jnp.nan)}
        grads.append(g)
    run = {}
    for name, tx in (("selected", selected), ("branched", branched)):
        step = jax.jit(functools.partial(_apply, tx))
        p, s = params, tx.init(params)
        for g in grads:
            p, s = step(p, s, g)
        run[name] = (p, s)
    (p1, s1), (p2, s2) = run["selected"], run["branched"]
    for path in ("w", "b"):
        np.testing.assert_array_equal(s1["acc"][path], s2["acc"][path])
        np.testing.assert_allclose(p1[path], p2[path], rtol=1e-6)
    # 7 calls of cycles of 3: one call into the third cycle, or none when one was skipped
    assert int(s1["micro_step"]) == int(s2["micro_step"]) == (1 if skip is None else 0)


def _apply(tx: Any, params: Any, state: Any, grads: Any) -> tuple[Any, Any]:
    updates, state = tx.update(grads, state, params)
    return gradtx.apply_updates(params, updates), state


def test_a_donated_step_holds_one_buffer_beside_its_arguments():
    """XLA's temporaries of a donated step: the updates, which leave the cond, and nothing
    else (with the accumulators returned by the cond's branches, two gradient-sized buffers).
    """
    params = {"w": jnp.ones((256, 256))}
    tx = gradtx.accumulate(gradtx.adam(0.1), every=4)

    def step(p, s, g):
        updates, s = tx.update(g, s, p)
        return gradtx.apply_updates(p, updates), s

    lowered = jax.jit(step, donate_argnums=(0, 1)).lower(params, tx.init(params), params)
    temp = lowered.compile().memory_analysis().temp_size_in_bytes
    assert params["w"].nbytes <= temp < 1.5 * params["w"].nbytes


def test_argument_errors():
    with pytest.raises(ValueError, match="every"):
        gradtx.accumulate(gradtx.sgd(0.1), every=0)
    with pytest.raises(ValueError, match="every"):
        gradtx.accumulate(gradtx.sgd(0.1), every=2.0)
    with pytest.raises(TypeError, match="accumulator_dtype"):
        gradtx.accumulate(gradtx.sgd(0.1), every=2, accumulator_dtype="floaty")
    tx = gradtx.accumulate(gradtx.sgd(0.1), every=2)
    with pytest.raises(KeyError, match="micro_step"):
        tx.update({"w": jnp.ones(1)}, {"acc": {}})
