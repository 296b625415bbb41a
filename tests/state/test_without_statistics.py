"""`gradtx.without_statistics`: the same steps, a state without the statistics kept on the side."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compiled import donated_step_program

import gradtx

PARAMS = {"enc": {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}, "head": {"w": jnp.ones(2)}}
SCHEDULE = gradtx.schedules.linear(0.1, 0.0, 10)


def _grads(step: int):
    return jax.tree.map(lambda p: jnp.full_like(p, 0.5 + step), PARAMS)


def _loss(params):
    return sum(jnp.sum((x - 2.0) ** 2) for x in jax.tree.leaves(params))


def _run(tx, steps: int = 3, params=PARAMS, grads=_grads, **extra):
    """The updates of `steps` jitted steps, and the last state."""

    @jax.jit
    def step(params, state, grads):
        kwargs = {k: f(params) for k, f in extra.items()}
        updates, state = tx.update(grads, state, params, **kwargs)
        return updates, gradtx.apply_updates(params, updates), state

    state, history = tx.init(params), []
    for k in range(steps):
        g = grads(k) if callable(grads) else jax.grad(_loss)(params)
        updates, params, state = step(params, state, g)
        history.append(updates)
    return history, state


def _assert_the_same_steps_without_the_statistics(tx, **kwargs):
    """Bit for bit the same updates; the state is the full one less the statistics it lost."""
    full_updates, full_state = _run(tx, **kwargs)
    lean_updates, lean_state = _run(gradtx.without_statistics(tx), **kwargs)
    for full, lean in zip(full_updates, lean_updates, strict=True):
        jax.tree.map(np.testing.assert_array_equal, full, lean)
    kept = set(gradtx.stats(lean_state))
    assert kept <= set(gradtx.stats(full_state))
    lost = set(gradtx.stats(full_state)) - kept
    want = {k: v for k, v in gradtx.state_dict(full_state).items() if k not in lost}
    got = gradtx.state_dict(lean_state)
    assert sorted(got) == sorted(want)
    jax.tree.map(np.testing.assert_array_equal, got, want)
    return full_state, lean_state


@pytest.mark.parametrize(
    "make",
    [
        lambda: gradtx.clip_by_global_norm(1.0),
        lambda: gradtx.scale_by_schedule(SCHEDULE),
        lambda: gradtx.adamw(SCHEDULE, weight_decay=0.01),
        lambda: gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.sgd(SCHEDULE, 0.9)),
    ],
    ids=["clip_by_global_norm", "scale_by_schedule", "adamw-schedule", "clip-sgd-schedule"],
)
def test_each_statistic_kept_on_the_side_is_left_out(make):
    full, lean = _assert_the_same_steps_without_the_statistics(make())
    assert gradtx.stats(full) and gradtx.stats(lean) == {}


@pytest.mark.parametrize("search", ["zoom", "backtracking"])
def test_the_line_searches_keep_no_info(search):
    linesearch = (
        gradtx.scale_by_zoom_linesearch(10)
        if search == "zoom"
        else gradtx.scale_by_backtracking_linesearch(10, store_grad=True)
    )
    tx = gradtx.lbfgs(memory_size=3, linesearch=linesearch)
    extra = {"value": _loss, "grad": jax.grad(_loss), "value_fn": lambda p: _loss}
    full, lean = _assert_the_same_steps_without_the_statistics(tx, grads=None, **extra)
    assert any(k.startswith("info/") for k in gradtx.stats(full))
    assert gradtx.stats(lean) == {}


@pytest.mark.parametrize(
    ("make", "counts"),
    [
        (lambda: gradtx.per_example_layer_norm_clip(1.0), 3),
        (lambda: gradtx.per_example_global_norm_clip(1.0), 1),
        (lambda: gradtx.contrib.differentially_private_aggregate(1.0, 0.5, key=3), 1),
        (lambda: gradtx.contrib.dpsgd(SCHEDULE, 1.0, 0.5, seed=3, momentum=0.9), 2),
    ],
    ids=["layer_norm_clip", "global_norm_clip", "dp_aggregate", "dpsgd-schedule"],
)
def test_per_example_clipping_keeps_no_counts(make, counts):
    """The counts of clipped examples are statistics: `stats` reports them (with dpsgd's
    scheduled rate) and the lean state leaves them out; the noise keys stay."""
    batched = jax.tree.map(lambda p: jnp.stack([p, -3 * p, 0.1 * p]), PARAMS)
    full, lean = _assert_the_same_steps_without_the_statistics(
        make(), grads=lambda k: jax.tree.map(lambda g: g * (k + 1), batched)
    )
    assert len(gradtx.stats(full)) == counts and gradtx.stats(lean) == {}
    assert not any("num_clipped" in key for key in gradtx.state_dict(lean))


def test_a_whole_setup_keeps_its_monitors_and_the_state_that_decides_its_steps():
    """Monitors, apply_if_finite's counts and injected hyperparameters stay; inside
    `inject_hyperparams` and `partition`, the inner statistics go."""
    encoder = gradtx.chain(
        gradtx.monitor("grad", ("global_norm", "norm")),
        gradtx.inject_hyperparams(
            lambda learning_rate: gradtx.chain(
                gradtx.clip_by_global_norm(1.0), gradtx.adamw(learning_rate)
            )
        )(learning_rate=SCHEDULE),
    )
    groups = gradtx.partition(
        {"encoder": encoder, "head": gradtx.sgd(SCHEDULE)},
        {"encoder": "enc/**", "head": "head/**"},
    )
    tx = gradtx.chain(
        gradtx.clip_by_global_norm(1.0), gradtx.apply_if_finite(groups, max_consecutive_errors=2)
    )
    _, lean = _assert_the_same_steps_without_the_statistics(tx)
    inner = "apply_if_finite/inner/encoder"
    assert sorted(gradtx.stats(lean)) == sorted(
        [
            "apply_if_finite/last_finite",
            "apply_if_finite/notfinite_count",
            "apply_if_finite/total_notfinite",
            f"{inner}/grad/global_norm",
            f"{inner}/grad/norm/enc/b",
            f"{inner}/grad/norm/enc/w",
            f"{inner}/<lambda>/hyperparams/learning_rate",
        ]
    )


def test_a_transformation_without_such_statistics_comes_back_unchanged():
    adam = gradtx.adam(1e-3)
    lean = gradtx.without_statistics(adam)
    assert repr(lean) == repr(adam)
    assert jax.tree.structure(lean) == jax.tree.structure(adam)
    foreign = optax.adam(1e-3)
    assert gradtx.without_statistics(foreign) == foreign
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes dtypes
        _assert_the_same_steps_without_the_statistics(gradtx.chain(foreign, gradtx.clip(1.0)))


def test_a_checkpoint_of_the_full_state_loads_into_the_lean_one():
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(SCHEDULE))
    full_updates, full_state = _run(tx)
    lean_tx = gradtx.without_statistics(tx)
    lean_state, report = gradtx.load_state_dict(
        lean_tx, PARAMS, gradtx.state_dict(full_state), strict=False
    )
    assert sorted(report.unexpected) == sorted(gradtx.stats(full_state))
    assert not report.missing and not report.mismatched
    _, want = _run(lean_tx)
    jax.tree.map(np.testing.assert_array_equal, lean_state, want)


# A kernel of the compiled step, or a copy (each is a call on the host).
_CALL = re.compile(r"= \S+ (?:fusion|copy|custom-call)\(")


def test_a_packed_clipped_chain_compiles_to_optaxs_size():
    """Without statistics, the step returns the arrays optax's returns and runs no more
    kernels: the statistics were three arrays out, and kernels to compute them."""
    params = gradtx.pack({"w": jnp.ones((4, 8)), "b": jnp.zeros(8)})
    grads = jax.tree.map(lambda x: x + 0.5, params)
    schedule = gradtx.schedules.warmup_cosine_decay(0.0, 1e-3, 100, 10_000)
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(schedule, weight_decay=0.01))
    oschedule = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 100, 10_000)
    otx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(oschedule, weight_decay=0.01))

    def size(tx, apply=None):
        program = donated_step_program(tx, params, grads, apply)
        root = program[program.index("ROOT") :].splitlines()[0]
        return len(_CALL.findall(program)), root.count("[")

    full_calls, full_outputs = size(tx)
    lean_calls, lean_outputs = size(gradtx.without_statistics(tx))
    with jax.numpy_dtype_promotion("standard"):  # optax's schedule mixes dtypes
        optax_calls, optax_outputs = size(otx, optax.apply_updates)
    assert lean_outputs == optax_outputs == full_outputs - 3
    assert lean_calls <= optax_calls and lean_calls < full_calls
