"""gradtx with real Flax NNX models: `nnx.Optimizer`, `nnx.jit`, paths, groups, state tools.

`nnx.Optimizer` keeps its `tx` as a static attribute, so a transformation must hold no JAX or
NumPy arrays: gradtx keeps hyperparameters given as numbers as `np.float32` scalars, which NNX
treats as static. An `nnx.State` holds one `Variable` (`nnx.Param`, `nnx.BatchStat`, ...) per
leaf; gradtx gives the value inside it the Variable's own path (`l1/kernel`, not
`l1/kernel/value`), so selectors, state keys and `explain` rows read like the model.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx
import gradtx._paths.paths as paths_module

nnx = pytest.importorskip("flax.nnx", reason="the Flax NNX integration tests need flax")

RTOL, ATOL = 1e-5, 1e-6  # float32: gradtx and optax round the same math differently by ulps
# After 20 Adam steps an ulp of difference in a small second moment shows up as ~1e-6 in a
# parameter near 0, so parameters are compared with a looser absolute tolerance.
PARAM_RTOL, PARAM_ATOL = 1e-5, 1e-5
PARAMS = ["bn/bias", "bn/scale", "l1/bias", "l1/kernel", "l2/bias", "l2/kernel"]
BATCH_STATS = ["bn/mean", "bn/var"]
STEPS = 20


class MLP(nnx.Module):
    """Linear, tanh, BatchNorm (params and batch statistics), Linear."""

    def __init__(self, rngs: Any) -> None:
        self.l1 = nnx.Linear(3, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)
        self.l2 = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.l2(self.bn(jnp.tanh(self.l1(x))))


def _model(seed: int = 0) -> MLP:
    return MLP(nnx.Rngs(seed))


def _data(seed: int = 1, n: int = 64) -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.PRNGKey(seed), (n, 3))
    y = jnp.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return x, y


def _loss(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


def _make_step(traces: list | None = None) -> Callable:
    @nnx.jit
    def step(model: MLP, optimizer: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        if traces is not None:
            traces.append(1)  # runs once per trace
        loss, grads = nnx.value_and_grad(_loss)(model, x, y)
        optimizer.update(model, grads)
        return loss

    return step


def _train(tx: Any, steps: int = STEPS) -> tuple[MLP, Any, list[float]]:
    model = _model()
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    step, (x, y) = _make_step(), _data()
    losses = [float(step(model, optimizer, x, y)) for _ in range(steps)]
    return model, optimizer, losses


def _train_optax(tx: Any, steps: int = STEPS) -> tuple[MLP, Any, list[float]]:
    """`_train` for the optax oracle, whose arithmetic mixes Python floats and int counts."""
    with jax.numpy_dtype_promotion("standard"):
        return _train(tx, steps)


def _no_data(tx: Any) -> bool:
    return not any(nnx.is_data(leaf) for leaf in jax.tree.leaves(tx))


def _arrays(model: MLP, kind: Any = nnx.Param) -> dict[str, np.ndarray]:
    return {p: np.asarray(v) for p, v in gradtx.paths.leaves(nnx.state(model, kind)).items()}


def _group(tree: Any) -> Any:
    """optax's labels for the partition below: the head is `l2`, the rest the body."""
    return jax.tree_util.tree_map_with_path(
        lambda kp, _: "head" if kp[0].key == "l2" else "body", tree
    )


GROUPS = {"head": "l2/**", "body": ["**", "!l2/**"]}

# (id, gradtx transformation, the same optimizer in optax)
CASES = [
    ("adamw", lambda: gradtx.adamw(1e-2), lambda: optax.adamw(1e-2)),
    (
        "clip-adamw",
        lambda: gradtx.chain(gradtx.clip_by_global_norm(0.5), gradtx.adamw(1e-2)),
        lambda: optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(1e-2)),
    ),
    (
        "partition",
        lambda: gradtx.partition(
            {"body": gradtx.adamw(1e-2, weight_decay=0.1), "head": gradtx.adamw(1e-3)}, GROUPS
        ),
        lambda: optax.multi_transform(
            {"body": optax.adamw(1e-2, weight_decay=0.1), "head": optax.adamw(1e-3)}, _group
        ),
    ),
]


