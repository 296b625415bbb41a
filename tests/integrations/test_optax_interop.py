"""optax both ways: optax transformations inside gradtx combinators, gradtx ones inside optax's.

Each mixed optimizer runs 10 jitted steps next to its all-optax (or all-gradtx) equivalent and
must give the same params within float32 rounding. The wrapped optax state is keyed by name
(`chain/scale_by_adam/mu/w`), loads back from `state_dict`, and `explain` reads the learning
rate of an `optax.inject_hyperparams` state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx

LR = 0.05
STEPS = 10
RTOL, ATOL = 1e-5, 1e-6  # float32: the two sides may round the same math differently


def _params() -> dict:
    rng = np.random.default_rng(0)
    return {
        "enc": {"w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32), "b": jnp.zeros(3)},
        "head": {"w": jnp.asarray(rng.normal(size=3), jnp.float32), "b": jnp.zeros(())},
    }


def _grads(step: int) -> dict:
    rng = np.random.default_rng(100 + step)
    return jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), _params())


# optax's masks and labels are trees shaped like the params.
W_MASK = {"enc": {"w": True, "b": False}, "head": {"w": True, "b": False}}
ENC_MASK = {"enc": {"w": True, "b": True}, "head": {"w": False, "b": False}}
LABELS = {"enc": {"w": "enc", "b": "enc"}, "head": {"w": "head", "b": "head"}}
GROUPS = {"enc": "enc/**", "head": "head/**"}


def _run(tx: Any, steps: int = STEPS) -> tuple[dict, Any]:
    """`steps` jitted steps; optax's own arithmetic runs under standard promotion."""

    @jax.jit
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    params = _params()
    with jax.numpy_dtype_promotion("standard"):
        state = tx.init(params)
        for i in range(steps):
            params, state = step(params, state, _grads(i))
    return params, state


def _assert_close(a: Any, b: Any) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for path, x in gradtx.paths.leaves(a).items():
        np.testing.assert_allclose(x, gradtx.paths.leaves(b)[path], rtol=RTOL, atol=ATOL)


def _schedule() -> Callable:
    return optax.linear_schedule(LR, LR / 10, STEPS)


# --- optax inside gradtx -----------------------------------------------------------------------

# (id, mixed: gradtx combinators around optax pieces, oracle: the same in optax alone)
OPTAX_INSIDE_GRADTX = [
    ("chain-adam", lambda: gradtx.chain(optax.adam(LR)), lambda: optax.adam(LR)),
    (
        "chain-clip-adam",
        lambda: gradtx.chain(optax.clip_by_global_norm(1.0), optax.adam(LR)),
        lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(LR)),
    ),
    (
        "chain-gradtx-clip-optax-adam",
        lambda: gradtx.chain(gradtx.clip_by_global_norm(1.0), optax.adam(LR)),
        lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(LR)),
    ),
    (
        "chain-optax-masked",
        lambda: gradtx.chain(optax.masked(optax.adam(LR), W_MASK), gradtx.scale(0.5)),
        lambda: optax.chain(optax.masked(optax.adam(LR), W_MASK), optax.scale(0.5)),
    ),
    (
        "chain-inject-adam",
        lambda: gradtx.chain(
            optax.clip_by_global_norm(1.0),
            optax.inject_hyperparams(optax.adam)(learning_rate=_schedule()),
        ),
        lambda: optax.chain(
            optax.clip_by_global_norm(1.0),
            optax.inject_hyperparams(optax.adam)(learning_rate=_schedule()),
        ),
    ),
    (
        "partition-adam-sgd",
        lambda: gradtx.partition(
            {
                "enc": optax.adam(LR),
                "head": optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(LR, 0.9)),
            },
            GROUPS,
        ),
        lambda: optax.multi_transform(
            {
                "enc": optax.adam(LR),
                "head": optax.chain(optax.clip_by_global_norm(0.5), optax.sgd(LR, 0.9)),
            },
            LABELS,
        ),
    ),
    (
        "partition-inject-masked",
        lambda: gradtx.partition(
            {
                "enc": optax.inject_hyperparams(optax.adam)(learning_rate=_schedule()),
                "head": optax.masked(optax.adam(LR), W_MASK),
            },
            GROUPS,
        ),
        lambda: optax.multi_transform(
            {
                "enc": optax.inject_hyperparams(optax.adam)(learning_rate=_schedule()),
                "head": optax.masked(optax.adam(LR), W_MASK),
            },
            LABELS,
        ),
    ),
    (
        "masked-adam",
        lambda: gradtx.masked(optax.adam(LR), "**/w"),
        lambda: optax.masked(optax.adam(LR), W_MASK),
    ),
    (
        "masked-clip",
        lambda: gradtx.masked(optax.clip_by_global_norm(0.1), "enc/**"),
        lambda: optax.masked(optax.clip_by_global_norm(0.1), ENC_MASK),
    ),
    (
        "masked-inject-adam",
        lambda: gradtx.masked(
            optax.inject_hyperparams(optax.adam)(learning_rate=_schedule(), b1=0.8), "**/w"
        ),
        lambda: optax.masked(
            optax.inject_hyperparams(optax.adam)(learning_rate=_schedule(), b1=0.8), W_MASK
        ),
    ),
]


