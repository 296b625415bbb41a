"""`reconcile` and `load_state_dict`: renamed subtrees move their state, a changed path starts
over as a whole (its count too), and a nested state is refused with the fix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx


def _layers(n, width=2):
    return {"layers": [{"w": jnp.full((width,), float(i + 1))} for i in range(n)]}


def _trained(tx, params, steps=3):
    state = tx.init(params)
    for k in range(steps):
        grads = jax.tree.map(lambda p, k=k: jnp.cos(p * (k + 1)), params)
        _, state = tx.update(grads, state, params)
    return state


def test_an_inserted_layer_keeps_every_later_layers_state_with_rename():
    tx = gradtx.adam(0.1)
    params = _layers(3)
    state = _trained(tx, params)
    old = gradtx.state_dict(state)
    grown = {"layers": [params["layers"][0], {"w": jnp.zeros(2)}, *params["layers"][1:]]}
    moves = {"layers/1": "layers/2", "layers/2": "layers/3"}
    new_state, report = gradtx.reconcile(tx, state, grown, rename=moves)
    new = gradtx.state_dict(new_state)
    for slot in ("mu", "nu", "count"):
        np.testing.assert_array_equal(new[f"{slot}/layers/0/w"], old[f"{slot}/layers/0/w"])
        np.testing.assert_array_equal(new[f"{slot}/layers/2/w"], old[f"{slot}/layers/1/w"])
        np.testing.assert_array_equal(new[f"{slot}/layers/3/w"], old[f"{slot}/layers/2/w"])
    assert int(new["count/layers/1/w"]) == 0 and not np.any(new["mu/layers/1/w"])
    assert report.missing == ("count/layers/1/w", "mu/layers/1/w", "nu/layers/1/w")
    assert report.unexpected == () and report.reinitialised == ()


def test_without_rename_the_moments_would_move_to_the_wrong_layer():
    """What `rename` prevents: list indices shift, so state follows the index, not the layer."""
    tx = gradtx.adam(0.1)
    params = _layers(2)
    state = _trained(tx, params)
    grown = {"layers": [params["layers"][0], {"w": jnp.zeros(2)}, params["layers"][1]]}
    moved, _ = gradtx.reconcile(tx, state, grown)
    np.testing.assert_array_equal(moved["mu"]["layers/1/w"], state["mu"]["layers/1/w"])


def test_a_changed_shape_reinitialises_the_whole_path_count_included():
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(0.1))
    params = _layers(2)
    state = _trained(tx, params)
    wider = {"layers": [{"w": jnp.ones(3)}, params["layers"][1]]}
    new_state, report = gradtx.reconcile(tx, state, wider)
    assert report.reinitialised == ("layers/0/w",)
    assert set(report.mismatched) == {"adamw/mu/layers/0/w", "adamw/nu/layers/0/w"}
    assert report.missing == ()
    flat = gradtx.state_dict(new_state)
    assert int(flat["adamw/count/layers/0/w"]) == 0  # bias correction restarts with mu and nu
    assert int(flat["adamw/count/layers/1/w"]) == 3
    assert "re-initialised, every slot and count (1): layers/0/w" in str(report)
    with pytest.raises(gradtx.StateMismatchError, match="re-initialised"):
        gradtx.load_state_dict(tx, wider, gradtx.state_dict(state))


def test_load_state_dict_takes_rename_too_and_checks_its_prefixes():
    tx = gradtx.adam(0.1)
    params = {"enc": {"w": jnp.ones(2)}}
    flat = gradtx.state_dict(_trained(tx, params))
    moved = {"encoder": {"w": jnp.ones(2)}}
    state, report = gradtx.load_state_dict(tx, moved, flat, rename={"enc": "encoder"})
    assert report.clean
    np.testing.assert_array_equal(state["mu"]["encoder/w"], flat["mu/enc/w"])
    with pytest.raises(ValueError, match=r"load_state_dict: `rename` prefixes \['dec'\] match no"):
        gradtx.load_state_dict(tx, moved, flat, rename={"dec": "encoder"})


def test_a_nested_state_is_refused_with_the_fix():
    tx = gradtx.adam(0.1)
    params = {"w": jnp.ones(2)}
    with pytest.raises(TypeError, match=r"Pass `gradtx.state_dict\(state\)` instead"):
        gradtx.load_state_dict(tx, params, tx.init(params))
    with pytest.raises(TypeError, match="must be the dict"):
        gradtx.load_state_dict(tx, params, [1, 2])


def test_traced_hyperparameters_are_not_checked():
    """No host sync: a decay rate known only inside `jit` is taken as given."""
    params = {"w": jnp.ones(2)}

    @jax.jit
    def build_and_step(b1):
        tx = gradtx.adam(0.1, b1=b1)
        return tx.update({"w": jnp.ones(2)}, tx.init(params), params)[0]

    assert build_and_step(jnp.float32(1.5))["w"].shape == (2,)
    with pytest.raises(ValueError, match="decay rate"):
        gradtx.adam(0.1, b1=1.5)


@pytest.mark.parametrize("order", ["shorter first", "longer first"])
def test_rename_takes_the_longest_matching_prefix_in_either_order(order):
    """`enc/head/w` matches both `enc` and `enc/head`: the longer prefix moves it."""
    tx = gradtx.adam(0.1)
    params = {"enc": {"w": jnp.full(2, 1.0), "head": {"w": jnp.full(2, 2.0)}}}
    state = _trained(tx, params)
    old = gradtx.state_dict(state)
    moves = [("enc", "body"), ("enc/head", "top")]
    rename = dict(moves if order == "shorter first" else moves[::-1])
    assert next(iter(rename)) == ("enc" if order == "shorter first" else "enc/head")
    moved = {"body": {"w": jnp.full(2, 1.0)}, "top": {"w": jnp.full(2, 2.0)}}
    new_state, report = gradtx.reconcile(tx, state, moved, rename=rename)
    new = gradtx.state_dict(new_state)
    assert report.missing == () and report.unexpected == () and report.reinitialised == ()
    for slot in ("mu", "nu", "count"):
        np.testing.assert_array_equal(new[f"{slot}/top/w"], old[f"{slot}/enc/head/w"])
        np.testing.assert_array_equal(new[f"{slot}/body/w"], old[f"{slot}/enc/w"])
    # the two moments differ, so a state moved under the wrong name would show
    assert not np.array_equal(old["mu/enc/w"], old["mu/enc/head/w"])
    # load_state_dict reads the prefixes the same way
    loaded, report = gradtx.load_state_dict(tx, moved, old, rename=rename)
    assert report.clean
    np.testing.assert_array_equal(loaded["mu"]["top/w"], old["mu/enc/head/w"])