# --- the mechanism: a transformation is static structure for NNX -------------------------------


@pytest.mark.parametrize("make", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_a_transformation_is_no_data_for_nnx(make):
    tx = make()
    assert _no_data(tx)
    for leaf in jax.tree.leaves(tx):
        assert isinstance(leaf, np.float32), leaf  # numbers are NumPy scalars: static for NNX


def test_an_explicit_array_stays_a_jax_array_and_nnx_says_so():
    tx = gradtx.adamw(jnp.asarray(1e-3))
    assert not _no_data(tx)
    with pytest.raises(ValueError, match="Static attributes should not contain data"):
        nnx.Optimizer(_model(), tx, wrt=nnx.Param)


# --- paths ------------------------------------------------------------------------------------


def test_paths_of_nnx_state_read_like_the_model():
    model = _model()
    assert gradtx.paths.paths(nnx.state(model, nnx.Param)) == PARAMS
    assert gradtx.paths.paths(nnx.state(model, nnx.BatchStat)) == BATCH_STATS
    assert gradtx.paths.paths(nnx.state(model)) == sorted(PARAMS + BATCH_STATS)
    # the pure state (`nnx.Optimizer.update` passes it) and the split state have the same paths
    assert gradtx.paths.paths(nnx.as_pure(nnx.state(model, nnx.Param))) == PARAMS
    _, params, _ = nnx.split(model, nnx.Param, ...)
    assert gradtx.paths.paths(params) == PARAMS


def test_a_variable_outside_a_state_and_a_variable_holding_a_tree():
    assert gradtx.paths.paths({"w": nnx.Param(jnp.ones(2))}) == ["w"]
    assert gradtx.paths.paths(nnx.Param(jnp.ones(2))) == [""]
    # A Variable whose value is a tree: its leaves keep their keys below the Variable's path.
    assert gradtx.paths.paths({"v": nnx.Param({"a": jnp.ones(1), "b": None})}) == ["v/a", "v/b"]


def test_paths_stay_unique_and_cached_per_structure():
    with pytest.raises(gradtx.paths.DuplicatePathError, match="'a/b'"):
        gradtx.paths.paths({"a/b": nnx.Param(jnp.ones(1)), "a": {"b": nnx.Param(jnp.ones(1))}})
    state = nnx.state(_model(), nnx.Param)
    treedef = jax.tree_util.tree_structure(state, is_leaf=lambda x: x is None)
    first = gradtx.paths.flatten(state)[0]
    assert paths_module._CACHE[treedef] is first
    assert gradtx.paths.flatten(nnx.state(_model(1), nnx.Param))[0] is first


def test_selectors_match_nnx_paths():
    params = nnx.state(_model(), nnx.Param)
    assert gradtx.paths.select(params, "**/kernel") == ["l1/kernel", "l2/kernel"]
    body = ["bn/bias", "bn/scale", "l1/bias", "l1/kernel"]
    assert gradtx.paths.select(params, ["**", "!l2/**"]) == body
    # a bool tree shaped like the params, made by mapping over the nnx.State
    big = jax.tree.map(lambda x: x.ndim == 2, params)
    assert gradtx.paths.select(params, big) == ["l1/kernel", "l2/kernel"]
    with pytest.raises(gradtx.paths.SelectorError, match="matches no path"):
        gradtx.paths.select(params, "**/kernel/value")


def test_tree_get_and_set_by_the_variables_path():
    params = nnx.state(_model(), nnx.Param)
    kernel = gradtx.tree.get(params, "l1/kernel")
    assert isinstance(kernel, jax.Array) and kernel.shape == (3, 16)
    new = gradtx.tree.set(params, "l1/bias", jnp.ones(16))
    assert isinstance(new["l1"]["bias"], nnx.Param)  # the Variable is kept, its value replaced
    np.testing.assert_array_equal(new["l1"]["bias"][...], np.ones(16))
    np.testing.assert_array_equal(params["l1"]["bias"][...], np.zeros(16))


# --- nnx.Optimizer and nnx.jit ----------------------------------------------------------------


@pytest.mark.parametrize(("name", "ours", "theirs"), CASES, ids=[c[0] for c in CASES])
def test_nnx_optimizer_trains_like_optax(name, ours, theirs):
    model, optimizer, losses = _train(ours())
    ref_model, _, ref_losses = _train_optax(theirs())
    assert losses[-1] < 0.5 * losses[0], losses
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL)
    for kind in (nnx.Param, nnx.BatchStat):
        got, want = _arrays(model, kind), _arrays(ref_model, kind)
        assert list(got) == list(want)
        for path in got:
            np.testing.assert_allclose(
                got[path], want[path], rtol=PARAM_RTOL, atol=PARAM_ATOL, err_msg=path
            )
    assert int(optimizer.step[...]) == STEPS


