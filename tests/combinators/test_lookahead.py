"""Lookahead against the paper's two nested loops and against optax; the rest is the contract."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from references.wrappers import OptaxLookahead

import gradtx

RNG = np.random.default_rng(0)
PARAMS = {"w": jnp.asarray(RNG.normal(size=(2, 3)), jnp.float32), "b": jnp.float32(0.7)}
GRADS = [
    {"w": jnp.asarray(RNG.normal(size=(2, 3)), jnp.float32), "b": jnp.float32(RNG.normal())}
    for _ in range(12)
]
K, ALPHA, LR, MOMENTUM = 3, 0.5, 0.1, 0.9


def paper_lookahead(params: dict, grads: list) -> tuple[list, list]:
    """Zhang et al., Algorithm 1, in float64 with the gradients given: for each outer step,
    fast = slow; k inner SGD-with-momentum steps; slow += alpha (fast - slow). The momentum
    buffer carries over. Returns the fast weights after every step and the slow weights."""
    a, lr, mom = float(np.float32(ALPHA)), float(np.float32(LR)), float(np.float32(MOMENTUM))
    slow = {p: np.asarray(x, np.float64) for p, x in params.items()}
    trace = {p: np.zeros_like(x) for p, x in slow.items()}
    fasts, slows = [], []
    it = iter(grads)
    for _ in range(len(grads) // K):
        fast = {p: x.copy() for p, x in slow.items()}
        for i in range(K):
            g = next(it)
            for p in fast:
                trace[p] = np.asarray(g[p], np.float64) + mom * trace[p]
                fast[p] = fast[p] - lr * trace[p]
            if i < K - 1:
                fasts.append({p: x.copy() for p, x in fast.items()})
                slows.append({p: x.copy() for p, x in slow.items()})
        slow = {p: slow[p] + a * (fast[p] - slow[p]) for p in slow}
        fasts.append({p: x.copy() for p, x in slow.items()})  # the params jump to slow
        slows.append({p: x.copy() for p, x in slow.items()})
    return fasts, slows


def test_matches_the_papers_nested_loops():
    tx = gradtx.lookahead(gradtx.sgd(LR, momentum=MOMENTUM), K, ALPHA)
    fasts, slows = paper_lookahead(PARAMS, GRADS)

    @jax.jit
    def step(params, state, grads):
        u, state = tx.update(grads, state, params)
        params = gradtx.apply_updates(params, u)
        return params, state, tx.slow_params(params, state)

    params, state = PARAMS, tx.init(PARAMS)
    for t, g in enumerate(GRADS):
        params, state, slow = step(params, state, g)
        for p in ("w", "b"):
            np.testing.assert_allclose(params[p], fasts[t][p], rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(slow[p], slows[t][p], rtol=1e-6, atol=1e-6)
        if (t + 1) % K == 0:  # right after a synchronisation the params are the slow weights
            for p in ("w", "b"):
                np.testing.assert_array_equal(np.asarray(params[p]), np.asarray(slow[p]))
            assert all(not np.any(np.asarray(x)) for x in state["fast_minus_slow"].values())
    assert int(state["count"]["w"]) == 12
    assert int(state["fast"]["trace"]["w"].shape[0]) == 2


def test_matches_optax_on_the_params():
    """optax keeps `LookaheadParams(fast, slow)`; `OptaxLookahead`
    (tests/contract/references/wrappers.py) keeps its slow weights next to its state. The
    params and the slow weights agree within 1e-6 relative to the largest weight: optax
    computes the synchronisation step from the weights (`theta + u - phi`, rounded at the
    weights' size), gradtx from the updates."""
    adam = dict(b1=np.float32(0.9), b2=np.float32(0.999), eps=np.float32(1e-8))
    tx = gradtx.lookahead(gradtx.adam(0.05), 4, 0.6)
    oracle = OptaxLookahead(optax.adam(np.float32(0.05), **adam), 4, np.float32(0.6))
    params, state = PARAMS, tx.init(PARAMS)
    o_params, o_state = PARAMS, oracle.init(PARAMS)
    update = jax.jit(tx.update)
    for g in GRADS:
        u, state = update(g, state, params)
        params = gradtx.apply_updates(params, u)
        with jax.numpy_dtype_promotion("standard"):
            o_u, o_state = oracle.update(g, o_state, o_params)
            o_params = jax.tree.map(lambda p, u: p + u, o_params, o_u)
        slow = tx.slow_params(params, state)
        for p in ("w", "b"):
            scale = float(np.max(np.abs(o_params[p])))
            np.testing.assert_allclose(params[p], o_params[p], rtol=0, atol=1e-6 * scale)
            np.testing.assert_allclose(slow[p], o_state[1][p], rtol=0, atol=1e-6 * scale)


def test_each_path_counts_its_own_steps():
    tx = gradtx.lookahead(gradtx.sgd(1.0), 2, 0.5)
    params = {"a": jnp.zeros(1), "b": jnp.zeros(1)}
    state = tx.init(params)
    g = jnp.array([-1.0])
    u, state = tx.update({"a": g, "b": None}, state)
    assert u["b"] is None and int(state["count"]["b"]) == 0
    u, state = tx.update({"a": g, "b": g}, state)  # a synchronises, b takes its first step
    # a: fast 1 -> 2, slow 0 -> 0 + 0.5 * 2 = 1, so the params stay at 1
    np.testing.assert_array_equal(u["a"], [0.0])
    np.testing.assert_array_equal(u["b"], [1.0])
    u, state = tx.update({"b": g}, state, partial=True)  # only b, which synchronises
    np.testing.assert_array_equal(u["b"], [0.0])
    assert int(state["count"]["a"]) == 2 and int(state["count"]["b"]) == 2


def test_state_dtypes_hyperparameter_and_packed_params():
    tx = gradtx.lookahead(gradtx.sgd(0.1), 2, 0.5, accumulator_dtype=jnp.float32)
    params = {"w": jnp.ones(3, jnp.bfloat16)}
    assert tx.init(params)["fast_minus_slow"]["w"].dtype == jnp.float32
    assert gradtx.lookahead(gradtx.sgd(0.1), 2).init(params)["fast_minus_slow"]["w"].dtype == (
        jnp.bfloat16
    )
    assert tx.alpha.dtype == jnp.float32 and tx.alpha in jax.tree.leaves(tx)
    packed = gradtx.pack({"w": jnp.ones(3), "b": jnp.ones(2)})
    plain = gradtx.lookahead(gradtx.sgd(0.1), 2)
    state = plain.init(packed)
    grads = gradtx.pack({"w": jnp.ones(3), "b": jnp.full(2, 2.0)})
    for _ in range(3):
        u, state = plain.update(grads, state)
        packed = gradtx.apply_updates(packed, u)
    slow = plain.slow_params(packed, state).unpack()
    np.testing.assert_allclose(slow["b"], [0.8, 0.8], rtol=1e-6)  # 1 - 0.5 * (0.2 + 0.2)
    np.testing.assert_allclose(packed.unpack()["b"], [0.6, 0.6], rtol=1e-6)


def test_describe_frozen_paths_and_errors():
    tx = gradtx.lookahead(gradtx.adam(0.1), 5, 0.25)
    described = tx.describe({"w": jnp.zeros(2)})
    assert described["w"][-1] == ("lookahead", {"sync_period": 5, "alpha": 0.25})
    assert described["w"][0][0] == "scale_by_adam"
    assert tx.frozen_paths({"w": jnp.zeros(2)}) == frozenset()
    with pytest.raises(ValueError, match="sync_period"):
        gradtx.lookahead(gradtx.sgd(0.1), 0)
    with pytest.raises(KeyError, match="fast_minus_slow"):
        tx.update({"w": jnp.ones(2)}, {"fast": {}})


# --- reset_state: the fast state restarts at each synchronisation ------------------------------


@pytest.mark.parametrize(
    "make_fast, make_oracle, k",
    [
        (
            lambda: gradtx.adam(0.05),
            lambda: optax.adam(
                np.float32(0.05), b1=np.float32(0.9), b2=np.float32(0.999), eps=np.float32(1e-8)
            ),
            3,
        ),
        (
            lambda: gradtx.sgd(LR, momentum=MOMENTUM),
            lambda: optax.sgd(np.float32(LR), momentum=np.float32(MOMENTUM)),
            2,
        ),
    ],
    ids=["adam-k3", "sgd-momentum-k2"],
)
def test_reset_state_matches_optax(make_fast, make_oracle, k):
    """optax's `lookahead(reset_state=True)` re-initialises the fast optimizer's whole state at
    each synchronisation; gradtx restarts that of every path (they all synchronise together
    here). Over 7 steps the params agree as in `test_matches_optax_on_the_params`, and right
    after each synchronisation the fast state is exactly `fast.init`'s. Without the reset
    the params differ from the oracle's by far more than the tolerance."""
    tx = gradtx.lookahead(make_fast(), k, 0.6, reset_state=True)
    kept = gradtx.lookahead(make_fast(), k, 0.6)
    oracle = OptaxLookahead(make_oracle(), k, np.float32(0.6))
    oracle.inner = optax.lookahead(make_oracle(), k, np.float32(0.6), reset_state=True)
    params, state = PARAMS, tx.init(PARAMS)
    k_params, k_state = PARAMS, kept.init(PARAMS)
    o_params, o_state = PARAMS, oracle.init(PARAMS)
    fresh = gradtx.state_dict(tx.init(PARAMS)["fast"])
    update = jax.jit(tx.update)
    apart = 0.0
    for t, g in enumerate(GRADS[:7]):
        u, state = update(g, state, params)
        params = gradtx.apply_updates(params, u)
        k_u, k_state = kept.update(g, k_state, k_params)
        k_params = gradtx.apply_updates(k_params, k_u)
        with jax.numpy_dtype_promotion("standard"):
            o_u, o_state = oracle.update(g, o_state, o_params)
            o_params = jax.tree.map(lambda p, u: p + u, o_params, o_u)
        slow = tx.slow_params(params, state)
        for p in ("w", "b"):
            scale = float(np.max(np.abs(o_params[p])))
            np.testing.assert_allclose(params[p], o_params[p], rtol=0, atol=1e-6 * scale)
            np.testing.assert_allclose(slow[p], o_state[1][p], rtol=0, atol=1e-6 * scale)
            apart = max(apart, float(np.max(np.abs(k_params[p] - o_params[p]))) / scale)
        flat = gradtx.state_dict(state["fast"])
        if (t + 1) % k == 0:
            assert sorted(flat) == sorted(fresh)
            for key, value in flat.items():
                np.testing.assert_array_equal(np.asarray(value), np.asarray(fresh[key]), key)
        else:
            assert any(np.any(np.asarray(v) != np.asarray(fresh[k_])) for k_, v in flat.items())
    assert apart > 1e-3


def test_reset_state_restarts_each_path_at_its_own_synchronisation():
    """With a partial update, `a` synchronises a step before `b`: only `a`'s momentum and
    Adam count restart then; the count that `a` and `b` shared until then is kept one per path.
    Entries of no path (an injected learning rate, set by hand) are kept."""
    fast = gradtx.chain(
        gradtx.trace(0.9), gradtx.inject_hyperparams(gradtx.adam)(learning_rate=0.1)
    )
    tx = gradtx.lookahead(fast, 2, 0.5, reset_state=True)
    params = {"a": jnp.zeros(2), "b": jnp.zeros(2)}
    state = tx.init(params)
    state = {**state, "fast": gradtx.set_hyperparams(state["fast"], {"adam/learning_rate": 0.2})}
    g = jnp.array([1.0, -2.0])
    _, state = tx.update({"a": g, "b": None}, state, params)
    _, state = tx.update({"a": g, "b": g}, state, params)  # a's second step: it synchronises
    flat = gradtx.state_dict(state["fast"])
    assert not np.any(np.asarray(flat["trace/trace/a"]))
    assert np.all(np.asarray(flat["trace/trace/b"]) != 0)
    counts = {k: int(v) for k, v in flat.items() if "/count/" in k}
    assert counts == {"adam/inner/count/a": 0, "adam/inner/count/b": 1}
    _, state = tx.update({"a": None, "b": g}, state, params)  # b's second step
    flat = gradtx.state_dict(state["fast"])
    assert not np.any(np.asarray(flat["trace/trace/b"]))
    assert int(flat["adam/inner/count/b"]) == 0
    # a took no step since its restart: its entries stay as they restarted
    assert not np.any(np.asarray(flat["trace/trace/a"]))
    assert int(flat["adam/inner/count/a"]) == 0
    assert float(gradtx.hyperparams(state["fast"])["adam/learning_rate"]) == pytest.approx(0.2)


def test_reset_state_errors():
    tx = gradtx.lookahead(gradtx.adam(0.1), 2, reset_state=True)
    params = {"w": jnp.zeros(2)}
    with pytest.raises(ValueError, match=r"reset_state=True\) needs the params"):
        tx.update({"w": jnp.ones(2)}, tx.init(params))
    with pytest.raises(TypeError, match=r"reset_state=True\) restarts the fast state.*packed"):
        tx.init(gradtx.pack(params))
    with pytest.raises(TypeError, match="`reset_state` must be True or False"):
        gradtx.lookahead(gradtx.adam(0.1), 2, reset_state=1)
