"""A gradient path covers a parameter path only as itself or as a whole segment prefix.

`{"head": None}` says "no gradient for all of `head`", so it covers `head/w`. But a path that
is only a string prefix of another (`w` of `w2`, `enc` of `encoder/w`) names another
parameter: counted as covering, it would let a gradient tree that lacks `w2` freeze it, the
very typo the missing-paths check exists to catch.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx._core.call_checks import check_complete


@pytest.mark.parametrize(
    "present,known,missing",
    [
        (["w"], ["w", "w2"], "w2"),
        (["enc"], ["enc", "encoder/w"], "encoder/w"),
        (["layers/1"], ["layers/1/w", "layers/10/w"], "layers/10/w"),
        (["a/b"], ["a/b", "a/bc/w"], "a/bc/w"),
    ],
)
def test_a_string_prefix_is_no_cover(present, known, missing):
    with pytest.raises(ValueError, match=rf"no entry for 1 parameter path\(s\): '{missing}'"):
        check_complete("tx", present, known)


def test_a_segment_prefix_covers_its_subtree():
    check_complete("tx", ["head", "enc/w"], ["head/w", "head/b/x", "enc/w"])


@pytest.mark.parametrize("tx", [gradtx.sgd(0.1), gradtx.adam(0.1)], ids=["sgd", "adam"])
def test_a_gradient_at_w_does_not_cover_w2(tx):
    params = {"w": jnp.ones(2), "w2": jnp.ones(2)}
    state = tx.init(params)
    with pytest.raises(ValueError, match=r"no entry for 1 parameter path\(s\): 'w2'"):
        tx.update({"w": jnp.ones(2)}, state, params)


def test_a_none_subtree_at_enc_does_not_cover_encoder():
    tx = gradtx.adam(0.1)
    params = {"enc": jnp.ones(2), "encoder": {"w": jnp.ones(3)}}
    state = tx.init(params)
    with pytest.raises(ValueError, match=r"'encoder/w'"):
        tx.update({"enc": None}, state, params)
    # the same `None` does cover a true subtree
    params = {"enc": {"w": jnp.ones(3)}, "encoder": {"w": jnp.ones(3)}}
    state = tx.init(params)
    updates, new = tx.update({"enc": None, "encoder": {"w": jnp.ones(3)}}, state, params)
    assert updates["enc"] is None
    np.testing.assert_array_equal(new["mu"]["enc/w"], state["mu"]["enc/w"])


def test_without_params_the_states_paths_are_checked_alike():
    tx = gradtx.adam(0.1)
    state = tx.init({"w": jnp.ones(2), "w2": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"'w2'"):
        tx.update({"w": jnp.ones(2)}, state)