def test_eager_updates_work_too():
    model = _model()
    optimizer = nnx.Optimizer(model, gradtx.adamw(1e-2), wrt=nnx.Param)
    ref = _model()
    ref_optimizer = nnx.Optimizer(ref, optax.adamw(1e-2), wrt=nnx.Param)
    x, y = _data()
    for _ in range(3):
        optimizer.update(model, nnx.grad(_loss)(model, x, y))
        with jax.numpy_dtype_promotion("standard"):
            ref_optimizer.update(ref, nnx.grad(_loss)(ref, x, y))
    got, want = _arrays(model), _arrays(ref)
    for path in got:
        np.testing.assert_allclose(got[path], want[path], rtol=RTOL, atol=ATOL, err_msg=path)


def test_state_dict_keys_read_like_the_model():
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(1e-3))
    _, optimizer, _ = _train(tx, steps=2)
    keys = sorted(gradtx.state_dict(optimizer.opt_state))
    adamw = sorted(f"adamw/{slot}/{p}" for slot in ("count", "mu", "nu") for p in PARAMS)
    assert [k for k in keys if k.startswith("adamw/")] == adamw
    assert not [k for k in keys if k.endswith("/value")]
    # the state round-trips through its flat form, by path
    flat = {k: np.asarray(v) for k, v in gradtx.state_dict(optimizer.opt_state).items()}
    state, report = gradtx.load_state_dict(tx, nnx.state(_model(), nnx.Param), flat)
    assert report.clean
    assert gradtx.state_dict(state).keys() == flat.keys()


def test_explain_rows_read_like_the_model():
    tx = gradtx.partition(
        {"body": gradtx.adamw(1e-2, weight_decay=0.1, mask="**/kernel"), "head": gradtx.sgd(0.1)},
        GROUPS,
    )
    table = gradtx.explain(tx, nnx.state(_model(), nnx.Param))
    assert [row.path for row in table.rows] == PARAMS
    assert table["l1/kernel"].learning_rate == pytest.approx(1e-2)
    assert table["l1/kernel"].weight_decay == pytest.approx(0.1)
    assert table["l1/bias"].weight_decay == 0.0
    assert table["l2/kernel"].learning_rate == pytest.approx(0.1)
    assert table["l2/kernel"].steps[0] == "[head]"
    assert "l1/kernel/value" not in str(table)


def test_partition_groups_get_their_own_learning_rates():
    # A group with learning rate 0 does not move: the head stays as initialised.
    tx = gradtx.partition({"body": gradtx.adam(1e-2), "head": gradtx.sgd(0.0)}, GROUPS)
    model, _, _ = _train(tx, steps=3)
    before, after = _arrays(_model()), _arrays(model)
    for path in PARAMS:
        moved = not np.array_equal(before[path], after[path])
        assert moved == (not path.startswith("l2/")), path


def test_apply_updates_matches_the_nnx_state_by_path():
    model = _model()
    before = _arrays(model)
    updates = {"l1": {"kernel": jnp.ones((3, 16))}}  # only one path, as a plain dict
    new = gradtx.apply_updates(nnx.state(model, nnx.Param), updates)
    assert gradtx.paths.paths(new) == PARAMS
    nnx.update(model, new)
    after = _arrays(model)
    np.testing.assert_allclose(after["l1/kernel"], before["l1/kernel"] + 1)
    for path in [p for p in PARAMS if p != "l1/kernel"]:
        np.testing.assert_array_equal(after[path], before[path], err_msg=path)


# --- what a new learning rate costs ------------------------------------------------------------