@pytest.mark.parametrize(
    ("mixed", "oracle"),
    [c[1:] for c in OPTAX_INSIDE_GRADTX],
    ids=[c[0] for c in OPTAX_INSIDE_GRADTX],
)
def test_optax_inside_gradtx_matches_optax(mixed, oracle):
    got, _ = _run(mixed())
    want, _ = _run(oracle())
    _assert_close(got, want)
    assert not np.allclose(got["enc"]["w"], _params()["enc"]["w"])  # something trained


def test_a_wrapped_state_holds_optax_values_under_names_and_positions():
    _, mixed = _run(gradtx.chain(optax.clip_by_global_norm(1.0), optax.adam(LR)))
    _, pure = _run(optax.chain(optax.clip_by_global_norm(1.0), optax.adam(LR)))
    entries = mixed["chain"]  # named after optax.adam's chain: its children by name
    assert entries.names == ("scale_by_adam", "scale")
    assert entries["scale_by_adam"] is entries[0]  # positions still work
    assert int(entries["scale_by_adam"].count) == STEPS == int(pure[1][0].count)
    _assert_close(entries["scale_by_adam"].mu, pure[1][0].mu)
    _assert_close(entries["scale_by_adam"].nu, pure[1][0].nu)


# --- gradtx inside optax -----------------------------------------------------------------------

GRADTX_INSIDE_OPTAX = [
    (
        "optax-chain",
        lambda: optax.chain(
            gradtx.clip_by_global_norm(1.0),
            gradtx.adamw(LR, weight_decay=0.1, mask="**/w"),
        ),
        lambda: gradtx.chain(
            gradtx.clip_by_global_norm(1.0),
            gradtx.adamw(LR, weight_decay=0.1, mask="**/w"),
        ),
    ),
    (
        "optax-chain-mixed",
        lambda: optax.chain(gradtx.clip(0.5), optax.trace(0.9), gradtx.scale(-LR)),
        lambda: gradtx.chain(gradtx.clip(0.5), gradtx.trace(0.9), gradtx.scale(-LR)),
    ),
    (
        "optax-multi_transform",
        lambda: optax.multi_transform(
            {"enc": gradtx.adam(LR), "head": gradtx.sgd(LR, momentum=0.9)}, LABELS
        ),
        lambda: gradtx.partition(
            {"enc": gradtx.adam(LR), "head": gradtx.sgd(LR, momentum=0.9)}, GROUPS
        ),
    ),
    (
        "optax-multi_transform-chain",
        lambda: optax.multi_transform(
            {
                "enc": optax.chain(gradtx.clip_by_global_norm(0.5), gradtx.adam(LR)),
                "head": gradtx.lion(LR / 10),
            },
            LABELS,
        ),
        lambda: gradtx.partition(
            {
                "enc": gradtx.chain(gradtx.clip_by_global_norm(0.5), gradtx.adam(LR)),
                "head": gradtx.lion(LR / 10),
            },
            GROUPS,
        ),
    ),
    (
        "optax-masked",
        lambda: optax.masked(gradtx.adam(LR), W_MASK),
        lambda: gradtx.masked(gradtx.adam(LR), "**/w"),
    ),
]


@pytest.mark.parametrize(
    ("mixed", "pure"), [c[1:] for c in GRADTX_INSIDE_OPTAX], ids=[c[0] for c in GRADTX_INSIDE_OPTAX]
)
def test_gradtx_inside_optax_matches_gradtx(mixed, pure):
    got, _ = _run(mixed())
    want, _ = _run(pure())
    _assert_close(got, want)
    assert not np.allclose(got["enc"]["w"], _params()["enc"]["w"])


def test_gradtx_states_inside_optax_keep_their_path_keys():
    # gradtx inside optax inside gradtx: the gradtx states keep their own keys.
    tx = gradtx.chain(optax.chain(gradtx.adam(LR), optax.scale(1.0)))
    _, state = _run(tx, 2)
    keys = sorted(gradtx.state_dict(state))
    assert "chain/adam/mu/enc/w" in keys and "chain/adam/count/head/b" in keys
    assert state["chain"].names == ("adam", "scale")
    assert int(state["chain"]["adam"]["count"]["enc/w"]) == 2


