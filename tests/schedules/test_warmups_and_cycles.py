"""The warm-up, piecewise-interpolation, one-cycle and warm-restart schedules.

Closed forms at the boundaries (step 0, the end of the warm-up, the last step, past the end),
optax as an oracle at every step under `jit`, pytree behaviour and argument errors.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gradtx import schedules

N = 130  # steps compared with optax: 0..N, past the end of every schedule below
F = np.float32


@jax.jit
def _at(schedule, step):
    return schedule(step)


def _value(schedule, step):
    out = _at(schedule, jnp.int32(step))
    assert out.dtype == jnp.float32 and out.shape == ()
    return float(out)


def _close(actual, expected, peak=1.0):
    """Equal within float32 rounding; a value near zero made as `a + (b - a) * w` rounds
    relative to its terms, of size up to the schedule's `peak`."""
    np.testing.assert_allclose(actual, np.float32(expected), rtol=1e-6, atol=1e-7 * peak)


def _check(schedule, closed, steps, peak=1.0):
    for step in steps:
        _close(_value(schedule, step), closed(step), peak)


# --- closed forms ------------------------------------------------------------------------------


def test_warmup_constant():
    sched = schedules.warmup_constant(0.1, 1.0, 10)
    _close(_value(sched, 0), 0.1)
    _close(_value(sched, 5), 0.55)
    _close(_value(sched, 9), 0.91)
    assert _value(sched, 10) == F(1.0)  # end of warm-up: exactly the peak
    assert _value(sched, 11) == F(1.0)
    assert _value(sched, 10_000) == F(1.0)
    _check(sched, lambda t: 0.1 + 0.9 * min(t, 10) / 10, range(0, 15))


def test_warmup_constant_without_warmup_is_the_peak():
    sched = schedules.warmup_constant(0.0, 0.5, 0)
    assert [_value(sched, t) for t in (0, 1, 100)] == [0.5, 0.5, 0.5]


def test_warmup_exponential_decay():
    sched = schedules.warmup_exponential_decay(
        0.0, 2.0, 10, 5, 0.5, transition_begin=3, end_value=0.3
    )

    def closed(t):
        if t < 10:
            return 2.0 * t / 10
        tau = t - 10 - 3
        return max(2.0 * 0.5 ** (max(tau, 0) / 5), 0.3)

    _close(_value(sched, 0), 0.0)
    _close(_value(sched, 5), 1.0)
    assert _value(sched, 10) == F(2.0)  # end of warm-up: the peak
    assert _value(sched, 13) == F(2.0)  # held for transition_begin more steps
    _close(_value(sched, 18), 1.0)
    _close(_value(sched, 23), 0.5)
    _close(_value(sched, 28), 0.3)  # 0.25 floored at end_value
    _close(_value(sched, 10_000), 0.3)
    _check(sched, closed, range(0, 40))


def test_warmup_exponential_decay_staircase_and_no_warmup():
    sched = schedules.warmup_exponential_decay(0.0, 1.0, 4, 10, 0.5, staircase=True)
    for step, expected in [(0, 0.0), (2, 0.5), (4, 1.0), (13, 1.0), (14, 0.5), (24, 0.25)]:
        _close(_value(sched, step), expected)
    direct = schedules.warmup_exponential_decay(0.3, 1.0, 0, 10, 0.5)
    _close(_value(direct, 0), 1.0)  # no warm-up: the decay starts at the peak
    _close(_value(direct, 10), 0.5)


def test_piecewise_interpolate_linear():
    # The example of optax's documentation: values 1, 0.1, 0.001 at steps 0, 4, 8.
    sched = schedules.piecewise_interpolate("linear", 1.0, {8: 0.01, 4: 0.1})
    for step, expected in [(0, 1.0), (2, 0.55), (4, 0.1), (6, 0.0505), (8, 0.001), (10, 0.001)]:
        _close(_value(sched, step), expected)
    assert _value(sched, 0) == F(1.0)
    _close(_value(sched, 10_000), 0.001)


