"""Partial updates are said out loud: a gradient tree that lacks parameter paths is an error,
unless those paths hold `None` or the call says `partial=True`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx


def _params():
    return {
        "enc": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)},
        "head": {"w": jnp.full((3, 2), 0.5), "b": jnp.zeros(2)},
    }


def _grads(params, salt=1.0):
    return jax.tree.map(lambda p: jnp.cos(p * salt) + 0.1, params)


OPTIMIZERS = {
    "adam": lambda: gradtx.adam(0.1),
    "sgd": lambda: gradtx.sgd(0.1),  # stateless: the params name the paths
    "clip+adamw": lambda: gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(0.1)),
    "partition": lambda: gradtx.partition(
        {"enc": gradtx.adam(0.1), "head": gradtx.sgd(0.1)}, {"enc": "enc/**", "head": "head/**"}
    ),
}


def _without(tree, *keys):
    return {k: v for k, v in tree.items() if k not in keys}


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_missing_subtree_is_an_error_naming_the_paths(name, jit):
    tx = OPTIMIZERS[name]()
    params = _params()
    state = tx.init(params)
    update = jax.jit(tx.update) if jit else tx.update
    grads = _without(_grads(params), "head")
    with pytest.raises(ValueError, match=r"no entry for 2 parameter path\(s\): 'head/b', 'head/w'"):
        update(grads, state, params)


def test_missing_leaf_and_empty_grads_are_errors():
    tx = gradtx.adam(0.1)
    params = _params()
    state = tx.init(params)
    grads = _grads(params)
    grads["enc"] = {"w": grads["enc"]["w"]}
    with pytest.raises(ValueError, match=r"no entry for 1 parameter path\(s\): 'enc/b'.*None"):
        tx.update(grads, state, params)
    with pytest.raises(ValueError, match=r"no entry for 4 parameter path\(s\).*partial=True"):
        tx.update({}, state, params)


def test_without_params_the_state_names_the_paths():
    tx = gradtx.adam(0.1)
    params = _params()
    state = tx.init(params)
    with pytest.raises(ValueError, match=r"scale_by_adam: the gradients have no entry.*'head/w'"):
        tx.update(_without(_grads(params), "head"), state)


def test_a_typo_in_a_key_blames_the_gradients_and_names_the_likely_key():
    tx = gradtx.adam(0.1)
    params = _params()
    state = tx.init(params)
    grads = _grads(params)
    grads["enc"]["wx"] = grads["enc"].pop("w")
    with pytest.raises(ValueError, match=r"'enc/w'.*A typo in the gradients' keys: 'enc/wx'"):
        tx.update(grads, state, params)


def test_an_extra_key_blames_the_gradients_not_the_params():
    tx = gradtx.adam(0.1)
    params = _params()
    state = tx.init(params)
    grads = _grads(params)
    grads["enc"]["bias"] = jnp.zeros(3)
    with pytest.raises(KeyError, match=r"gradients have an entry at 'enc/bias'.*check its keys"):
        tx.update(grads, state, params)


def test_none_leaves_and_partial_true_give_the_same_update_bit_for_bit():
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(0.1))
    params = _params()
    state = tx.init(params)
    grads = _grads(params)
    with_none = {**grads, "head": {"w": None, "b": None}}
    u1, s1 = tx.update(with_none, state, params)
    u2, s2 = tx.update(_without(grads, "head"), state, params, partial=True)
    u3, s3 = jax.jit(lambda g, s, p: tx.update(g, s, p, partial=True))(
        _without(grads, "head"), state, params
    )
    for a, b in ((s1, s2), (s1, s3)):
        jax.tree.map(np.testing.assert_array_equal, gradtx.state_dict(a), gradtx.state_dict(b))
    for u in (u2, u3):
        jax.tree.map(np.testing.assert_array_equal, u1["enc"], u["enc"])
        assert "head" not in u


def test_a_declared_partial_call_does_not_excuse_a_later_undeclared_one():
    """Eager calls run cached compiled programs: the declaration is part of the cache key."""
    tx = gradtx.adam(0.1)
    params = _params()
    state = tx.init(params)
    grads = _without(_grads(params), "head")
    tx.update(grads, state, params, partial=True)
    with pytest.raises(ValueError, match="no entry for 2 parameter path"):
        tx.update(grads, state, params)


def test_alternating_two_models_from_one_optimizer_equals_two_optimizers():
    """Generator and discriminator updated in turn by one optimizer, each step declared
    partial, give bit for bit what two separate optimizers give."""
    params = _params()
    tx = gradtx.adamw(0.05, weight_decay=0.01)
    state = tx.init(params)
    enc_tx, head_tx = gradtx.adamw(0.05, weight_decay=0.01), gradtx.adamw(0.05, weight_decay=0.01)
    enc_state, head_state = enc_tx.init(params["enc"]), head_tx.init(params["head"])
    joint, enc, head = params, params["enc"], params["head"]
    for step in range(6):
        grads = _grads(joint, salt=1.0 + step)
        part = "enc" if step % 2 == 0 else "head"
        updates, state = tx.update({part: grads[part]}, state, joint, partial=True)
        joint = gradtx.apply_updates(joint, updates)
        if part == "enc":
            u, enc_state = enc_tx.update(grads["enc"], enc_state, enc)
            enc = gradtx.apply_updates(enc, u)
        else:
            u, head_state = head_tx.update(grads["head"], head_state, head)
            head = gradtx.apply_updates(head, u)
    jax.tree.map(np.testing.assert_array_equal, joint, {"enc": enc, "head": head})
    assert int(state["count"]["enc/w"]) == 3 and int(state["count"]["head/w"]) == 3