# --- state keys ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tx", "expected"),
    [
        (
            lambda: gradtx.chain(optax.adam(LR)),
            ["chain/scale_by_adam/count", "chain/scale_by_adam/mu/enc/w"],
        ),
        (
            lambda: gradtx.named_chain(("adam", optax.adam(LR))),
            ["adam/scale_by_adam/count", "adam/scale_by_adam/mu/enc/w"],
        ),
        (
            lambda: gradtx.chain(optax.scale_by_adam()),
            ["scale_by_adam/count", "scale_by_adam/mu/enc/w", "scale_by_adam/nu/head/b"],
        ),
        (
            lambda: gradtx.chain(optax.sgd(LR, momentum=0.9)),
            ["chain/trace/trace/enc/w"],
        ),
        (
            lambda: gradtx.chain(optax.chain(optax.trace(0.9), optax.trace(0.5))),
            ["chain/trace/trace/enc/w", "chain/trace_2/trace/enc/w"],
        ),
        (
            lambda: gradtx.chain(optax.chain(optax.clip(1.0), optax.adamw(LR))),
            ["chain/chain/scale_by_adam/mu/enc/w"],
        ),
        (
            lambda: gradtx.chain(optax.inject_hyperparams(optax.adam)(learning_rate=LR)),
            [
                "inject_hyperparams/count",
                "inject_hyperparams/hyperparams/learning_rate",
                # the inner chain is made at init, out of reach: named by its state types
                "inject_hyperparams/inner_state/scale_by_adam/mu/enc/w",
            ],
        ),
        (
            lambda: gradtx.chain(optax.masked(optax.adam(LR), W_MASK)),
            ["masked/inner_state/scale_by_adam/mu/enc/w"],
        ),
        (
            lambda: gradtx.chain(optax.multi_transform({"a": optax.adam(LR)}, "a")),
            ["partition/inner_states/a/inner_state/scale_by_adam/mu/enc/w"],
        ),
    ],
    ids=[
        "adam",
        "named",
        "scale_by_adam",
        "sgd",
        "repeat",
        "nested",
        "inject",
        "masked",
        "multi_transform",
    ],
)
def test_wrapped_optax_state_keys_read_names_not_positions(tx, expected):
    keys = gradtx.state_dict(tx().init(_params()))
    missing = [k for k in expected if k not in keys]
    assert not missing, sorted(keys)
    assert not any(part.isdigit() for key in keys for part in key.split("/"))


def test_state_dict_shows_positions_where_nothing_names_an_entry():
    # A lambda names no factory and a plain tuple has no type name: its position is kept.
    anonymous = optax.GradientTransformation(
        lambda p: (jax.tree.map(jnp.zeros_like, p),), lambda u, s, p=None: (u, s)
    )
    tx = gradtx.chain(anonymous)
    keys = sorted(gradtx.state_dict(tx.init({"w": jnp.ones(2)})))
    assert keys == ["transform/0/w"]


class Layer(NamedTuple):
    w: jax.Array
    b: jax.Array


class LayerState(NamedTuple):  # named like a state, yet part of the params (not optax's)
    w: jax.Array


def test_tuples_of_the_params_keep_their_positions_in_a_wrapped_state():
    # optax's moments mirror the params: a tuple there is the params', its positions are paths
    params = (Layer(jnp.ones(2), jnp.zeros(())), (LayerState(jnp.ones(3)),))
    tx = gradtx.chain(optax.adam(LR))
    state = tx.init(params)
    keys = sorted(gradtx.state_dict(state))
    assert "chain/scale_by_adam/mu/0/w" in keys and "chain/scale_by_adam/nu/1/0/w" in keys
    assert gradtx.paths.paths(params) == ["0/w", "0/b", "1/0/w"]
    row = gradtx.explain(tx, params)["1/0/w"]
    assert row.state_dtypes == {"chain/scale_by_adam/mu": "f32", "chain/scale_by_adam/nu": "f32"}
    grads = jax.tree.map(jnp.ones_like, params)
    with jax.numpy_dtype_promotion("standard"):
        updates, new_state = tx.update(grads, state, params)
    assert jax.tree.structure(new_state) == jax.tree.structure(state)
    assert jax.tree.structure(updates) == jax.tree.structure(params)


def test_gradtx_own_state_keys_are_unchanged():
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(LR, weight_decay=0.1))
    keys = sorted(gradtx.state_dict(tx.init(_params())))
    assert keys[:3] == ["adamw/count/enc/b", "adamw/count/enc/w", "adamw/count/head/b"]
    assert "clip_by_global_norm/global_norm" in keys


