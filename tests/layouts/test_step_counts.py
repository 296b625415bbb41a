"""Per-path step counts are stored as one scalar while all paths count alike."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from registry import REGISTRY

import gradtx
from gradtx._core.per_array import PerArrayTransform
from gradtx._layouts.step_counts import StepCounts, group_counts, split_where_absent


def _params(n: int = 6) -> dict:
    return {f"w{i}": jnp.full((3,), 0.1 * (i + 1)) for i in range(n)}


def _grads(params: dict, scale: float = 1.0) -> dict:
    return jax.tree.map(lambda p: scale * jnp.cos(p), params)


def test_full_updates_keep_one_count_for_all_paths():
    tx = gradtx.chain(
        gradtx.clip_by_global_norm(1.0),
        gradtx.adamw(gradtx.schedules.warmup_cosine_decay(0.0, 0.1, 2, 10)),
    )
    params = _params(50)
    state = tx.init(params)
    step = jax.jit(lambda s, g: tx.update(g, s, params))
    for i in range(3):
        _, state = step(state, _grads(params, i + 1.0))
    counts = state["adamw"]["count"]
    assert isinstance(counts, StepCounts)
    assert len(jax.tree.leaves(counts)) == 1
    assert len(jax.tree.leaves(state["adamw"]["schedule_count"])) == 1
    assert {int(v) for v in counts.values()} == {3}
    assert sorted(counts) == sorted(params)
    assert int(counts["w7"]) == 3 and "w7" in counts and "nope" not in counts


def test_the_compiled_step_carries_one_count():
    tx = gradtx.adam(0.1)
    params = _params(40)
    state = tx.init(params)
    hlo = jax.jit(tx.update).lower(_grads(params), state).as_text()
    assert hlo.count("tensor<i32>") >= 1
    # 40 leaves: one int32 scalar in, one out (plus nothing per leaf).
    entry = hlo[hlo.index("func.func public @main") :].split("\n", 1)[0]
    assert entry.count("tensor<i32>") == 2


def test_a_partial_update_counts_per_path_from_then_on():
    tx = gradtx.adam(0.1)
    params = _params(4)
    state = tx.init(params)
    traces = []

    @jax.jit
    def step(state, grads):
        traces.append(None)
        return tx.update(grads, state, params)

    partial = {**_grads(params), "w1": None, "w3": None}
    _, state = step(state, _grads(params))
    _, state = step(state, partial)
    counts = state["count"]
    assert {p: int(c) for p, c in counts.items()} == {"w0": 2, "w1": 1, "w2": 2, "w3": 1}
    assert len(jax.tree.leaves(counts)) == 4
    # From now on the layout stays: any pattern of updates reuses the compiled step.
    _, state = step(state, partial)
    _, state = step(state, {**_grads(params), "w0": None})
    _, state = step(state, _grads(params))
    # Three patterns of gradients, each traced once with per-path counts; the first two
    # were traced with shared counts before.
    assert len(traces) == 5
    assert {p: int(c) for p, c in state["count"].items()} == {
        "w0": 4,
        "w1": 3,
        "w2": 5,
        "w3": 3,
    }


def test_a_partial_update_equals_separate_optimizers():
    tx = gradtx.adam(0.1)
    params = _params(4)
    first = {k: params[k] for k in ("w0", "w1")}
    second = {k: params[k] for k in ("w2", "w3")}
    joint, a, b = tx.init(params), tx.init(first), tx.init(second)
    for i in range(4):
        g = _grads(params, 1.0 + i)
        if i % 2:
            part = {k: (g[k] if k in second else None) for k in g}
            _, b = tx.update({k: g[k] for k in second}, b)
        else:
            part = {k: (g[k] if k in first else None) for k in g}
            _, a = tx.update({k: g[k] for k in first}, a)
        _, joint = tx.update(part, joint)
    separate = {**gradtx.state_dict(a), **gradtx.state_dict(b)}
    together = gradtx.state_dict(joint)
    assert sorted(separate) == sorted(together)
    for key, value in separate.items():
        np.testing.assert_array_equal(together[key], value, err_msg=key)


def test_a_checkpoint_groups_equal_counts():
    tx = gradtx.adam(0.1)
    params = _params(4)
    flat = gradtx.state_dict(tx.init(params))
    flat.update({"count/w0": np.int32(2), "count/w1": np.int32(5), "count/w2": np.int32(2)})
    state, report = gradtx.load_state_dict(tx, params, flat)
    assert report.clean
    counts = state["count"]
    assert counts.layout.groups == (("w0", "w2"), ("w1",), ("w3",))
    assert list(counts) == ["w0", "w1", "w2", "w3"]  # tree order, whatever the grouping
    assert {p: int(c) for p, c in counts.items()} == {"w0": 2, "w1": 5, "w2": 2, "w3": 0}
    assert gradtx.state_dict(state)["count/w1"] == 5


def test_skipped_steps_keep_the_layout_of_a_partial_update():
    params = _params(3)
    partial = {**_grads(params), "w2": None}
    for tx in (
        gradtx.apply_if_finite(gradtx.adam(0.1), 2),
        gradtx.conditionally_mask(gradtx.adam(0.1), lambda step: step % 2 == 1),
        gradtx.accumulate(gradtx.adam(0.1), 2),
    ):
        state = tx.init(params)
        step = jax.jit(tx.update)
        for _ in range(3):
            _, state = step(partial, state)
        leaves = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, StepCounts))
        counts = [x for x in leaves if isinstance(x, StepCounts)]
        assert counts and all(int(c["w2"]) == 0 for c in counts), type(tx).__name__


def test_abstract_init_has_the_layout_of_init():
    tx = gradtx.adamw(gradtx.schedules.cosine_decay(0.1, 10))
    params = _params(5)
    assert jax.tree.structure(jax.eval_shape(tx.init, params)) == jax.tree.structure(
        tx.init(params)
    )
    assert jax.tree.structure(jax.jit(tx.init)(params)) == jax.tree.structure(tx.init(params))


_PARAM = jnp.linspace(0.5, 1.5, 12).reshape(3, 4)


def _with_shared_counts(tx) -> list[PerArrayTransform]:
    """The per-array transformations in `tx` whose state keeps `StepCounts`."""
    found = jax.tree.leaves(tx, is_leaf=lambda x: isinstance(x, PerArrayTransform))
    out = []
    for x in found:
        if not isinstance(x, PerArrayTransform):
            continue
        state = x.init({"w": _PARAM})
        if isinstance(state, dict) and any(isinstance(v, StepCounts) for v in state.values()):
            out.append(x)
    return out


_COUNTING = {
    type(x).__name__: x for entry in REGISTRY for x in _with_shared_counts(entry.make(0.1))
}


@pytest.mark.parametrize("name", sorted(_COUNTING))
def test_step_count_slots_start_at_zero_and_advance_by_one(name):
    # The lifting helper advances these slots itself, so the per-array math must agree.
    tx = _COUNTING[name]
    param = _PARAM
    slots = tx.init_leaf(param)
    counts = [k for k in tx.state_keys() if k in tx.step_count_slots]
    for key in counts:
        assert slots[key].shape == () and slots[key].dtype == jnp.int32
        assert int(slots[key]) == 0
        slots[key] = jnp.int32(7)
    _, changed = tx.update_leaf(jnp.cos(param), slots, param)
    for key in counts:
        assert int(changed[key]) == 8, key


def test_slots_of_the_same_paths_grouped_apart_are_split_before_a_cond():
    one = jnp.int32(1)
    together = StepCounts.shared(["a", "b"], one)
    apart = group_counts({"a": one, "b": jnp.int32(2)})
    fewer = StepCounts.shared(["a"], one)
    grads = {"a": jnp.ones(2), "b": jnp.ones(2)}
    state = {"inner": {"count": together, "weight_sum": apart, "other": fewer}}
    split = split_where_absent(state, grads)["inner"]
    # The two slots over a and b, grouped differently, are read per path from now on ...
    assert len(jax.tree.leaves(split["count"])) == 2
    assert {p: int(v) for p, v in split["count"].items()} == {"a": 1, "b": 1}
    assert split["weight_sum"] is apart
    # ... and a slot over other paths keeps its groups.
    assert split["other"] is fewer
    # Grouped alike, nothing changes.
    alike = {"count": together, "weight_sum": StepCounts.shared(["a", "b"], one)}
    assert split_where_absent(alike, grads)["count"] is together


def test_nnx_keys_name_a_group_by_its_first_path_and_its_size():
    """Flax NNX sees one key per group of counts: the path itself for a group of one."""
    params = {"a": jnp.ones(2), "b": jnp.ones(3), "c": jnp.ones(1)}
    tx = gradtx.adam(0.1)
    state = tx.init(params)
    assert state["count"].layout.nnx_keys() == ("a (+2)",)
    grads = {"a": jnp.ones(2), "b": None, "c": jnp.ones(1)}
    _, state = tx.update(grads, state, params)
    assert sorted(state["count"].layout.nnx_keys()) == ["a", "b", "c"]
