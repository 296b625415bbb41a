"""Predictable misuse fails early, with a message that names the path, the selector or the fix."""

import jax
import jax.numpy as jnp
import optax
import pytest

import gradtx
from gradtx.paths import SelectorError


def _params():
    return {"enc": {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)}, "head": {"w": jnp.ones((2, 1))}}


# --- state from another transformation ---------------------------------------------------------


def test_optimizer_given_another_optimizers_state():
    params = _params()
    state = gradtx.sgd(0.1, momentum=0.9).init(params)
    with pytest.raises(KeyError, match=r"adam: the state has no 'mu' entry \(it has \['trace'\]\)"):
        gradtx.adam(0.1).update(params, state, params)


def test_optimizer_given_an_optax_state():
    params = _params()
    state = optax.adam(0.1).init(params)
    with pytest.raises(TypeError, match=r"a dict with keys \['mu', 'nu', 'count'\]\), got tuple"):
        gradtx.adam(0.1).update(params, state, params)


def test_chain_given_a_child_state():
    params = _params()
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1))
    with pytest.raises(
        KeyError, match=r"no 'clip_by_global_norm' entry \(it has \['count', 'mu', 'nu'"
    ):
        tx.update(params, gradtx.adam(0.1).init(params), params)


def test_chain_given_a_tuple_state_names_expected_keys():
    params = _params()
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1))
    with pytest.raises(TypeError, match=r"keys \['clip_by_global_norm', 'adam'\]\), got tuple"):
        tx.update(params, (), params)


def test_transform_given_another_transforms_state_names_expected_keys():
    params = _params()
    state = gradtx.trace(0.9).init(params)
    with pytest.raises(KeyError, match=r"scale_by_adam: .*\['mu', 'nu', 'count'\].*\['trace'\]"):
        gradtx.scale_by_adam().update(params, state, params)


# --- params changed without reconcile ----------------------------------------------------------


def test_update_after_params_gained_a_path():
    tx = gradtx.adamw(0.1, mask="**/w")
    params = _params()
    state = tx.init(params)
    grown = {**params, "extra": {"w": jnp.ones(3)}}
    with pytest.raises(KeyError, match=r"no 'mu' entry for path 'extra/w'.*gradtx\.reconcile"):
        tx.update(grown, state, grown)
    state, _ = gradtx.reconcile(tx, state, grown)
    tx.update(grown, state, grown)  # fine once reconciled


def test_update_with_momentum_after_params_gained_a_path():
    tx = gradtx.chain(gradtx.clip(1.0), gradtx.sgd(0.1, momentum=0.9))
    params = _params()
    state = tx.init(params)
    grown = {**params, "new": jnp.ones(1)}
    with pytest.raises(KeyError, match=r"'trace' entry for path 'new'.*reconcile"):
        tx.update(grown, state, grown)


def test_update_with_a_changed_shape_names_the_path():
    tx = gradtx.adam(0.1)
    params = _params()
    state = tx.init(params)
    grads = {**params, "head": {"w": jnp.ones((3, 1))}}
    with pytest.raises(ValueError, match=r"at path 'head/w' the update has shape \(3, 1\) but the"):
        tx.update(grads, state, params)


# --- params needed but missing -----------------------------------------------------------------


def test_add_decayed_weights_without_params():
    tx = gradtx.add_decayed_weights(1e-4)
    params = _params()
    with pytest.raises(ValueError, match=r"add_decayed_weights needs the params: call"):
        tx.update(params, tx.init(params))


def test_adamw_without_params():
    tx = gradtx.adamw(1e-3)
    params = _params()
    with pytest.raises(ValueError, match=r"add_decayed_weights needs the params"):
        tx.update(params, tx.init(params))


# --- selectors ---------------------------------------------------------------------------------


def test_mask_typo_fails_at_init_and_names_the_glob():
    tx = gradtx.adamw(1e-3, mask=["**/w", "**/bais"])
    with pytest.raises(SelectorError, match=r"the glob '\*\*/bais' matches no path"):
        tx.init(_params())