def test_a_new_static_learning_rate_retraces_the_step():
    model, (x, y), traces = _model(), _data(), []
    optimizer = nnx.Optimizer(model, gradtx.adamw(1e-2), wrt=nnx.Param)
    step = _make_step(traces)
    step(model, optimizer, x, y)
    step(model, optimizer, x, y)
    assert len(traces) == 1
    # The transformation is static structure of the optimizer: a new value is a new program.
    optimizer.tx = gradtx.adamw(1e-3)
    step(model, optimizer, x, y)
    assert len(traces) == 2


def test_inject_hyperparams_changes_the_learning_rate_without_retracing():
    model, (x, y), traces = _model(), _data(), []
    tx = gradtx.inject_hyperparams(gradtx.adamw)(learning_rate=1e-2)
    assert _no_data(tx)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    step = _make_step(traces)
    step(model, optimizer, x, y)
    step(model, optimizer, x, y)
    # The values live in the optimizer state, which NNX treats as data.
    state = gradtx.set_hyperparams(nnx.as_pure(optimizer.opt_state), {"learning_rate": 0.0})
    nnx.update(optimizer.opt_state, nnx.state(state))
    assert float(gradtx.hyperparams(nnx.as_pure(optimizer.opt_state))["learning_rate"]) == 0.0
    before = _arrays(model)
    step(model, optimizer, x, y)
    assert len(traces) == 1
    after = _arrays(model)
    for path in PARAMS:  # a zero learning rate (and so no weight decay either) moves nothing
        np.testing.assert_array_equal(after[path], before[path], err_msg=path)


def test_a_schedule_runs_inside_nnx_optimizer():
    schedule = gradtx.schedules.warmup_cosine_decay(0.0, 1e-2, 5, STEPS)
    _, _, losses = _train(gradtx.adamw(schedule))
    reference = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-2, 5, STEPS))
    _, _, ref_losses = _train_optax(reference)
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("schedule", "reference"),
    [
        (
            gradtx.schedules.piecewise_constant(1e-2, {10: 0.1}),
            optax.piecewise_constant_schedule(1e-2, {10: 0.1}),
        ),
        (
            gradtx.schedules.join(
                [gradtx.schedules.linear(0.0, 1e-2, 5), gradtx.schedules.constant(1e-2)], [5]
            ),
            optax.join_schedules(
                [optax.linear_schedule(0.0, 1e-2, 5), optax.constant_schedule(1e-2)], [5]
            ),
        ),
        (
            gradtx.schedules.cosine_onecycle(STEPS, 1e-2),
            optax.cosine_onecycle_schedule(STEPS, 1e-2),
        ),
    ],
    ids=["piecewise_constant", "join", "cosine_onecycle"],
)
def test_schedules_made_of_pieces_go_in_directly(schedule, reference):
    # Their boundaries and values are tuples of NumPy scalars: static to NNX, leaves to JAX.
    _, _, losses = _train(gradtx.adamw(schedule))
    _, _, ref_losses = _train_optax(optax.adamw(reference))
    np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "make",
    [
        lambda: gradtx.noisy_sgd(0.01, seed=3),
        lambda: gradtx.add_noise(0.01, 0.55, seed=1),
        lambda: gradtx.contrib.muon(0.01),
        lambda: gradtx.contrib.muon(0.01, ns_coeffs="dion"),
    ],
    ids=["noisy_sgd", "add_noise", "contrib.muon", "contrib.muon-dion"],
)
def test_an_int_seed_and_newton_schulz_coefficients_are_static(make):
    # An int seed's key words and muon's coefficients are tuples of NumPy scalars.
    tx = make()
    assert _no_data(tx)
    _, _, losses = _train(tx, steps=3)
    assert np.all(np.isfinite(losses))
    # The same run with the transformation built inside the step: the same losses.
    _, _, plain = _train(gradtx.inject_hyperparams(lambda: make())(), steps=3)
    np.testing.assert_allclose(losses, plain, rtol=RTOL, atol=ATOL)