def test_piecewise_interpolate_cosine():
    sched = schedules.piecewise_interpolate("cosine", 2.0, {10: 0.5, 20: 2.0})

    def closed(t):
        if t >= 20:
            return 2.0
        start, end, lo = (2.0, 1.0, 0) if t < 10 else (1.0, 2.0, 10)
        return start + (end - start) * 0.5 * (1 - math.cos(math.pi * (t - lo) / 10))

    assert _value(sched, 0) == F(2.0)
    _close(_value(sched, 5), 1.5)
    assert _value(sched, 10) == F(1.0)  # the boundary value exactly
    _close(_value(sched, 15), 1.5)
    assert _value(sched, 20) == F(2.0)
    assert _value(sched, 999) == F(2.0)
    _check(sched, closed, range(0, 25))


def test_piecewise_interpolate_edge_cases():
    at_zero = schedules.piecewise_interpolate("linear", 1.0, {0: 3.0, 4: 0.5})
    # A boundary at step 0 applies at once; then 3 -> 1.5 over 4 steps.
    for step, expected in [(0, 3.0), (2, 2.25), (4, 1.5), (9, 1.5)]:
        _close(_value(at_zero, step), expected)
    for empty in (None, {}):
        flat = schedules.piecewise_interpolate("cosine", 0.7, empty)
        assert [_value(flat, t) for t in (0, 5, 1000)] == [F(0.7)] * 3
    # Negative steps count as step 0.
    sched = schedules.piecewise_interpolate("linear", 1.0, {4: 0.5})
    _close(_value(sched, -3), 1.0)


def test_linear_onecycle():
    # low = 2 / 10 = 0.2, final = 0.2 / 100 = 0.002; phases end at steps 20, 60, 100.
    sched = schedules.linear_onecycle(100, 2.0, 0.2, 0.6, div_factor=10.0, final_div_factor=100.0)

    def closed(t):
        for lo, hi, a, b in [(0, 20, 0.2, 2.0), (20, 60, 2.0, 0.2), (60, 100, 0.2, 0.002)]:
            if t < hi:
                return a + (b - a) * (t - lo) / (hi - lo)
        return 0.002

    _close(_value(sched, 0), 0.2)
    _close(_value(sched, 10), 1.1)
    assert _value(sched, 20) == F(2.0)  # end of warm-up: exactly the peak
    _close(_value(sched, 40), 1.1)
    _close(_value(sched, 60), 0.2)
    _close(_value(sched, 80), 0.101)
    _close(_value(sched, 100), 0.002)  # last step
    _close(_value(sched, 5000), 0.002)  # past the end
    _check(sched, closed, range(0, 110, 3))


def test_cosine_onecycle():
    sched = schedules.cosine_onecycle(100, 2.0, 0.2, div_factor=10.0, final_div_factor=100.0)

    def closed(t):
        if t >= 100:
            return 0.002
        lo, hi, a, b = (0, 20, 0.2, 2.0) if t < 20 else (20, 100, 2.0, 0.002)
        return a + (b - a) * 0.5 * (1 - math.cos(math.pi * (t - lo) / (hi - lo)))

    _close(_value(sched, 0), 0.2)
    _close(_value(sched, 10), 1.1)
    assert _value(sched, 20) == F(2.0)
    _close(_value(sched, 60), 1.001)
    _close(_value(sched, 100), 0.002)
    _close(_value(sched, 5000), 0.002)
    _check(sched, closed, range(0, 110, 3), peak=2.0)


def test_onecycle_without_a_warmup_starts_at_the_peak():
    """`pct_start=0` is allowed: the cycle starts at its peak and anneals over every step."""
    for make in (schedules.cosine_onecycle, schedules.linear_onecycle):
        sched = make(100, 2.0, 0.0, div_factor=10.0, final_div_factor=100.0)
        assert _value(sched, 0) == F(2.0)
        _close(_value(sched, 100), 0.002)
    _close(_value(schedules.cosine_onecycle(100, 2.0, 0.0), 50), 1.0 + 1.0 / 25e4, peak=2.0)


