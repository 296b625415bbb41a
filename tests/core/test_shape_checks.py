"""A parameter whose shape no longer matches its state, or its gradient, fails naming the path.

The state is made for the params `init` saw. A model edited since (a layer widened, a scalar
made a vector) meets that state with gradients of other shapes: the moments would broadcast
silently, or the math would fail deep inside JAX without a path. Each case raises naming the
path, both shapes and the fix (`gradtx.reconcile`), while tracing, so the compiled step does
not change.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx._layouts.step_counts import StepCounts

RECONCILE = re.escape("gradtx.reconcile(tx, state, params)")


def _optimizers() -> list[tuple[str, gradtx.Transformation]]:
    schedule = gradtx.schedules.cosine_decay(0.1, 10)
    return [
        ("adam", gradtx.adam(0.1)),  # moments and a step count
        ("sgd_schedule", gradtx.sgd(schedule)),  # a step count only
        ("sgd_momentum", gradtx.sgd(0.1, momentum=0.9)),  # a trace only, no count
        ("lion", gradtx.lion(0.1)),
        ("rmsprop", gradtx.rmsprop(0.1)),
        ("adafactor", gradtx.adafactor(0.1)),  # small matrices: a second moment like `w`
        ("chain", gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(0.1))),
        ("masked", gradtx.masked(gradtx.sgd(0.1, momentum=0.9), "w")),
    ]


CHANGES = [((4,), (5,)), ((3, 3), (3, 2)), ((2, 3), (3, 2)), ((3,), (3, 2)), ((), (4,))]


def _step(tx, old_shape, new_shape, jit):
    state = tx.init({"w": jnp.ones(old_shape), "b": jnp.ones(2)})
    new = {"w": jnp.full(new_shape, 0.5), "b": jnp.ones(2)}
    update = jax.jit(tx.update) if jit else tx.update
    return update(new, state, new)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("change", CHANGES, ids=lambda c: f"{c[0]}->{c[1]}")
@pytest.mark.parametrize("name,tx", _optimizers(), ids=[n for n, _ in _optimizers()])
def test_a_parameter_of_a_new_shape_raises_naming_path_shapes_and_reconcile(name, tx, change, jit):
    old_shape, new_shape = change
    if old_shape == () and name in ("sgd_momentum", "lion", "rmsprop", "masked"):
        # A scalar state (no count) broadcast over a vector: the tests make JAX refuse rank
        # promotion, so allow it, as JAX does by default, to see that the state would grow.
        context = jax.numpy_rank_promotion("allow")
    else:
        context = jax.numpy_rank_promotion("raise")
    message = (
        rf"the gradient at 'w' has shape {re.escape(str(new_shape))}, but the state there was "
        rf"made for a parameter of another shape: .*{re.escape(str(old_shape))}.*{RECONCILE}"
    )
    with context, pytest.raises(ValueError, match=message):
        _step(tx, old_shape, new_shape, jit)


def test_the_message_names_the_step_count_where_a_count_is_all_the_state():
    tx = gradtx.sgd(gradtx.schedules.cosine_decay(0.1, 10))
    with pytest.raises(ValueError, match=r"step count 'schedule_count' was made for shape \(\)"):
        _step(tx, (), (4,), jit=False)


def test_the_unchanged_shapes_pass_and_reconcile_fixes_a_changed_one():
    tx = gradtx.adam(0.1)
    old = {"w": jnp.ones((3, 3)), "b": jnp.ones(2)}
    state = tx.init(old)
    _, state = tx.update(old, state, old)
    new = {"w": jnp.full((3, 2), 0.5), "b": jnp.ones(2)}
    fixed, report = gradtx.reconcile(tx, state, new)
    assert report.reinitialised == ("w",)
    updates, fixed = tx.update(new, fixed, new)
    # `w` starts anew: Adam's first step is -lr * sign(g); `b` takes its second step.
    np.testing.assert_allclose(updates["w"], np.full((3, 2), -0.1), rtol=1e-6)
    assert int(fixed["count"]["w"]) == 1 and int(fixed["count"]["b"]) == 2
    assert fixed["count"].shape("w") == (3, 2) and fixed["count"].shape("b") == (2,)


def test_a_count_only_state_is_reconciled_too():
    tx = gradtx.sgd(gradtx.schedules.cosine_decay(0.1, 10))
    state = tx.init({"w": jnp.ones(())})
    new = {"w": jnp.ones(4)}
    fixed, _ = gradtx.reconcile(tx, state, new)
    updates, _ = tx.update(new, fixed, new)
    np.testing.assert_allclose(updates["w"], np.full(4, -0.1), rtol=1e-6)


def test_a_loaded_state_keeps_the_recorded_shapes():
    tx = gradtx.adam(0.1)
    params = {"w": jnp.ones((3, 3))}
    state, _ = gradtx.load_state_dict(tx, params, gradtx.state_dict(tx.init(params)))
    assert state["count"].shape("w") == (3, 3)
    # the same layout as `init`'s, so a step compiled for one runs the other
    assert jax.tree.structure(state) == jax.tree.structure(tx.init(params))
    with pytest.raises(ValueError, match=r"made for shape \(3, 3\)"):
        tx.update({"w": jnp.ones((3, 2))}, state)


def test_counts_record_each_parameters_own_shape_and_keep_it():
    tx = gradtx.adam(0.1)
    params = {"a": jnp.ones((2, 3)), "b": jnp.ones(4, jnp.complex64), "c": jnp.ones(())}
    counts = tx.init(params)["count"]
    assert isinstance(counts, StepCounts)
    assert [counts.shape(p) for p in "abc"] == [(2, 3), (4,), ()]
    # a partial update splits the counts per path; the shapes go along
    _, state = tx.update({**params, "b": None}, tx.init(params), params)
    assert len(state["count"].layout.groups) == 3
    assert [state["count"].shape(p) for p in "abc"] == [(2, 3), (4,), ()]
    # the same paths with other shapes are another layout (another compiled step)
    other = tx.init({"a": jnp.ones((3, 2)), "b": params["b"], "c": params["c"]})["count"]
    assert other.layout != counts.layout


def test_a_complex_parameter_is_checked_by_its_own_shape():
    tx = gradtx.sgd(0.1, momentum=0.9)
    state = tx.init({"z": jnp.ones(3, jnp.complex64)})
    new = {"z": jnp.ones(4, jnp.complex64)}
    with pytest.raises(ValueError, match=r"'z' has shape \(4,\).*'trace' has shape \(2, 3\)"):
        tx.update(new, state, new)
    # unchanged, it runs
    tx.update({"z": jnp.ones(3, jnp.complex64)}, state)


@pytest.mark.parametrize("packing", ["pack", "bucketed"])
def test_packed_and_bucketed_state_name_the_changed_leaf(packing):
    old = {"a": jnp.ones(3), "b": jnp.ones((2, 2))}
    new = {"a": jnp.ones(4), "b": jnp.ones((2, 2))}
    if packing == "pack":
        tx, old, new = gradtx.adam(0.1), gradtx.pack(old), gradtx.pack(new)
    else:
        tx = gradtx.bucketed(gradtx.adam(0.1))
    state = tx.init(old)
    with pytest.raises(
        ValueError,
        match=rf"packed gradient at 'a' has shape \(4,\).*made for a parameter of shape "
        rf"\(3,\).*{RECONCILE}",
    ):
        tx.update(new, state, new)
    fixed, _ = gradtx.reconcile(tx, state, new)
    tx.update(new, fixed, new)


def test_a_none_gradient_at_a_changed_path_is_no_update_and_no_error():
    tx = gradtx.adam(0.1)
    state = tx.init({"w": jnp.ones(3), "b": jnp.ones(2)})
    params = {"w": jnp.ones(5), "b": jnp.ones(2)}
    updates, new = tx.update({"w": None, "b": jnp.ones(2)}, state, params)
    assert updates["w"] is None
    np.testing.assert_array_equal(new["mu"]["w"], state["mu"]["w"])


# --- gradients against params ---------------------------------------------------------------


@pytest.mark.parametrize(
    "tx",
    [gradtx.sgd(0.1), gradtx.adam(0.1), gradtx.chain(gradtx.clip(1.0), gradtx.scale(2.0))],
    ids=["sgd", "adam", "stateless_chain"],
)
def test_a_gradient_of_another_shape_than_its_parameter_raises(tx):
    params = {"enc": {"w": jnp.ones((3, 3))}, "b": jnp.ones(2)}
    state = tx.init(params)
    grads = {"enc": {"w": jnp.ones((3, 2))}, "b": jnp.ones(2)}
    with pytest.raises(
        ValueError,
        match=r"at path 'enc/w' the update has shape \(3, 2\) but the parameter has shape "
        r"\(3, 3\)\. Each gradient must have its parameter's shape",
    ):
        tx.update(grads, state, params)


def test_gradients_may_differ_from_params_in_dtype_but_not_shape():
    tx = gradtx.adam(0.1)
    params = {"w": jnp.ones((2, 2))}
    state = tx.init(params)
    grads = {"w": jnp.ones((2, 2), jnp.bfloat16)}
    updates, _ = tx.update(grads, state, params)
    np.testing.assert_allclose(updates["w"], np.full((2, 2), -0.1), rtol=1e-2)
    with pytest.raises(ValueError, match=r"'w' the update has shape \(2,\)"):
        tx.update({"w": jnp.ones(2, jnp.bfloat16)}, state, params)


def test_per_example_gradients_keep_their_batch_axis():
    tx = gradtx.chain(gradtx.per_example_global_norm_clip(1.0), gradtx.adam(0.1))
    params = {"w": jnp.ones(3)}
    state = tx.init(params)
    updates, _ = tx.update({"w": jnp.ones((5, 3))}, state, params)
    assert updates["w"].shape == (3,)


def test_the_checks_leave_the_compiled_step_alone():
    tx = gradtx.adam(0.1)
    params = {"w": jnp.ones(3)}
    state = tx.init(params)

    def step(g, s, p):
        return tx.update(g, s, p)

    traced = jax.jit(step).trace(params, state, params)
    # no check survives into the program: it holds Adam's arithmetic only
    assert "cond" not in str(traced.jaxpr) and "assert" not in str(traced.jaxpr)
    # and eager calls reuse one compiled program
    before = gradtx._core.outermost_call._compiled._cache_size()
    for _ in range(3):
        _, state = tx.update(params, state, params)
    assert gradtx._core.outermost_call._compiled._cache_size() - before <= 1