def test_a_key_given_as_a_jax_array_is_data():
    # A typed or raw JAX key is data (NNX refuses it as static); inject_hyperparams keeps
    # the factory's arguments static and builds the transformation inside the step.
    assert not _no_data(gradtx.noisy_sgd(0.01, seed=jax.random.key(3)))
    tx = gradtx.inject_hyperparams(gradtx.noisy_sgd)(learning_rate=0.01)
    assert _no_data(tx)
    _, _, losses = _train(tx, steps=3)
    assert np.all(np.isfinite(losses))


# --- resuming: a checkpoint put into a new `nnx.Optimizer` -------------------------------------


def _resume(tx: Any, file: Any) -> tuple[MLP, Any]:
    """A new model and optimizer (other weights), the checkpoint put in whole."""
    model = _model(seed=7)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    params, state, report = gradtx.restore(file, tx, nnx.state(model, nnx.Param))
    assert report.clean
    nnx.update(model, params)
    optimizer.opt_state = jax.tree.map(nnx.OptArray, state)
    return model, optimizer


@pytest.mark.parametrize("make", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_a_checkpoint_resumes_into_a_new_optimizer_and_goes_on_alike(make, tmp_path):
    tx = make()
    model, optimizer, _ = _train(tx, steps=3)
    file = tmp_path / "checkpoint.safetensors"
    params = nnx.as_pure(nnx.state(model, nnx.Param))
    gradtx.save(file, params, nnx.as_pure(optimizer.opt_state), tx=tx)
    resumed_model, resumed = _resume(tx, file)
    # the model's batch statistics are no params: carry them over as Flax does
    nnx.update(resumed_model, nnx.state(model, nnx.BatchStat))
    step, (x, y) = _make_step(), _data()
    going_on = [float(step(model, optimizer, x, y)) for _ in range(4)]
    resumed_on = [float(step(resumed_model, resumed, x, y)) for _ in range(4)]
    assert resumed_on == going_on  # the same compiled step on the same values: bit for bit
    for path, value in _arrays(model).items():
        np.testing.assert_array_equal(_arrays(resumed_model)[path], value, err_msg=path)


def _per_path_counts(tx: Any) -> tuple[MLP, Any, dict]:
    """A trained optimizer and its flat state, one count changed: counts grouped apart."""
    model, optimizer, _ = _train(tx, steps=2)
    flat = dict(gradtx.state_dict(nnx.as_pure(optimizer.opt_state)))
    flat["count/l1/bias"] = np.int32(9)
    return model, optimizer, flat


def test_a_state_grouped_otherwise_goes_in_whole_and_nnx_update_names_the_fix():
    tx = gradtx.adamw(1e-2)
    model, optimizer, flat = _per_path_counts(tx)
    state, report = gradtx.load_state_dict(tx, nnx.state(model, nnx.Param), flat)
    assert report.clean and len(state["count"].layout.groups) == 2
    fix = re.escape("optimizer.opt_state = jax.tree.map(nnx.OptArray, state)")
    with pytest.raises(ValueError, match=rf"cannot write these step counts in place.*{fix}"):
        nnx.update(optimizer.opt_state, nnx.state(state))
    # the plain state (not `nnx.state(state)`): the same message, not "Cannot set key"
    with pytest.raises(ValueError, match=rf"no group 'bn/bias'.*{fix}"):
        nnx.update(optimizer.opt_state, state)
    optimizer.opt_state = jax.tree.map(nnx.OptArray, state)
    step, (x, y) = _make_step(), _data()
    step(model, optimizer, x, y)
    counts = gradtx.state_dict(nnx.as_pure(optimizer.opt_state))
    assert int(counts["count/l1/bias"]) == 10 and int(counts["count/l1/kernel"]) == 3


def test_a_state_grouped_alike_is_written_in_place():
    tx = gradtx.chain(gradtx.clip_by_global_norm(0.5), gradtx.adamw(1e-2))
    model, optimizer, _ = _train(tx, steps=2)
    flat = gradtx.state_dict(nnx.as_pure(optimizer.opt_state))
    other = nnx.Optimizer(_model(seed=3), tx, wrt=nnx.Param)
    state, _ = gradtx.load_state_dict(tx, nnx.state(model, nnx.Param), flat)
    nnx.update(other.opt_state, nnx.state(state))
    got = gradtx.state_dict(nnx.as_pure(other.opt_state))
    for key, value in flat.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
