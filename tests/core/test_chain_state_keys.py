"""A chain's state is keyed by name; read by position (optax's `state[0]`) it says so."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx._combinators.chain import ChainState

PARAMS = {"enc": {"w": jnp.ones((2, 3))}, "b": jnp.zeros(3)}


def _tx() -> gradtx.Transformation:
    return gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1))


@pytest.mark.parametrize("key", [0, 1, -1, -2])
def test_a_position_raises_listing_the_names(key):
    state = _tx().init(PARAMS)
    with pytest.raises(KeyError) as info:
        state[key]
    message = str(info.value)
    assert "keyed by name, not by position" in message
    assert "'clip_by_global_norm', 'adam'" in message
    expected = ["clip_by_global_norm", "adam"][key]
    assert f"state[{expected!r}]" in message


def test_a_position_past_the_end_and_an_unknown_name_list_the_names_too():
    state = _tx().init(PARAMS)
    for key in (5, "adma"):
        with pytest.raises(KeyError, match=r"has no key .*'clip_by_global_norm', 'adam'"):
            state[key]


def test_named_chain_lists_its_own_names_and_get_stays_quiet():
    tx = gradtx.named_chain(("clip", gradtx.clip(1.0)), ("opt", gradtx.sgd(0.1, momentum=0.9)))
    state = tx.init(PARAMS)
    with pytest.raises(KeyError, match=r"'clip', 'opt'.*state\['clip'\]"):
        state[0]
    assert state.get(0) is None and 0 not in state
    assert state["opt"] is state.get("opt")


def test_it_is_a_dict_with_a_dicts_keys_leaves_and_state_dict():
    tx = _tx()
    state = tx.init(PARAMS)
    assert isinstance(state, ChainState) and isinstance(state, dict)
    plain = dict(state)
    assert state == plain and list(state) == ["clip_by_global_norm", "adam"]
    ours = jax.tree_util.tree_flatten_with_path(state)[0]
    theirs = jax.tree_util.tree_flatten_with_path(plain)[0]
    assert [path for path, _ in ours] == [path for path, _ in theirs]
    assert list(gradtx.state_dict(state)) == list(gradtx.state_dict(plain))


def test_it_keeps_its_kind_and_order_through_jit_and_steps():
    tx = _tx()
    state = tx.init(PARAMS)
    step = jax.jit(lambda s: tx.update(PARAMS, s, PARAMS)[1])
    after = step(state)
    assert type(after) is ChainState and list(after) == list(state)
    assert jax.tree.structure(after) == jax.tree.structure(state)
    eager = tx.update(PARAMS, state, PARAMS)[1]
    assert type(eager) is ChainState
    for x, y in zip(jax.tree.leaves(after), jax.tree.leaves(eager)):
        np.testing.assert_allclose(x, y, rtol=1e-6)
    # a scan carries it: the structure in is the structure out
    final, _ = jax.lax.scan(lambda s, _: (step(s), None), state, None, length=3)
    assert int(final["adam"]["count"]["b"]) == 3


def test_a_state_loaded_or_reconciled_is_one_too():
    tx = _tx()
    state = tx.init(PARAMS)
    loaded, _ = gradtx.load_state_dict(tx, PARAMS, gradtx.state_dict(state))
    assert type(loaded) is ChainState
    assert jax.tree.structure(loaded) == jax.tree.structure(state)


def test_an_optimizers_flat_state_stays_a_plain_dict():
    state = gradtx.adam(0.1).init(PARAMS)
    assert type(state) is dict


@pytest.mark.parametrize(
    "wrap",
    [
        lambda tx: gradtx.apply_if_finite(tx, 2),
        lambda tx: gradtx.conditionally_mask(tx, lambda step: step % 2 == 0),
        lambda tx: gradtx.accumulate(tx, 2),
    ],
    ids=["apply_if_finite", "conditionally_mask", "accumulate"],
)
def test_wrappers_that_regroup_counts_keep_it(wrap):
    # they split shared counts apart before a `cond` (see `split_where_absent`)
    tx = wrap(_tx())
    params = {"a": jnp.ones(2), "b": jnp.ones(3)}
    state = tx.init(params)
    partial = {"a": jnp.ones(2), "b": None}
    step = jax.jit(lambda s: tx.update(partial, s, params)[1])
    state = step(state)
    found = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, ChainState))
    chains = [x for x in found if isinstance(x, ChainState)]
    assert chains, "the chain's state lost its kind"
    # and from then on one structure: a scan carries it
    final, _ = jax.lax.scan(lambda s, _: (step(s), None), state, None, length=2)
    assert jax.tree.structure(final) == jax.tree.structure(state)