def test_bad_mask_type_fails_at_construction():
    with pytest.raises(
        SelectorError, match=r"`AddDecayedWeights.mask`: cannot use int 3 as a selector"
    ):
        gradtx.add_decayed_weights(0.1, mask=3)


# --- apply_updates -----------------------------------------------------------------------------


def test_apply_updates_for_unknown_path():
    with pytest.raises(KeyError, match=r"update for path 'enc/bias' but no parameter there"):
        gradtx.apply_updates(_params(), {"enc": {"bias": jnp.zeros(2)}})


def test_apply_updates_shape_mismatch():
    with pytest.raises(ValueError, match=r"at path 'enc/b' the update has shape \(3,\)"):
        gradtx.apply_updates(_params(), {"enc": {"b": jnp.zeros(3)}})


# --- construction ------------------------------------------------------------------------------


def test_chain_with_a_non_transformation():
    with pytest.raises(TypeError, match=r"`chain argument 1` must be a transformation.*got int: 3"):
        gradtx.chain(gradtx.scale(1.0), 3)
    with pytest.raises(TypeError, match=r"must be a transformation.*got function"):
        gradtx.chain(lambda g: g)


def test_named_chain_with_a_bad_pair():
    with pytest.raises(TypeError, match=r"argument 1 must be a \(name, transformation\) pair"):
        gradtx.named_chain(("a", gradtx.scale(1.0)), gradtx.scale(2.0))
    with pytest.raises(TypeError, match=r"argument 0 must be a \(name, transformation\) pair"):
        gradtx.named_chain((1, gradtx.scale(1.0)))
    with pytest.raises(TypeError, match=r"`named_chain\['b'\]` must be a transformation"):
        gradtx.named_chain(("b", "not a transformation"))


def test_named_chain_with_a_repeated_name():
    with pytest.raises(ValueError, match=r"the names \['a'\] are used more than once"):
        gradtx.named_chain(("a", gradtx.scale(1.0)), ("a", gradtx.scale(2.0)))


def test_sgd_nesterov_without_momentum():
    with pytest.raises(ValueError, match=r"sgd: nesterov=True needs a `momentum` value"):
        gradtx.sgd(0.1, nesterov=True)


def test_scale_by_schedule_with_a_float():
    with pytest.raises(TypeError, match=r"`step_size_fn` must be a schedule.*use gradtx\.scale"):
        gradtx.scale_by_schedule(0.1)


@pytest.mark.parametrize(
    "make,name",
    [
        (lambda: gradtx.adam(0.1, b1="0.9"), "ScaleByAdam.b1"),
        (lambda: gradtx.adam("1e-3"), "ScaleByLearningRate.learning_rate"),
        (lambda: gradtx.sgd(0.1, momentum="0.9"), "Trace.decay"),
        (lambda: gradtx.clip_by_global_norm("1"), "ClipByGlobalNorm.max_norm"),
        (lambda: gradtx.add_decayed_weights("0.1"), "AddDecayedWeights.weight_decay"),
    ],
    ids=["b1", "learning_rate", "momentum", "max_norm", "weight_decay"],
)
def test_hyperparameter_given_a_string(make, name):
    with pytest.raises(TypeError, match=rf"`{name}` must be a number.*got str"):
        make()


def test_hyperparameter_given_a_complex_number():
    with pytest.raises(TypeError, match=r"`Scale.step_size` must be real"):
        gradtx.scale(1j)


def test_bad_state_dtype():
    with pytest.raises(TypeError, match=r"`ScaleByAdam.mu_dtype` must be a dtype or None"):
        gradtx.adam(0.1, mu_dtype="not a dtype")


@pytest.mark.parametrize("packed", [False, True], ids=["tree", "packed"])
def test_params_missing_a_path_that_needs_them_are_named(packed):
    net = {"w": jnp.ones(2), "b": jnp.zeros(3)}
    params = {"net": gradtx.pack(net) if packed else net, "head": jnp.ones(2)}
    tx = gradtx.add_decayed_weights(0.1)
    grads = jax.tree.map(jnp.ones_like, params)
    with pytest.raises(KeyError, match="add_decayed_weights: the params have no leaf at path"):
        tx.update(grads, tx.init(params), {"head": params["head"]})