def test_onecycle_defaults():
    sched = schedules.linear_onecycle(1000, 1.0)
    _close(_value(sched, 0), 0.04)  # peak / 25
    assert _value(sched, 300) == F(1.0)
    _close(_value(sched, 850), 0.04)
    _close(_value(sched, 1000), 0.04 / 1e4)
    cos = schedules.cosine_onecycle(1000, 1.0)
    _close(_value(cos, 0), 0.04)
    assert _value(cos, 300) == F(1.0)
    _close(_value(cos, 1000), 0.04 / 1e4)


def test_sgdr():
    sched = schedules.sgdr(
        [
            dict(init_value=0.0, peak_value=1.0, warmup_steps=2, decay_steps=10),
            dict(init_value=0.1, peak_value=0.5, warmup_steps=0, decay_steps=20, end_value=0.05),
        ]
    )
    for step, expected in [
        (0, 0.0),
        (1, 0.5),
        (2, 1.0),  # end of the first warm-up
        (6, 0.5),  # halfway through the first decay
        (9, 0.5 * (1 + math.cos(math.pi * 7 / 8))),
        (10, 0.5),  # the restart: the second cycle begins at its peak
        (20, 0.275),
        (29, 0.05 + 0.45 * 0.5 * (1 + math.cos(math.pi * 19 / 20))),
        (30, 0.05),  # last step
        (99, 0.05),  # past the end
    ]:
        _close(_value(sched, step), expected)


# --- optax as an oracle ------------------------------------------------------------------------

_CYCLES = [
    dict(init_value=F(0.0), peak_value=F(1.0), warmup_steps=5, decay_steps=30),
    dict(init_value=F(0.1), peak_value=F(0.8), warmup_steps=3, decay_steps=40, end_value=F(0.01)),
    dict(init_value=F(0.0), peak_value=F(0.5), warmup_steps=0, decay_steps=20, exponent=F(2.0)),
]


def _pairs():
    bs_lin = {7: F(0.1), 20: F(3.0), 21: F(0.5), 60: F(0.0)}
    bs_cos = {0: F(2.0), 13: F(0.25), 50: F(4.0)}
    return [
        (
            "warmup_constant",
            schedules.warmup_constant(F(0.01), F(1.5), 17),
            optax.warmup_constant_schedule(F(0.01), F(1.5), 17),
        ),
        (
            "warmup_exponential_decay",
            schedules.warmup_exponential_decay(F(0.0), F(2.0), 12, 9, F(0.7), 4, False, F(0.2)),
            optax.warmup_exponential_decay_schedule(
                F(0.0), F(2.0), 12, 9, F(0.7), 4, False, F(0.2)
            ),
        ),
        (
            "warmup_exponential_growth_staircase",
            schedules.warmup_exponential_decay(F(0.5), F(1.0), 6, 10, F(1.3), 0, True, F(3.0)),
            optax.warmup_exponential_decay_schedule(F(0.5), F(1.0), 6, 10, F(1.3), 0, True, F(3.0)),
        ),
        (
            "piecewise_interpolate_linear",
            schedules.piecewise_interpolate("linear", F(0.9), bs_lin),
            optax.piecewise_interpolate_schedule("linear", F(0.9), bs_lin),
        ),
        (
            "piecewise_interpolate_cosine",
            schedules.piecewise_interpolate("cosine", F(0.3), bs_cos),
            optax.piecewise_interpolate_schedule("cosine", F(0.3), bs_cos),
        ),
        (
            "linear_onecycle",
            # int(0.3 * 110) = 32 and int(0.7 * 110) = 77 are rounded down as in optax.
            schedules.linear_onecycle(110, F(0.5), 0.3, 0.7),
            optax.linear_onecycle_schedule(110, F(0.5), 0.3, 0.7),
        ),
        (
            "linear_onecycle_factors",
            schedules.linear_onecycle(97, F(3.0), 0.25, 0.9, F(5.0), F(20.0)),
            optax.linear_onecycle_schedule(97, F(3.0), 0.25, 0.9, F(5.0), F(20.0)),
        ),
        (
            "cosine_onecycle",
            schedules.cosine_onecycle(120, F(0.5)),
            optax.cosine_onecycle_schedule(120, F(0.5)),
        ),
        (
            "cosine_onecycle_factors",
            schedules.cosine_onecycle(33, F(2.0), 0.45, F(4.0), F(10.0)),
            optax.cosine_onecycle_schedule(33, F(2.0), 0.45, F(4.0), F(10.0)),
        ),
        ("sgdr", schedules.sgdr(_CYCLES), optax.sgdr_schedule(_CYCLES)),
    ]


