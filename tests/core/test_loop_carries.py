"""A loop over partial updates from a fresh state: the error says how to give it one carry.

Step counts are one value shared by all paths until an update leaves some out; from then on
they are one per path. That changes the state's layout once, which a `lax.scan` carry cannot
do, and JAX's own error only says that the carry's structure changed. The user's own
`update` call, traced as a loop's body, says why and what to do instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx

PARAMS = {"a": {"w": jnp.linspace(0.5, 1.0, 3)}, "b": {"w": jnp.linspace(-1.0, 1.0, 2)}}
FIX = r"run the first step before the loop"


def _only_a(params, i):
    return {"a": {"w": jnp.cos(params["a"]["w"] * (1.0 + i))}, "b": None}


def _body(tx, partial_grads):
    def body(carry, i):
        params, state = carry
        updates, state = tx.update(partial_grads(params, i), state, params)
        return (gradtx.apply_updates(params, updates), state), None

    return body


@pytest.mark.parametrize(
    "tx",
    [
        gradtx.adam(0.1),
        gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(0.1)),
        gradtx.sgd(gradtx.schedules.cosine_decay(0.1, 10)),
    ],
    ids=["adam", "chain", "sgd_schedule"],
)
def test_a_scan_over_none_leaves_from_a_fresh_state_names_the_fix(tx):
    state = tx.init(PARAMS)
    with pytest.raises(TypeError, match=rf"inside `jax.lax.scan`.*leaves out 'b/w'.*{FIX}"):
        jax.lax.scan(_body(tx, _only_a), (PARAMS, state), jnp.arange(3.0))


def test_a_declared_partial_update_gets_the_same_message():
    tx = gradtx.adam(0.1)

    def body(carry, i):
        params, state = carry
        grads = {"a": {"w": jnp.cos(params["a"]["w"] * (1.0 + i))}}
        updates, state = tx.update(grads, state, params, partial=True)
        return (gradtx.apply_updates(params, updates), state), None

    with pytest.raises(TypeError, match=rf"leaves out 'b/w'.*step counts at 'count'.*{FIX}"):
        jax.lax.scan(body, (PARAMS, tx.init(PARAMS)), jnp.arange(3.0))


def test_fori_loop_and_while_loop_are_named():
    tx = gradtx.adam(0.1)
    state = tx.init(PARAMS)
    body = _body(tx, _only_a)
    with pytest.raises(TypeError, match=r"inside `jax.lax.fori_loop`"):
        jax.lax.fori_loop(0, 3, lambda i, c: body(c, i)[0], (PARAMS, state))
    with pytest.raises(TypeError, match=r"inside `jax.lax.while_loop`"):
        jax.lax.while_loop(
            lambda c: c[0] < 3,
            lambda c: (c[0] + 1, *body(c[1:], c[0].astype(jnp.float32))[0]),
            (jnp.int32(0), PARAMS, state),
        )


def test_the_fix_works_and_equals_the_loop_run_step_by_step():
    tx = gradtx.adam(0.1)
    body = _body(tx, _only_a)
    # the fix: one step before the loop, the rest inside it
    carry, _ = body((PARAMS, tx.init(PARAMS)), jnp.float32(0.0))
    (scanned, state), _ = jax.lax.scan(body, carry, jnp.arange(1.0, 5.0))
    # the oracle: the same five steps, each its own call
    params, expected = PARAMS, tx.init(PARAMS)
    for i in range(5):
        (params, expected), _ = body((params, expected), jnp.float32(i))
    for x, y in zip(jax.tree.leaves((scanned, state)), jax.tree.leaves((params, expected))):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    assert {p: int(c) for p, c in state["count"].items()} == {"a/w": 5, "b/w": 0}
    np.testing.assert_array_equal(scanned["b"]["w"], PARAMS["b"]["w"])


def test_full_updates_in_a_scan_and_partial_ones_outside_a_loop_stay_allowed():
    tx = gradtx.adam(0.1)

    def full(params, i):
        return jax.tree.map(lambda p: jnp.cos(p * (1.0 + i)), params)

    (_, state), _ = jax.lax.scan(_body(tx, full), (PARAMS, tx.init(PARAMS)), jnp.arange(3.0))
    assert len(jax.tree.leaves(state["count"])) == 1  # still one shared count
    # under plain `jit` the layout may change: the next step is traced again
    step = jax.jit(lambda c, i: _body(tx, _only_a)(c, i)[0])
    params, state = step((PARAMS, tx.init(PARAMS)), jnp.float32(0.0))
    assert int(state["count"]["b/w"]) == 0
    # a loop that closes over the state (no carry) may update it partially
    fresh = tx.init(PARAMS)

    def reads_state(total, i):
        updates, _ = tx.update(_only_a(PARAMS, i), fresh, PARAMS)
        return total + jnp.sum(updates["a"]["w"]), None

    total, _ = jax.lax.scan(reads_state, jnp.float32(0.0), jnp.arange(2.0))
    assert np.isfinite(float(total))
