"""`gradtx.eval_params`: the weights to evaluate, through every combinator, and `ema_params`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from trajectories import eval_trajectory

import gradtx

RNG = np.random.default_rng(3)
PARAMS = {
    "enc": {"w": jnp.asarray(RNG.normal(size=(3, 2)), jnp.float32), "b": jnp.zeros(2)},
    "head": {"w": jnp.asarray(RNG.normal(size=(2,)), jnp.float32)},
}
GRADS = [
    jax.tree.map(lambda x: jnp.asarray(RNG.normal(size=x.shape), jnp.float32), PARAMS)
    for _ in range(8)
]
PATHS = {"enc": {"w": "enc/w", "b": "enc/b"}, "head": {"w": "head/w"}}


def sf() -> Any:
    return gradtx.schedule_free_sgd(0.3, warmup_steps=2, weight_decay=0.01)


def train(tx: Any, grads: list = GRADS, params: Any = PARAMS) -> tuple[Any, Any]:
    """Jitted steps; the params and state after the last one."""

    @jax.jit
    def step(params, state, g):
        # optax's own transformations promote dtypes implicitly
        with jax.numpy_dtype_promotion("standard"):
            u, state = tx.update(g, state, params)
        return gradtx.apply_updates(params, u), state

    state = tx.init(params)
    for g in grads:
        params, state = step(params, state, g)
    return params, state


def restrict(tree: dict, keep: str) -> dict:
    """`tree` with only the top-level entry `keep` (the group a combinator hands over)."""
    return {keep: tree[keep]}


def assert_equal(a: Any, b: Any) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def assert_close(a: Any, b: Any) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6)


def differs(a: Any, b: Any) -> bool:
    return any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# --- plain transformations ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "tx",
    [
        gradtx.adam(0.1),
        gradtx.sgd(0.1, momentum=0.9),
        gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(0.1)),
        gradtx.ema(0.9),  # an average of the updates, not of the params
        optax.adam(0.1),
    ],
    ids=["adam", "sgd-momentum", "chain", "ema", "optax"],
)
def test_plain_optimizers_evaluate_their_params(tx):
    params, state = train(tx, GRADS[:2])
    assert gradtx.eval_params(tx, state, params) is params


def test_eval_params_runs_under_jit():
    tx = sf()
    params, state = train(tx)
    jitted = jax.jit(gradtx.eval_params)(tx, state, params)
    assert_close(jitted, gradtx.eval_params(tx, state, params))
    assert differs(jitted, params)


# --- combinators delegate -----------------------------------------------------------------------


def test_chain_gives_its_childs_eval_params():
    tx = gradtx.chain(gradtx.clip_by_global_norm(10.0), sf())
    params, state = train(tx)
    alone = sf()
    a_params, a_state = train(alone)
    assert_close(params, a_params)
    assert_close(
        gradtx.eval_params(tx, state, params), gradtx.eval_params(alone, a_state, a_params)
    )
    assert differs(gradtx.eval_params(tx, state, params), params)


def test_partition_gives_each_group_its_eval_params():
    tx = gradtx.partition(
        {"sf": sf(), "plain": gradtx.adam(0.1)}, {"sf": "enc/**", "plain": "head/**"}
    )
    params, state = train(tx)
    x = gradtx.eval_params(tx, state, params)
    # the schedule-free group, trained alone on its paths
    alone = sf()
    a_params, a_state = train(alone, [restrict(g, "enc") for g in GRADS], restrict(PARAMS, "enc"))
    assert_close(restrict(params, "enc"), a_params)
    assert_close(restrict(x, "enc"), gradtx.eval_params(alone, a_state, a_params))
    assert differs(x["enc"], params["enc"])
    assert x["head"]["w"] is params["head"]["w"]


@pytest.mark.parametrize(
    "wrap",
    [lambda tx: gradtx.masked(tx, "enc/**"), lambda tx: gradtx.freeze(tx, "head/**")],
    ids=["masked", "freeze"],
)
def test_the_selected_paths_get_their_eval_params_and_the_others_keep_theirs(wrap):
    tx = wrap(sf())
    params, state = train(tx)
    x = gradtx.eval_params(tx, state, params)
    alone = sf()
    a_params, a_state = train(alone, [restrict(g, "enc") for g in GRADS], restrict(PARAMS, "enc"))
    assert_close(restrict(x, "enc"), gradtx.eval_params(alone, a_state, a_params))
    assert x["head"]["w"] is params["head"]["w"]


def test_lookahead_evaluates_its_slow_weights():
    tx = gradtx.lookahead(gradtx.sgd(0.1, momentum=0.9), sync_period=3)
    params, state = train(tx, GRADS[:4])  # one step after a synchronisation
    x = gradtx.eval_params(tx, state, params)
    assert_equal(x, tx.slow_params(params, state))
    assert differs(x, params)


def always(step: Any) -> Any:
    return step >= 0


WRAPPERS = {
    "accumulate": lambda tx: gradtx.accumulate(tx, every=2),
    "apply_if_finite": lambda tx: gradtx.apply_if_finite(tx, 2),
    "conditionally_transform": lambda tx: gradtx.conditionally_transform(tx, always),
    "conditionally_mask": lambda tx: gradtx.conditionally_mask(tx, always),
    "bucketed": gradtx.bucketed,
    "named_chain": lambda tx: gradtx.named_chain(("opt", tx)),
    "inject_hyperparams": lambda tx: gradtx.inject_hyperparams(gradtx.schedule_free_sgd)(
        learning_rate=0.3, warmup_steps=2, weight_decay=0.01
    ),
}


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_wrappers_give_their_inner_eval_params(name):
    tx = WRAPPERS[name](sf())
    params, state = train(tx)
    # the same steps taken by the inner transformation alone (accumulate: on the means)
    grads = GRADS
    if name == "accumulate":
        grads = [jax.tree.map(lambda a, b: (a + b) / 2, *GRADS[i : i + 2]) for i in (0, 2, 4, 6)]
    alone = sf()
    a_params, a_state = train(alone, grads)
    assert_close(params, a_params)
    assert_close(
        gradtx.eval_params(tx, state, params), gradtx.eval_params(alone, a_state, a_params)
    )


def test_inject_hyperparams_uses_the_values_of_the_last_step():
    """A scheduled `b1`: the eval weights divide by the `b1` the last step used."""
    b1 = gradtx.schedules.linear(0.5, 0.9, 8)
    tx = gradtx.inject_hyperparams(gradtx.schedule_free_sgd)(learning_rate=0.3, b1=b1)
    params, state = train(tx)
    used = float(gradtx.hyperparams(state)["b1"])
    assert used == pytest.approx(float(b1(7)))
    z = state.inner["z"]
    want = jax.tree.map(lambda y, p: (y - (1 - used) * z[p]) / used, params, PATHS)
    assert_close(gradtx.eval_params(tx, state, params), want)


def test_sam_evaluates_the_outer_params_mid_cycle():
    opt = sf()
    adv = gradtx.chain(gradtx.normalize_by_update_norm(), gradtx.sgd(0.05))
    tx = gradtx.contrib.sam(opt, adv, sync_period=2)
    params, state = train(tx, GRADS[:3])  # a cycle, then one adversarial step
    outer = jax.tree.map(lambda p: state["cache"][p], PATHS)
    assert differs(outer, params)
    want = opt.eval_params(state["optimizer"], outer)
    assert_close(gradtx.eval_params(tx, state, params), want)
    # between cycles the params are the outer ones
    params, state = train(tx, GRADS[:4])
    assert_close(gradtx.eval_params(tx, state, params), opt.eval_params(state["optimizer"], params))


def test_packed_params():
    tx = sf()
    params, state = train(tx)
    p_params, p_state = train(tx, [gradtx.pack(g) for g in GRADS], gradtx.pack(PARAMS))
    x = gradtx.eval_params(tx, p_state, p_params)
    assert isinstance(x, gradtx.Packed)
    for a, b in zip(
        jax.tree.leaves(x.unpack()), jax.tree.leaves(gradtx.eval_params(tx, state, params))
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_misuse_is_named():
    with pytest.raises(TypeError, match=r"`eval_params\(tx\)` must be a transformation"):
        gradtx.eval_params("adam", {}, PARAMS)


# --- ema_params ---------------------------------------------------------------------------------


def numpy_ema(params_seq: list, decay: float, debias: bool, start: Any) -> list:
    """The average of the weights after each step, float64, per path (no shortcut)."""
    d = float(np.float32(decay))
    e = jax.tree.map(
        lambda x: np.zeros(np.shape(x)) if debias else np.asarray(x, np.float64), start
    )
    out = []
    for t, p in enumerate(params_seq, 1):
        e = jax.tree.map(lambda a, b: d * a + (1 - d) * np.asarray(b, np.float64), e, p)
        correction = 1 - d**t if debias else 1.0
        out.append(jax.tree.map(lambda a, c=correction: a / c, e))
    return out


def trajectory(tx: Any, grads: list = GRADS, params: Any = PARAMS) -> tuple[list, list]:
    ys, xs, _ = eval_trajectory(tx, params, grads)
    return ys, xs


@pytest.mark.parametrize("debias", [True, False])
def test_ema_params_averages_the_params(debias):
    tx = gradtx.ema_params(gradtx.sgd(0.1, momentum=0.9), decay=0.8, debias=debias)
    ys, xs = trajectory(tx)
    plain = trajectory(gradtx.sgd(0.1, momentum=0.9))[0]
    for y, want in zip(ys, plain):
        assert_equal(y, want)  # the updates are the inner's
    for x, want in zip(xs, numpy_ema(ys, 0.8, debias, PARAMS)):
        for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=1e-5, atol=1e-6)


def test_ema_params_averages_the_inner_eval_params():
    tx = gradtx.ema_params(sf(), decay=0.8)
    xs = trajectory(tx)[1]
    inner_xs = trajectory(sf())[1]
    for x, want in zip(xs, numpy_ema(inner_xs, 0.8, True, PARAMS)):
        for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=1e-5, atol=1e-6)


def test_ema_params_before_a_step_and_without_gradient():
    tx = gradtx.ema_params(gradtx.adam(0.1), decay=0.9)
    state = tx.init(PARAMS)
    assert_equal(gradtx.eval_params(tx, state, PARAMS), PARAMS)
    params, state = train(tx, GRADS[:2])
    g = {**GRADS[2], "head": {"w": None}}
    u, new = tx.update(g, state, params)
    np.testing.assert_array_equal(new["ema"]["head/w"], state["ema"]["head/w"])
    assert int(new["count"]["head/w"]) == 2 and int(new["count"]["enc/w"]) == 3


def test_ema_params_keeps_a_float32_average_of_bf16_params():
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), PARAMS)
    tx = gradtx.ema_params(gradtx.sgd(0.1), decay=0.999, accumulator_dtype=jnp.float32)
    state = tx.init(params)
    assert {x.dtype for x in state["ema"].values()} == {jnp.dtype(jnp.float32)}
    grads = [jax.tree.map(lambda g: g.astype(jnp.bfloat16), g) for g in GRADS]
    params, state = train(tx, grads, params)
    x = gradtx.eval_params(tx, state, params)
    assert {a.dtype for a in jax.tree.leaves(x)} == {jnp.dtype(jnp.bfloat16)}
    # the float32 average moved by less than a bfloat16 step of the params could show
    assert differs(x, params)


def test_ema_params_misuse_is_named():
    tx = gradtx.ema_params(gradtx.sgd(0.1))
    with pytest.raises(ValueError, match="ema_params needs the params"):
        tx.update(GRADS[0], tx.init(PARAMS))
    with pytest.raises(TypeError, match=r"`ema_params\(tx\)` must be a transformation"):
        gradtx.ema_params(0.1)
    with pytest.raises(TypeError, match="ema_params: `decay` must be a number"):
        gradtx.ema_params(gradtx.sgd(0.1), decay=gradtx.schedules.constant(0.9))