PAIRS = _pairs()


@pytest.mark.parametrize("name,ours,theirs", PAIRS, ids=[p[0] for p in PAIRS])
def test_matches_optax_over_all_steps(name, ours, theirs):
    steps = jnp.arange(N + 1, dtype=jnp.int32)
    with jax.numpy_dtype_promotion("standard"):
        expected = np.asarray(jax.jit(jax.vmap(theirs))(steps), np.float32)
    # One step at a time under jit, and a vector of steps at once.
    actual = np.asarray(jax.jit(jax.vmap(_at, in_axes=(None, 0)))(ours, steps))
    np.testing.assert_allclose(actual, expected, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(_at(ours, steps)), expected, rtol=2e-6, atol=1e-7)
    for step in (0, N // 3, N):
        np.testing.assert_allclose(_value(ours, step), expected[step], rtol=2e-6, atol=1e-7)


# --- pytrees, jit, vmap ------------------------------------------------------------------------


@pytest.mark.parametrize("name,ours,theirs", PAIRS, ids=[p[0] for p in PAIRS])
def test_leaves_are_float32_and_int32(name, ours, theirs):
    leaves = jax.tree.leaves(ours)
    assert leaves
    for leaf in leaves:
        # numbers are NumPy scalars (static for Flax NNX), arrays JAX arrays
        assert isinstance(leaf, (jax.Array, np.generic))
        assert leaf.dtype in (jnp.float32, jnp.int32), leaf
    rebuilt = jax.tree.unflatten(jax.tree.structure(ours), leaves)
    assert _value(rebuilt, 23) == _value(ours, 23)


def test_new_numbers_do_not_recompile():
    traces = []

    @jax.jit
    def at(sched, step):
        traces.append(None)
        return sched(step)

    # Peak, pct_start and the cycle length all live in leaves of one structure.
    a = schedules.linear_onecycle(100, 1.0)
    b = schedules.linear_onecycle(40, 3.0, pct_start=0.5, pct_final=0.75)
    _close(float(at(a, 30)), 1.0)
    _close(float(at(b, 20)), 3.0)
    _close(float(at(b, 30)), 3.0 / 25)
    assert len(traces) == 1
    w1 = schedules.warmup_exponential_decay(0.0, 1.0, 10, 5, 0.5)
    w2 = schedules.warmup_exponential_decay(0.5, 2.0, 3, 7, 0.9)
    _close(float(at(w1, 10)), 1.0)
    _close(float(at(w2, 3)), 2.0)
    assert len(traces) == 2


def test_vmap_over_stacked_schedules():
    peaks = (0.1, 0.5, 2.0)
    scheds = [schedules.cosine_onecycle(50, p, pct_start=0.2) for p in peaks]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *scheds)
    steps = jnp.arange(60)
    values = jax.jit(jax.vmap(lambda s: s(steps)))(stacked)
    assert values.shape == (3, 60)
    for i, sched in enumerate(scheds):
        np.testing.assert_allclose(values[i], sched(steps), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(values[:, 10], np.float32(peaks), rtol=1e-6)

    warm = [schedules.warmup_constant(0.0, 1.0, n) for n in (2, 4, 8)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *warm)
    np.testing.assert_allclose(jax.vmap(lambda s: s(2))(stacked), [1.0, 0.5, 0.25], rtol=1e-6)


def test_step_arrays_of_any_shape():
    sched = schedules.piecewise_interpolate("linear", 1.0, {2: 0.5, 4: 0.0})
    steps = jnp.arange(6).reshape(2, 3)
    np.testing.assert_allclose(sched(steps), [[1.0, 0.75, 0.5], [0.25, 0.0, 0.0]], atol=1e-7)


# --- bad arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: schedules.warmup_constant(0.0, 1.0, -1), r"`warmup_steps` must be a non-neg"),
        (
            lambda: schedules.warmup_exponential_decay(0.0, 1.0, -2, 5, 0.5),
            r"warmup_exponential_decay: `warmup_steps` must be a non-negative",
        ),
        (
            lambda: schedules.warmup_exponential_decay(0.0, 1.0, 2, 0, 0.5),
            r"`transition_steps` must be a positive",
        ),
        (
            lambda: schedules.warmup_exponential_decay(0.0, 1.0, 2, 5, 0.5, transition_begin=-1),
            r"`transition_begin` must be a non-negative",
        ),
        (
            lambda: schedules.piecewise_interpolate("cubic", 1.0, {2: 0.5}),
            r"`interpolate_type` must be 'linear' or 'cosine', got 'cubic'",
        ),
        (
            lambda: schedules.piecewise_interpolate("linear", 1.0, {2: -0.5}),
            r"`boundaries_and_scales` has a negative scale -0.5 at step 2",
        ),
        (
            lambda: schedules.piecewise_interpolate("linear", 1.0, {-2: 0.5}),
            r"`boundaries_and_scales` has a negative boundary -2",
        ),
        (lambda: schedules.linear_onecycle(0, 1.0), r"`transition_steps` must be a concrete pos"),
        (lambda: schedules.cosine_onecycle(-5, 1.0), r"`transition_steps` must be a concrete"),
        (lambda: schedules.linear_onecycle(100, 1.0, pct_start=1.2), r"`pct_start` must be in"),
        (lambda: schedules.linear_onecycle(100, 1.0, pct_final=1.0), r"`pct_final` must be in"),
        (
            lambda: schedules.linear_onecycle(100, 1.0, pct_start=0.8, pct_final=0.5),
            r"phases end at steps \[80, 50, 100\]",
        ),
        (lambda: schedules.linear_onecycle(1, 1.0), r"phases end at steps \[0, 0, 1\]"),
        (lambda: schedules.cosine_onecycle(10, 1.0, pct_start=-0.1), r"`pct_start` must be in"),
        (lambda: schedules.sgdr([]), r"`cosine_kwargs` must hold at least one cycle"),
        (
            lambda: schedules.sgdr([dict(init_value=0.0, peak_value=1.0, warmup_steps=2)]),
            r"`cosine_kwargs\[0\]`.*missing: \['decay_steps'\]",
        ),
        (
            lambda: schedules.sgdr(
                [dict(init_value=0, peak_value=1, warmup_steps=0, decay_steps=5, alpha=0.1)]
            ),
            r"unknown: \['alpha'\]",
        ),
        (
            lambda: schedules.sgdr(
                [dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=5)]
            ),
            r"warmup_steps=5, decay_steps=5",
        ),
        (lambda: schedules.warmup_constant("0.1", 1.0, 3), r"init_value"),
        (lambda: schedules.linear_onecycle(10, "1.0"), r"peak_value"),
    ],
    ids=lambda x: "" if callable(x) else None,
)
def test_bad_arguments(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()
