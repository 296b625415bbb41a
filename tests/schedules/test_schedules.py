"""Schedules: closed forms at the boundaries, optax as an oracle, pytree behaviour, errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx
from gradtx import schedules

N = 40  # steps compared with optax: 0..N, past the end of every schedule below


def _value(schedule, step):
    out = schedule(step)
    assert out.dtype == jnp.float32
    return float(out)


def _close(actual, expected):
    np.testing.assert_allclose(actual, np.float32(expected), rtol=1e-6, atol=1e-7)


# --- closed forms ------------------------------------------------------------------------------


def test_constant():
    sched = schedules.constant(0.3)
    for step in (0, 1, 17, 10_000):
        _close(_value(sched, step), 0.3)


def test_linear():
    sched = schedules.linear(1.0, 0.1, 10, transition_begin=5)

    def closed(t):
        tau = min(max(t - 5, 0), 10)
        return 1.0 + (0.1 - 1.0) * tau / 10

    for step, expected in [(0, 1.0), (5, 1.0), (10, 0.55), (14, 0.19), (15, 0.1), (100, 0.1)]:
        _close(closed(step), expected)
        _close(_value(sched, step), expected)


def test_polynomial():
    sched = schedules.polynomial(1.0, 0.2, 2.0, 10, transition_begin=2)

    def closed(t):
        tau = min(max(t - 2, 0), 10)
        return (1.0 - 0.2) * (1 - tau / 10) ** 2 + 0.2

    for step in (0, 2, 5, 7, 11, 12, 50):
        _close(_value(sched, step), closed(step))
    _close(_value(sched, 7), 0.8 * 0.25 + 0.2)  # middle of the transition
    _close(_value(sched, 12), 0.2)  # end of the transition


@pytest.mark.parametrize("exponent", [1.0, 2.0])
def test_cosine_decay(exponent):
    sched = schedules.cosine_decay(2.0, 10, alpha=0.1, exponent=exponent)

    def closed(t):
        c = 0.5 * (1 + math.cos(math.pi * min(t, 10) / 10))
        return 2.0 * ((1 - 0.1) * c**exponent + 0.1)

    _close(_value(sched, 0), 2.0)
    _close(_value(sched, 5), 2.0 * (0.9 * 0.5**exponent + 0.1))
    _close(_value(sched, 10), 0.2)
    _close(_value(sched, 11), 0.2)
    for step in (0, 3, 5, 9, 10, 30):
        _close(_value(sched, step), closed(step))


def test_warmup_cosine_decay():
    sched = schedules.warmup_cosine_decay(0.01, 1.0, 10, 110, end_value=0.1)

    def closed(t):
        if t < 10:
            return 0.01 + (1.0 - 0.01) * t / 10
        c = 0.5 * (1 + math.cos(math.pi * min(t - 10, 100) / 100))
        return 0.1 + (1.0 - 0.1) * c

    _close(_value(sched, 0), 0.01)
    _close(_value(sched, 5), 0.505)
    _close(_value(sched, 10), 1.0)  # end of warm-up: the peak
    _close(_value(sched, 60), 0.55)  # halfway through the decay
    _close(_value(sched, 110), 0.1)  # last step
    _close(_value(sched, 500), 0.1)  # past the end
    for step in (0, 1, 9, 10, 11, 35, 109):
        _close(_value(sched, step), closed(step))


def test_warmup_cosine_decay_without_warmup_starts_at_peak():
    sched = schedules.warmup_cosine_decay(0.0, 1.0, 0, 10)
    _close(_value(sched, 0), 1.0)
    _close(_value(sched, 5), 0.5)
    _close(_value(sched, 10), 0.0)


def test_exponential_decay():
    sched = schedules.exponential_decay(2.0, 10, 0.5, transition_begin=5)
    _close(_value(sched, 0), 2.0)
    _close(_value(sched, 5), 2.0)
    _close(_value(sched, 10), 2.0 * 0.5**0.5)
    _close(_value(sched, 15), 1.0)
    _close(_value(sched, 25), 0.5)


def test_exponential_decay_staircase():
    sched = schedules.exponential_decay(1.0, 10, 0.5, staircase=True)
    for step, expected in [(0, 1.0), (9, 1.0), (10, 0.5), (19, 0.5), (20, 0.25)]:
        _close(_value(sched, step), expected)


def test_exponential_decay_end_value_bounds_both_ways():
    decay = schedules.exponential_decay(1.0, 10, 0.5, end_value=0.3)
    _close(_value(decay, 10), 0.5)
    _close(_value(decay, 20), 0.3)  # 0.25 floored at 0.3
    _close(_value(decay, 1000), 0.3)
    growth = schedules.exponential_decay(1.0, 10, 2.0, end_value=3.0)
    _close(_value(growth, 10), 2.0)
    _close(_value(growth, 20), 3.0)  # 4.0 capped at 3.0


def test_piecewise_constant():
    sched = schedules.piecewise_constant(1.0, {20: 0.5, 10: 0.1})
    for step, expected in [(0, 1.0), (9, 1.0), (10, 0.1), (19, 0.1), (20, 0.05), (99, 0.05)]:
        _close(_value(sched, step), expected)
    _close(_value(schedules.piecewise_constant(0.7), 123), 0.7)


def test_join():
    sched = schedules.join(
        [schedules.linear(0.0, 1.0, 10), schedules.constant(0.8), schedules.cosine_decay(1.0, 20)],
        [10, 30],
    )
    for step, expected in [
        (0, 0.0),
        (5, 0.5),
        (9, 0.9),
        (10, 0.8),  # the second schedule takes over at its boundary
        (29, 0.8),
        (30, 1.0),  # the third restarts its count at 0
        (40, 0.5),
        (50, 0.0),
        (80, 0.0),
    ]:
        _close(_value(sched, step), expected)


def test_schedules_accept_step_arrays():
    sched = schedules.piecewise_constant(1.0, {2: 0.5})
    np.testing.assert_array_equal(sched(jnp.arange(4)), np.float32([1.0, 1.0, 0.5, 0.5]))
    warm = schedules.warmup_cosine_decay(0.0, 1.0, 2, 4)
    np.testing.assert_allclose(warm(jnp.arange(6)), [0.0, 0.5, 1.0, 0.5, 0.0, 0.0], atol=1e-7)


# --- optax as an oracle ------------------------------------------------------------------------


def _pairs():
    return [
        ("constant", schedules.constant(0.3), optax.constant_schedule(0.3)),
        (
            "linear",
            schedules.linear(1.0, 0.1, 20, 5),
            optax.linear_schedule(1.0, 0.1, 20, 5),
        ),
        (
            "polynomial",
            schedules.polynomial(1.0, 0.2, 3.0, 25, 4),
            optax.polynomial_schedule(1.0, 0.2, 3.0, 25, 4),
        ),
        (
            "cosine_decay",
            schedules.cosine_decay(2.0, 30, alpha=0.1, exponent=1.5),
            optax.cosine_decay_schedule(2.0, 30, alpha=0.1, exponent=1.5),
        ),
        (
            "warmup_cosine_decay",
            schedules.warmup_cosine_decay(0.01, 1.0, 8, 32, end_value=0.05),
            optax.warmup_cosine_decay_schedule(0.01, 1.0, 8, 32, end_value=0.05),
        ),
        (
            "exponential_decay",
            schedules.exponential_decay(1.0, 7, 0.6, transition_begin=3),
            optax.exponential_decay(1.0, 7, 0.6, transition_begin=3),
        ),
        (
            "exponential_decay_staircase_end",
            schedules.exponential_decay(1.0, 5, 0.5, staircase=True, end_value=0.1),
            optax.exponential_decay(1.0, 5, 0.5, staircase=True, end_value=0.1),
        ),
        (
            "exponential_growth_end",
            schedules.exponential_decay(0.1, 4, 1.5, end_value=2.0),
            optax.exponential_decay(0.1, 4, 1.5, end_value=2.0),
        ),
        (
            "piecewise_constant",
            schedules.piecewise_constant(1.0, {10: 0.5, 5: 0.1, 30: 2.0}),
            optax.piecewise_constant_schedule(1.0, {10: 0.5, 5: 0.1, 30: 2.0}),
        ),
        (
            "join",
            schedules.join(
                [schedules.linear(0.0, 1.0, 10), schedules.cosine_decay(1.0, 20, alpha=0.2)],
                [10],
            ),
            optax.join_schedules(
                [optax.linear_schedule(0.0, 1.0, 10), optax.cosine_decay_schedule(1.0, 20, 0.2)],
                [10],
            ),
        ),
    ]


@pytest.mark.parametrize("name,ours,theirs", _pairs(), ids=[p[0] for p in _pairs()])
def test_matches_optax_over_all_steps(name, ours, theirs):
    steps = np.arange(N + 1)
    actual = np.asarray([ours(jnp.int32(s)) for s in steps])
    with jax.numpy_dtype_promotion("standard"):
        expected = np.asarray([theirs(jnp.int32(s)) for s in steps], np.float32)
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7)
    # A vector of steps gives the same values as one step at a time.
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(steps))), actual, rtol=1e-6, atol=1e-7)


# --- pytrees, jit, vmap ------------------------------------------------------------------------


def _every_schedule():
    return [p[1] for p in _pairs()] + [
        schedules.join([lambda step: 0.5, schedules.constant(1.0)], [3]),
        schedules.piecewise_constant(1.0),
    ]


def test_schedules_are_pytrees_of_float32_and_int32_leaves():
    for sched in _every_schedule():
        leaves = jax.tree.leaves(sched)
        assert leaves, sched
        for leaf in leaves:
            # numbers are NumPy scalars (static for Flax NNX), arrays JAX arrays
            assert isinstance(leaf, (jax.Array, np.generic))
            assert leaf.dtype in (jnp.float32, jnp.int32), (sched, leaf)
        rebuilt = jax.tree.unflatten(jax.tree.structure(sched), leaves)
        assert float(rebuilt(7)) == float(sched(7))


def test_step_counts_are_int32_and_values_float32():
    sched = schedules.warmup_cosine_decay(0.0, 1.0, 10, 100)
    assert sched.warmup_steps.dtype == jnp.int32
    assert sched.decay_steps.dtype == jnp.int32
    assert sched.peak_value.dtype == jnp.float32
    exp = schedules.exponential_decay(1.0, 10, 0.5)
    assert exp.transition_steps.dtype == jnp.int32


def test_jit_with_schedule_argument_does_not_recompile():
    traces = []

    @jax.jit
    def at(sched, step):
        traces.append(None)
        return sched(step)

    first = schedules.warmup_cosine_decay(0.0, 1.0, 10, 100, end_value=0.0)
    second = schedules.warmup_cosine_decay(0.1, 3.0, 20, 50, end_value=0.5)
    _close(float(at(first, 10)), 1.0)
    _close(float(at(second, 20)), 3.0)
    _close(float(at(second, 50)), 0.5)
    _close(float(at(first, 55)), 0.5)
    assert len(traces) == 1

    lin_traces = []

    @jax.jit
    def lin_at(sched, step):
        lin_traces.append(None)
        return sched(step)

    _close(float(lin_at(schedules.linear(1.0, 0.0, 10), 5)), 0.5)
    _close(float(lin_at(schedules.linear(4.0, 2.0, 4, 2), 4)), 3.0)
    assert len(lin_traces) == 1


def test_jitted_optimizer_step_with_new_schedule_values_does_not_recompile():
    traces = []

    @jax.jit
    def step(tx, params, state):
        traces.append(None)
        grads = jax.tree.map(jnp.ones_like, params)
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state

    params = {"w": jnp.zeros(2)}
    for peak in (0.1, 0.2):
        tx = gradtx.sgd(schedules.linear(peak, 0.0, 4))
        p, state = params, tx.init(params)
        for _ in range(3):
            p, state = step(tx, p, state)
        # sum of the learning rates of steps 0, 1, 2: peak * (1 + 0.75 + 0.5)
        np.testing.assert_allclose(p["w"], np.full(2, -peak * 2.25, np.float32), rtol=1e-6)
    assert len(traces) == 1


def test_vmap_over_stacked_peak_values():
    peaks = (0.1, 0.5, 2.0)
    scheds = [schedules.warmup_cosine_decay(0.0, peak, 5, 20) for peak in peaks]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *scheds)
    assert stacked.peak_value.shape == (3,)
    steps = jnp.arange(25)
    values = jax.jit(jax.vmap(lambda s: jax.vmap(s)(steps)))(stacked)
    assert values.shape == (3, 25)
    for i, sched in enumerate(scheds):
        np.testing.assert_allclose(values[i], sched(steps), rtol=1e-6)
    np.testing.assert_allclose(values[:, 5], np.float32(peaks), rtol=1e-6)


def test_vmap_over_stacked_warmup_lengths():
    scheds = [schedules.linear(1.0, 0.0, n) for n in (2, 4, 8)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *scheds)
    values = jax.vmap(lambda s: s(2))(stacked)
    np.testing.assert_allclose(values, [0.0, 0.5, 0.75], rtol=1e-6)


# --- plain functions ---------------------------------------------------------------------------


def test_plain_function_as_learning_rate():
    def lr(step):
        return 0.1 / (1.0 + step.astype(jnp.float32))

    tx = gradtx.sgd(lr)
    params = {"w": jnp.zeros(3), "b": jnp.zeros(1)}
    state = tx.init(params)
    grads = {"w": jnp.ones(3), "b": jnp.full(1, 2.0)}
    expected_w = 0.0
    for t in range(3):
        updates, state = tx.update(grads, state, params)
        expected_w -= 0.1 / (1 + t)
        params = gradtx.apply_updates(params, updates)
        np.testing.assert_allclose(updates["w"], np.full(3, -0.1 / (1 + t), np.float32), rtol=1e-6)
        np.testing.assert_allclose(updates["b"], np.full(1, -0.2 / (1 + t), np.float32), rtol=1e-6)
    np.testing.assert_allclose(params["w"], np.full(3, expected_w, np.float32), rtol=1e-6)
    assert int(state["schedule_count"]["w"]) == 3


def test_plain_function_is_static_and_not_a_leaf():
    def lr(step):
        return 0.01

    tx = gradtx.sgd(lr)
    assert jax.tree.leaves(tx) == []
    traces = []

    @jax.jit
    def update(tx, grads, state):
        traces.append(None)
        return tx.update(grads, state)

    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    updates, state = update(tx, params, state)
    updates, state = update(tx, params, state)
    assert len(traces) == 1
    np.testing.assert_allclose(updates["w"], [-0.01, -0.01], rtol=1e-6)


def test_plain_function_in_scale_by_schedule():
    tx = gradtx.scale_by_schedule(lambda step: 2.0 ** step.astype(jnp.float32))
    state = tx.init({"w": jnp.zeros(1)})
    seen = []
    for _ in range(3):
        u, state = tx.update({"w": jnp.ones(1)}, state)
        seen.append(float(u["w"][0]))
    assert seen == [1.0, 2.0, 4.0]


# --- bad arguments -----------------------------------------------------------------------------


def test_warmup_not_shorter_than_decay():
    with pytest.raises(ValueError, match=r"warmup_steps=10, decay_steps=10"):
        schedules.warmup_cosine_decay(0.0, 1.0, 10, 10)
    with pytest.raises(ValueError, match=r"warmup_steps < decay_steps"):
        schedules.warmup_cosine_decay(0.0, 1.0, 20, 10)


@pytest.mark.parametrize(
    "make",
    [
        lambda: schedules.linear(1.0, 0.0, 0),
        lambda: schedules.polynomial(1.0, 0.0, 2.0, -3),
        lambda: schedules.exponential_decay(1.0, 0, 0.5),
    ],
    ids=["linear", "polynomial", "exponential_decay"],
)
def test_non_positive_transition_steps(make):
    with pytest.raises(ValueError, match=r"`transition_steps` must be a positive number of steps"):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda r: schedules.exponential_decay(1.0, 2, decay_rate=r),
        lambda r: schedules.exponential_decay(1.0, 2, r, staircase=True, end_value=0.1),
        lambda r: schedules.warmup_exponential_decay(0.0, 1.0, 2, 4, decay_rate=r),
        lambda r: schedules.exponential_decay(1.0, 2, decay_rate=jnp.asarray(r)),
    ],
    ids=["exponential_decay", "staircase", "warmup_exponential_decay", "array"],
)
def test_a_zero_or_negative_decay_rate_is_refused(make):
    # A zero rate would give [1, 0, 0, ...] (optax gives a constant instead): say what to use.
    with pytest.raises(
        ValueError,
        match=r"`decay_rate` must be > 0: with 0 the value drops to 0 right after "
        r"`transition_begin`. For a constant .* `schedules.constant\(init_value\)`; for a drop "
        r"to 0 at a step use `schedules.piecewise_constant\(init_value, \{step: 0.0\}\)`",
    ):
        make(0.0)
    with pytest.raises(ValueError, match=r"`decay_rate` must be > 0 \(a negative factor"):
        make(-0.5)
    # what stays meaningful: a small positive rate, and growth
    for rate in (1e-3, 2.0):
        value = float(make(rate)(6))
        assert 0.0 < value < math.inf and value != 1.0, (rate, value)


def test_the_suggested_replacements_give_what_a_zero_rate_meant():
    constant = schedules.constant(1.0)
    drop = schedules.piecewise_constant(1.0, {1: 0.0})
    steps = jnp.arange(4)
    np.testing.assert_array_equal(jax.vmap(constant)(steps), [1.0, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(jax.vmap(drop)(steps), [1.0, 0.0, 0.0, 0.0])
    # optax's exponential_decay with a zero rate is the constant
    np.testing.assert_array_equal(
        jax.vmap(optax.exponential_decay(1.0, 2, 0.0))(steps), jax.vmap(constant)(steps)
    )


def test_a_traced_decay_rate_is_not_checked():
    # under vmap the rate is unknown at construction; a sweep builds and runs
    values = jax.vmap(lambda r: schedules.exponential_decay(1.0, 2, r)(4))(jnp.array([0.5, 0.25]))
    np.testing.assert_allclose(values, [0.25, 0.0625], rtol=1e-6)


def test_non_positive_decay_steps():
    with pytest.raises(ValueError, match=r"`decay_steps` must be a positive"):
        schedules.cosine_decay(1.0, 0)


def test_join_with_wrong_number_of_boundaries():
    parts = [schedules.constant(1.0), schedules.constant(0.5), schedules.constant(0.1)]
    with pytest.raises(ValueError, match=r"3 schedules need 2 boundaries, got 1"):
        schedules.join(parts, [10])
    with pytest.raises(ValueError, match=r"3 schedules need 2 boundaries, got 3"):
        schedules.join(parts, [1, 2, 3])
    with pytest.raises(ValueError, match=r"boundaries must increase"):
        schedules.join(parts, [20, 10])


def test_piecewise_constant_negative_boundary():
    with pytest.raises(ValueError, match=r"boundary -1 is negative"):
        schedules.piecewise_constant(1.0, {-1: 0.5})


def test_non_numeric_schedule_value():
    with pytest.raises(TypeError, match=r"init_value"):
        schedules.cosine_decay("1.0", 10)