def test_wrapped_state_round_trips_through_state_dict_and_files(tmp_path):
    tx = gradtx.chain(optax.clip_by_global_norm(1.0), optax.adam(LR))
    params, state = _run(tx, 3)
    flat = gradtx.state_dict(state)
    loaded, report = gradtx.load_state_dict(tx, params, flat)
    assert report.clean
    assert jax.tree.structure(loaded) == jax.tree.structure(state)
    path = str(tmp_path / "ckpt")
    gradtx.save(path, params, state, tx=tx)
    restored_params, restored, _ = gradtx.restore(path, tx, params)
    for key, value in gradtx.state_dict(restored).items():
        np.testing.assert_array_equal(value, flat[key], err_msg=key)
    # the restored state continues exactly as the original
    with jax.numpy_dtype_promotion("standard"):
        a, _ = tx.update(_grads(5), state, params)
        b, _ = tx.update(_grads(5), restored, restored_params)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


def test_reconcile_keeps_a_wrapped_states_surviving_paths():
    tx = gradtx.chain(optax.adam(LR))
    params, state = _run(tx, 2)
    grown = {**params, "extra": jnp.ones(2)}
    new_state, report = gradtx.reconcile(tx, state, grown)
    assert set(report.missing) == {"chain/scale_by_adam/mu/extra", "chain/scale_by_adam/nu/extra"}
    old, new = gradtx.state_dict(state), gradtx.state_dict(new_state)
    key = "chain/scale_by_adam/mu/enc/w"
    np.testing.assert_array_equal(new[key], old[key])
    assert int(new["chain/scale_by_adam/count"]) == 2


def test_a_wrapped_state_can_be_donated():
    tx = gradtx.chain(optax.adam(LR))
    step = jax.jit(lambda s, g, p: tx.update(g, s, p), donate_argnums=0)
    params = _params()
    with jax.numpy_dtype_promotion("standard"):
        state = tx.init(params)
        for i in range(3):
            buffers = jax.tree.leaves(state)
            _, state = step(state, _grads(i), params)
            assert all(b.is_deleted() for b in buffers)
    assert int(state["chain"]["scale_by_adam"].count) == 3


def test_an_optax_state_made_by_optax_itself_is_accepted():
    inner = optax.adam(LR)
    tx = gradtx.masked(inner, "**")
    params = _params()
    with jax.numpy_dtype_promotion("standard"):
        _, keyed = tx.update(_grads(0), tx.init(params), params)
        _, from_optax = tx.update(_grads(0), inner.init(params), params)
    assert jax.tree.structure(keyed) == jax.tree.structure(from_optax)


# --- explain ----------------------------------------------------------------------------------


def test_explain_reads_the_learning_rate_of_an_injected_optax_state():
    tx = gradtx.partition(
        {
            "enc": optax.inject_hyperparams(optax.adam)(learning_rate=_schedule(), b1=0.8),
            "head": optax.chain(
                optax.clip(1.0), optax.inject_hyperparams(optax.sgd)(learning_rate=0.3)
            ),
        },
        GROUPS,
    )
    params = _params()
    at_0, at_5 = gradtx.explain(tx, params), gradtx.explain(tx, params, step=5)
    assert at_0["enc/w"].learning_rate == pytest.approx(LR)
    assert at_5["enc/w"].learning_rate == pytest.approx(float(_schedule()(5)))
    assert at_0["enc/w"].b1 == pytest.approx(0.8) and at_0["enc/w"].b2 == pytest.approx(0.999)
    assert at_0["head/b"].learning_rate == pytest.approx(0.3)
    assert at_0["enc/w"].steps == ("[enc]", "inject_hyperparams")
    assert "inject_hyperparams/learning_rate" in at_0["enc/w"].hyperparams
    table = str(at_0)
    assert "0.05" in table and "0.3" in table


def test_explain_shows_no_learning_rate_where_optax_keeps_it_out_of_reach():
    tx = gradtx.chain(optax.adam(LR))
    row = gradtx.explain(tx, _params())["enc/w"]
    assert row.learning_rate is None and row.steps == ("chain",)
    assert row.state_dtypes == {"chain/scale_by_adam/mu": "f32", "chain/scale_by_adam/nu": "f32"}


def test_a_wrapped_optimizer_advances_one_count_for_the_whole_tree():
    # The documented limit: a wrapped optax optimizer has one step count; a partition of two
    # wrapped optimizers keeps a count per group, so groups may take turns.
    partial = {"enc": _grads(0)["enc"], "head": {"w": None, "b": None}}
    one = gradtx.chain(optax.adam(LR))
    with pytest.raises(ValueError, match="structure"):  # optax rejects a partial update
        with jax.numpy_dtype_promotion("standard"):
            one.update(partial, one.init(_params()), _params())
    two = gradtx.partition({"enc": optax.adam(LR), "head": optax.adam(LR)}, GROUPS)
    with jax.numpy_dtype_promotion("standard"):
        _, state = two.update(partial, two.init(_params()), _params())
    flat = gradtx.state_dict(state)
    assert int(flat["enc/scale_by_adam/count"]) == 1
    assert int(flat["head/scale_by_adam/count"]) == 0
