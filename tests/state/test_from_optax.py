"""from_optax: an optax state carried over to gradtx continues exactly as optax would have."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx
from gradtx import schedules

K = 5  # optax steps before the switch, and gradtx steps after it


def _params():
    return {
        "enc": {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "b": jnp.full((3,), 0.3)},
        "head": [jnp.array([0.5, -2.0])],
    }


def _loss(params):
    return sum(jnp.sum(jnp.sin(3.0 * x) * x**2) for x in jax.tree.leaves(params))


LABELS = {"enc": {"w": "a", "b": "b"}, "head": ["a"]}  # optax: a tree of labels

CASES = {
    "adam": (lambda: optax.adam(1e-2), lambda: gradtx.adam(1e-2)),
    "adamw": (
        lambda: optax.adamw(1e-2, weight_decay=0.1),
        lambda: gradtx.adamw(1e-2, weight_decay=0.1),
    ),
    "adamw-mask": (
        lambda: optax.adamw(
            1e-2, weight_decay=0.1, mask={"enc": {"w": True, "b": False}, "head": [True]}
        ),
        lambda: gradtx.adamw(1e-2, weight_decay=0.1, mask="!**/b"),
    ),
    "adam-schedule": (
        lambda: optax.adam(optax.linear_schedule(1e-2, 1e-3, 20)),
        lambda: gradtx.adam(schedules.linear(1e-2, 1e-3, 20)),
    ),
    "sgd": (lambda: optax.sgd(1e-2), lambda: gradtx.sgd(1e-2)),
    "sgd-momentum": (lambda: optax.sgd(1e-2, 0.9), lambda: gradtx.sgd(1e-2, 0.9)),
    "sgd-nesterov": (
        lambda: optax.sgd(1e-2, 0.9, nesterov=True),
        lambda: gradtx.sgd(1e-2, 0.9, nesterov=True),
    ),
    "lion": (
        lambda: optax.lion(1e-3, weight_decay=0.1),
        lambda: gradtx.lion(1e-3, weight_decay=0.1),
    ),
    "chain-clip-adamw": (
        lambda: optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(1e-2)),
        lambda: gradtx.chain(gradtx.clip_by_global_norm(0.5), gradtx.adamw(1e-2)),
    ),
    "inject-schedule": (
        lambda: optax.inject_hyperparams(optax.adam)(
            learning_rate=optax.linear_schedule(1e-2, 1e-3, 8), b1=0.8
        ),
        lambda: gradtx.inject_hyperparams(gradtx.adam)(
            learning_rate=schedules.linear(1e-2, 1e-3, 8), b1=0.8
        ),
    ),
    "multi_transform-inject": (
        lambda: optax.multi_transform(
            {
                "a": optax.inject_hyperparams(optax.adam)(learning_rate=1e-2),
                "b": optax.inject_hyperparams(optax.adam)(learning_rate=1e-1, b1=0.8),
            },
            LABELS,
        ),
        lambda: gradtx.partition(
            {
                "a": gradtx.inject_hyperparams(gradtx.adam)(learning_rate=1e-2),
                "b": gradtx.inject_hyperparams(gradtx.adam)(learning_rate=1e-1, b1=0.8),
            },
            {"a": ["enc/w", "head/**"], "b": "enc/b"},  # gradtx: globs on paths
        ),
    ),
}


def _steps(tx, apply, params, state, n):
    @jax.jit
    def step(params, state):
        updates, state = tx.update(jax.grad(_loss)(params), state, params)
        return apply(params, updates), state

    for _ in range(n):
        params, state = step(params, state)
    return params, state


def _optax_run(otx, n):
    params = _params()
    with jax.numpy_dtype_promotion("standard"):  # optax's own math promotes implicitly
        return _steps(otx, optax.apply_updates, params, otx.init(params), n)


@pytest.mark.parametrize("case", list(CASES))
def test_k_optax_steps_then_k_gradtx_steps_equal_2k_optax_steps(case):
    make_optax, make_gradtx = CASES[case]
    otx, gtx = make_optax(), make_gradtx()
    params, opt_state = _optax_run(otx, K)
    state, report = gradtx.from_optax(opt_state, gtx, params)
    assert report.clean, report
    got, _ = _steps(gtx, gradtx.apply_updates, params, state, K)
    want, _ = _optax_run(otx, 2 * K)
    for path, value in gradtx.paths.leaves(want).items():
        np.testing.assert_allclose(
            gradtx.paths.leaves(got)[path], value, rtol=1e-5, atol=1e-6, err_msg=path
        )


def test_counts_become_one_count_per_path():
    otx = optax.adam(optax.linear_schedule(1e-2, 1e-3, 20))
    params, opt_state = _optax_run(otx, K)
    state, _ = gradtx.from_optax(opt_state, gradtx.adam(schedules.linear(1e-2, 1e-3, 20)), params)
    flat = gradtx.state_dict(state)
    for path in ("enc/w", "enc/b", "head/0"):
        assert int(flat[f"count/{path}"]) == K
        assert int(flat[f"schedule_count/{path}"]) == K
        np.testing.assert_array_equal(
            flat[f"mu/{path}"], gradtx.paths.leaves(opt_state[0].mu)[path]
        )


def test_partition_groups_and_injected_hyperparameters_by_name():
    make_optax, make_gradtx = CASES["multi_transform-inject"]
    params, opt_state = _optax_run(make_optax(), K)
    state, report = gradtx.from_optax(opt_state, make_gradtx(), params)
    assert report.clean
    flat = gradtx.state_dict(state)
    assert sorted(k for k in flat if k.startswith("b/inner/mu/")) == ["b/inner/mu/enc/b"]
    assert sorted(k for k in flat if k.startswith("a/inner/mu/")) == [
        "a/inner/mu/enc/w",
        "a/inner/mu/head/0",
    ]
    assert int(flat["a/count"]) == K and int(flat["a/inner/count/enc/w"]) == K
    hyper = gradtx.hyperparams(state)
    assert float(hyper["b/b1"]) == pytest.approx(0.8)
    assert float(hyper["b/learning_rate"]) == pytest.approx(0.1)


def test_a_value_set_in_optax_is_carried_over():
    otx = optax.inject_hyperparams(optax.adam)(learning_rate=1e-2)
    params = _params()
    opt_state = otx.init(params)
    opt_state.hyperparams["learning_rate"] = jnp.asarray(3e-3)
    state, _ = gradtx.from_optax(
        opt_state, gradtx.inject_hyperparams(gradtx.adam)(learning_rate=1e-2), params
    )
    assert float(gradtx.hyperparams(state)["learning_rate"]) == pytest.approx(3e-3)


def test_bf16_hyperparameters_rounded_by_optax_keep_gradtx_float32_values():
    params = {"w": jnp.ones(2, jnp.bfloat16)}
    opt_state = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3).init(params)
    assert float(opt_state.hyperparams["b2"]) == 1.0  # optax: 0.999 rounded to bfloat16
    opt_state.hyperparams["learning_rate"] = jnp.asarray(5e-4, jnp.bfloat16)  # changed
    tx = gradtx.inject_hyperparams(gradtx.adam)(learning_rate=1e-3)
    state, report = gradtx.from_optax(opt_state, tx, params)
    assert report.clean
    hyper = gradtx.hyperparams(state)
    assert hyper["b2"].dtype == jnp.float32 and float(hyper["b2"]) == np.float32(0.999)
    assert float(hyper["learning_rate"]) == float(jnp.asarray(5e-4, jnp.bfloat16))


# --- the report ----------------------------------------------------------------------------------


def test_report_is_load_state_dicts_and_statistics_start_anew():
    make_optax, make_gradtx = CASES["chain-clip-adamw"]
    params, opt_state = _optax_run(make_optax(), K)
    state, report = gradtx.from_optax(opt_state, make_gradtx(), params)
    assert isinstance(report, gradtx.LoadReport) and report.clean
    assert str(report) == "all keys matched"
    flat = gradtx.state_dict(state)
    assert float(flat["clip_by_global_norm/global_norm"]) == 0.0  # optax keeps no norm
    assert int(flat["adamw/count/enc/w"]) == K


def test_not_strict_reports_what_was_initialised_and_dropped():
    params, opt_state = _optax_run(optax.adam(1e-2), K)
    state, report = gradtx.from_optax(opt_state, gradtx.sgd(1e-2, 0.9), params, strict=False)
    assert report.missing == ("trace/enc/b", "trace/enc/w", "trace/head/0")
    assert set(report.unexpected) == {
        "count",
        *(f"{slot}/{p}" for slot in ("mu", "nu") for p in ("enc/w", "enc/b", "head/0")),
    }
    assert not report.mismatched
    assert float(jnp.sum(gradtx.state_dict(state)["trace/enc/w"] ** 2)) == 0.0


def test_a_moment_in_another_dtype_is_reported_changed():
    params = {"w": jnp.ones(2, jnp.bfloat16)}
    opt_state = optax.adam(1e-3, mu_dtype=jnp.float32).init(params)
    with pytest.raises(gradtx.StateMismatchError, match=r"changed: mu/w: loaded .*float32"):
        gradtx.from_optax(opt_state, gradtx.adam(1e-3), params)
    _, report = gradtx.from_optax(opt_state, gradtx.adam(1e-3), params, strict=False)
    assert list(report.mismatched) == ["mu/w"]
    _, report = gradtx.from_optax(opt_state, gradtx.adam(1e-3, mu_dtype=jnp.float32), params)
    assert report.clean


# --- errors --------------------------------------------------------------------------------------


def test_an_unsupported_optax_state_is_named_with_its_position():
    params = _params()
    opt_state = optax.chain(optax.clip_by_global_norm(1.0), optax.adabelief(1e-2)).init(params)
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adabelief(1e-2))
    with pytest.raises(ValueError, match=r"opt_state\[1\]\[0\] \(ScaleByBeliefState\) is not "):
        gradtx.from_optax(opt_state, tx, params)
    with pytest.raises(ValueError, match=r"without a value: adabelief/count/enc/b, "):
        gradtx.from_optax(opt_state, tx, params, strict=False)  # structure: raises either way


def test_a_stateful_schedule_state_is_refused():
    params = _params()
    opt_state = optax.inject_hyperparams(optax.adam)(learning_rate=1e-2).init(params)
    opt_state = opt_state._replace(hyperparams_states={"learning_rate": jnp.zeros(())})
    tx = gradtx.inject_hyperparams(gradtx.adam)(learning_rate=schedules.linear(1e-2, 0.0, 9))
    with pytest.raises(
        ValueError,
        match=r"opt_state.hyperparams_states\['learning_rate'\] .* is the state of a schedule; "
        r"gradtx's inject_hyperparams\(adam\) has a Polynomial as 'learning_rate'",
    ):
        gradtx.from_optax(opt_state, tx, params)


def _inject_linear(wrapped):
    schedule = schedules.linear(1e-1, 1e-3, 5)  # ends inside the six steps
    if wrapped:
        schedule = schedules.WrappedSchedule(schedule)
    return gradtx.inject_hyperparams(gradtx.adam)(learning_rate=schedule)


@pytest.mark.parametrize("wrapped", [False, True], ids=["schedule", "WrappedSchedule"])
def test_an_injected_optax_schedule_continues_as_optax_would(wrapped):
    otx = optax.inject_hyperparams(optax.adam)(learning_rate=optax.linear_schedule(1e-1, 1e-3, 5))
    params, opt_state = _optax_run(otx, 3)
    assert int(opt_state.hyperparams_states["learning_rate"].count) == 3
    tx = _inject_linear(wrapped)
    state, report = gradtx.from_optax(opt_state, tx, params)
    assert report.clean, report
    flat = gradtx.state_dict(state)
    assert int(flat["count"]) == 3
    if wrapped:  # the schedule's own count, carried over
        assert int(flat["schedule_states/learning_rate"]) == 3
    else:  # the schedule reads the injected count: nothing else to keep
        assert not any(k.startswith("schedule_states") for k in flat)
    got, state = _steps(tx, gradtx.apply_updates, params, state, 3)
    want, want_state = _optax_run(otx, 6)
    for path, value in gradtx.paths.leaves(want).items():
        np.testing.assert_allclose(
            gradtx.paths.leaves(got)[path], value, rtol=1e-5, atol=1e-7, err_msg=path
        )
    # the schedule has moved on: the last step used the sixth step's rate, as optax's did
    np.testing.assert_allclose(
        gradtx.hyperparams(state)["learning_rate"], want_state.hyperparams["learning_rate"]
    )


def test_a_schedule_count_apart_from_the_injected_count_is_refused():
    otx = optax.inject_hyperparams(optax.adam)(learning_rate=optax.linear_schedule(1e-1, 1e-3, 5))
    params, opt_state = _optax_run(otx, 3)
    own = opt_state.hyperparams_states["learning_rate"]
    opt_state = opt_state._replace(
        hyperparams_states={"learning_rate": own._replace(count=jnp.asarray(1, jnp.int32))}
    )
    with pytest.raises(
        ValueError, match=r"schedule for 'learning_rate' has taken 1 steps .* injected count is 3"
    ):
        gradtx.from_optax(opt_state, _inject_linear(False), params)
    state, _ = gradtx.from_optax(opt_state, _inject_linear(True), params)  # keeps its own
    assert int(gradtx.state_dict(state)["schedule_states/learning_rate"]) == 1


def test_an_optax_schedule_against_a_gradtx_number_is_refused():
    otx = optax.inject_hyperparams(optax.adam)(learning_rate=optax.linear_schedule(1e-1, 1e-3, 5))
    params, opt_state = _optax_run(otx, 2)
    tx = gradtx.inject_hyperparams(gradtx.adam)(learning_rate=1e-1)
    with pytest.raises(ValueError, match=r"\(WrappedScheduleState\) is the state of a schedule; "):
        gradtx.from_optax(opt_state, tx, params)


def test_another_gradtx_optimizer_names_the_optax_part_and_the_keys_left():
    params, opt_state = _optax_run(optax.adam(1e-2), K)
    with pytest.raises(gradtx.StateMismatchError) as info:
        gradtx.from_optax(opt_state, gradtx.sgd(1e-2, 0.9), params)
    message = str(info.value)
    assert "gradtx's sgd" in message
    assert "missing (3): trace/enc/b, trace/enc/w, trace/head/0" in message
    assert "opt_state[0] (ScaleByAdamState): mu/enc/b" in message
    assert info.value.report.missing == ("trace/enc/b", "trace/enc/w", "trace/head/0")


def test_another_chain_length_names_the_keys_left():
    params = _params()
    opt_state = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2)).init(params)
    with pytest.raises(
        ValueError,
        match=r"at opt_state \(a tuple of 2 states .*\) does not match gradtx's chain of 1 "
        r"step \['adamw'\]\. gradtx keys left without a value: adamw/count/enc/b",
    ):
        gradtx.from_optax(opt_state, gradtx.chain(gradtx.adamw(1e-2)), params)


def test_a_chain_in_optax_is_not_one_gradtx_optimizer():
    # clipping chained before adamw is not adamw: the nested chain is refused, not flattened
    params = _params()
    opt_state = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2)).init(params)
    with pytest.raises(ValueError, match=r"opt_state\[1\] .* gradtx's adamw, one optimizer"):
        gradtx.from_optax(opt_state, gradtx.adamw(1e-2), params)


def test_other_partition_labels_are_named():
    params = _params()
    opt_state = optax.multi_transform({"a": optax.adam(1e-2), "b": optax.sgd(1e-2)}, LABELS).init(
        params
    )
    tx = gradtx.partition(
        {"x": gradtx.adam(1e-2), "b": gradtx.sgd(1e-2)}, {"x": ["enc/w", "head/**"], "b": "enc/b"}
    )
    with pytest.raises(ValueError, match=r"the labels \['x', 'b'\] .*labels \['a', 'b'\]"):
        gradtx.from_optax(opt_state, tx, params)


def test_inject_hyperparams_against_a_plain_optimizer():
    params = _params()
    opt_state = optax.adam(1e-2).init(params)
    tx = gradtx.inject_hyperparams(gradtx.adam)(learning_rate=1e-2)
    with pytest.raises(ValueError, match=r"does not match gradtx's inject_hyperparams\(adam\)"):
        gradtx.from_optax(opt_state, tx, params)


@pytest.mark.parametrize(
    "make",
    [
        lambda: gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(0.1)),
        lambda: gradtx.apply_if_finite(
            gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1)), 2
        ),
        lambda: gradtx.chain(gradtx.monitor("g", ("global_norm", "norm")), gradtx.sgd(0.1)),
        lambda: gradtx.contrib.differentially_private_aggregate(1.0, 0.5, key=0),
    ],
    ids=["clip-adamw", "apply_if_finite", "monitor", "dp_aggregate"],
)
def test_the_statistics_started_anew_are_those_stats_reports(make):
    """Only statistics start anew: not a wrapper's inner state nor per-path keys kept in a
    statistics dict beside them."""
    from gradtx._state.stats import statistics_in

    state = make().init({"w": jnp.zeros(2), "b": jnp.zeros(1)})
    assert set(statistics_in(state)) == set(gradtx.stats(state))
    assert set(statistics_in(state)) <= set(gradtx.state_dict(state))


def test_injected_hyperparameters_are_kept_not_started_anew():
    from gradtx._state.stats import statistics_in

    tx = gradtx.inject_hyperparams(
        lambda learning_rate: gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.sgd(0.1))
    )(learning_rate=0.1)
    state = tx.init({"w": jnp.zeros(2)})
    assert sorted(statistics_in(state)) == [
        "inner/clip_by_global_norm/clipped",
        "inner/clip_by_global_norm/global_norm",
    ]
    assert "hyperparams/learning_rate" in gradtx.stats(state)
