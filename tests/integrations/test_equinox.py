"""gradtx with real Equinox modules: field paths, `None` gradients, masks, groups, donation.

An `eqx.Module` is a pytree whose leaves are named by field (`layers/0/weight`), so every
selector, state key and `explain` row reads the module's own field names. Gradients come from
`eqx.filter_grad`, which gives `None` for the fields that are not arrays (here the activation
function): no update and no state for them.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx

eqx = pytest.importorskip("equinox", reason="the Equinox integration tests need equinox")

RTOL, ATOL = 1e-5, 1e-6  # float32: gradtx and optax round the same math differently by ulps
WEIGHTS = ["layers/0/weight", "layers/1/weight", "layers/2/weight"]
BIASES = ["layers/0/bias", "layers/1/bias", "layers/2/bias"]


class MLP(eqx.Module):
    """A small MLP; `activation` is a function leaf, so `filter_grad` gives it `None`."""

    layers: list
    activation: Callable

    def __init__(self, key: jax.Array, sizes: tuple[int, ...] = (3, 16, 8, 1)) -> None:
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = [eqx.nn.Linear(a, b, key=k) for a, b, k in zip(sizes[:-1], sizes[1:], keys)]
        self.activation = jax.nn.tanh

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.layers[-1](x)


def _model(seed: int = 0) -> MLP:
    return MLP(jax.random.PRNGKey(seed))


def _data(seed: int = 1, n: int = 64) -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.PRNGKey(seed), (n, 3))
    y = jnp.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return x, y


def _loss(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def _params(model: MLP) -> MLP:
    return eqx.filter(model, eqx.is_array)


def _arrays(tree: object) -> list[np.ndarray]:
    return [np.asarray(a) for a in jax.tree.leaves(eqx.filter(tree, eqx.is_array))]


def _assert_models_close(a: object, b: object, rtol: float = RTOL, atol: float = ATOL) -> None:
    assert jax.tree.structure(_params(a)) == jax.tree.structure(_params(b))
    for x, y in zip(_arrays(a), _arrays(b)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def _assert_models_equal(a: object, b: object) -> None:
    assert jax.tree.structure(_params(a)) == jax.tree.structure(_params(b))
    for x, y in zip(_arrays(a), _arrays(b)):
        np.testing.assert_array_equal(x, y)


def _train(tx, model: MLP, steps: int, *, optax_promotion: bool = False) -> tuple[MLP, object]:
    """`steps` eager steps of `tx` (gradtx or optax) on the regression, applied by Equinox."""
    x, y = _data()
    state = tx.init(_params(model))
    for _ in range(steps):
        grads = eqx.filter_grad(_loss)(model, x, y)
        if optax_promotion:  # optax mixes Python scalars and int counts
            with jax.numpy_dtype_promotion("standard"):
                updates, state = tx.update(grads, state, _params(model))
        else:
            updates, state = tx.update(grads, state, _params(model))
        model = eqx.apply_updates(model, updates)
    return model, state


def _field_mask(model: MLP, field: str) -> MLP:
    """An Equinox module of bools, True at the leaves whose field is `field` (optax's mask)."""
    return jax.tree_util.tree_map_with_path(
        lambda kp, _: getattr(kp[-1], "name", None) == field, _params(model)
    )


# --- paths ---------------------------------------------------------------------------------------


def test_a_modules_paths_are_its_field_names():
    model = _model()
    grads = eqx.filter_grad(_loss)(model, *_data())
    present = [p for p, leaf in gradtx.paths.leaves(grads).items() if leaf is not None]
    assert present == [p for pair in zip(WEIGHTS, BIASES) for p in pair]
    assert gradtx.paths.leaves(grads)["activation"] is None  # a function: no gradient
    assert gradtx.paths.select(_params(model), "**/weight") == WEIGHTS


# --- adamw with a mask by field name ---------------------------------------------------------


def test_adamw_masked_by_field_name_matches_optax():
    tx = gradtx.adamw(3e-3, weight_decay=0.1, mask="**/weight")
    oracle = optax.adamw(3e-3, weight_decay=0.1, mask=_field_mask(_model(), "weight"))
    got, state = _train(tx, _model(), 10)
    want, _ = _train(oracle, _model(), 10, optax_promotion=True)
    _assert_models_close(got, want)
    assert got.activation is jax.nn.tanh  # non-array fields ride along untouched
    # the state holds the arrays' paths only: nothing for the activation function
    assert sorted(gradtx.state_dict(state)) == sorted(
        f"{slot}/{path}" for slot in ("count", "mu", "nu") for path in WEIGHTS + BIASES
    )


def test_weight_decay_reaches_the_selected_fields_only():
    model = _model()
    zero = jax.tree.map(jnp.zeros_like, _params(model))
    tx = gradtx.adamw(0.1, weight_decay=0.5, mask="**/weight")
    updates, _ = tx.update(zero, tx.init(_params(model)), _params(model))
    for i, layer in enumerate(model.layers):
        np.testing.assert_allclose(updates.layers[i].weight, -0.1 * 0.5 * layer.weight, rtol=1e-6)
        np.testing.assert_array_equal(updates.layers[i].bias, np.zeros_like(layer.bias))
    assert updates.activation is None


def test_a_callable_module_of_bools_is_a_mask_not_a_function():
    # The mask is an MLP whose leaves are bools: callable, yet used as data, never called.
    mask = _field_mask(_model(), "weight")
    assert callable(mask)
    tx = gradtx.masked(gradtx.sgd(0.1, momentum=0.9), mask)
    state = tx.init(_params(_model()))
    assert sorted(gradtx.state_dict(state)) == [f"trace/{p}" for p in WEIGHTS]


# --- apply_updates ---------------------------------------------------------------------------


def test_equinox_and_gradtx_apply_updates_give_the_same_model():
    model = _model()
    tx = gradtx.adamw(1e-2, weight_decay=0.1, mask="**/weight")
    grads = eqx.filter_grad(_loss)(model, *_data())
    updates, _ = tx.update(grads, tx.init(_params(model)), _params(model))
    by_eqx = eqx.apply_updates(model, updates)
    by_gradtx = gradtx.apply_updates(model, updates)
    assert type(by_gradtx) is MLP and by_gradtx.activation is model.activation
    _assert_models_equal(by_eqx, by_gradtx)
    for new, old in zip(_arrays(by_gradtx), _arrays(model)):
        assert new.dtype == old.dtype


# --- partition and freeze by field names -----------------------------------------------------


def test_partition_by_field_names_matches_optax_multi_transform():
    tx = gradtx.partition(
        {"weights": gradtx.adam(3e-3), "biases": gradtx.sgd(1e-2, momentum=0.9)},
        {"weights": "**/weight", "biases": "**/bias"},
    )
    labels = jax.tree.map(
        lambda is_weight: "weights" if is_weight else "biases", _field_mask(_model(), "weight")
    )
    # optax would call a callable label tree (an Equinox module is one): hand it over as data
    oracle = optax.multi_transform(
        {"weights": optax.adam(3e-3), "biases": optax.sgd(1e-2, momentum=0.9)}, lambda _: labels
    )
    got, state = _train(tx, _model(), 10)
    want, _ = _train(oracle, _model(), 10, optax_promotion=True)
    _assert_models_close(got, want)
    keys = gradtx.state_dict(state)
    biases = sorted(k for k in keys if k.startswith("biases/"))
    assert biases == [f"biases/trace/{p}" for p in BIASES]
    assert sorted(k for k in keys if k.startswith("weights/mu/")) == [
        f"weights/mu/{p}" for p in WEIGHTS
    ]


def test_partition_labels_from_a_function_of_the_path():
    by_field = gradtx.partition(
        {"weight": gradtx.adam(3e-3), "bias": gradtx.sgd(1e-2)},
        lambda path, leaf: path.rsplit("/", 1)[-1],
    )
    by_glob = gradtx.partition(
        {"weight": gradtx.adam(3e-3), "bias": gradtx.sgd(1e-2)},
        {"weight": "**/weight", "bias": "**/bias"},
    )
    got, _ = _train(by_field, _model(), 3)
    want, _ = _train(by_glob, _model(), 3)
    _assert_models_equal(got, want)


def test_freeze_by_field_path_keeps_the_frozen_layer_and_gives_it_no_state():
    model = _model()
    tx = gradtx.freeze(gradtx.adamw(1e-2, weight_decay=0.1, mask="**/weight"), "layers/0/**")
    trained, state = _train(tx, model, 5)
    np.testing.assert_array_equal(trained.layers[0].weight, model.layers[0].weight)
    np.testing.assert_array_equal(trained.layers[0].bias, model.layers[0].bias)
    assert not np.array_equal(trained.layers[1].weight, model.layers[1].weight)
    assert not any("layers/0/" in key for key in gradtx.state_dict(state))
    # the same as the optimizer run on the other layers alone, layer 0 getting zero updates
    rest = gradtx.adamw(1e-2, weight_decay=0.1, mask="**/weight")
    alone = gradtx.partition(
        {"train": rest, "frozen": gradtx.set_to_zero()},
        {"frozen": "layers/0/**", "train": "!layers/0/**"},
    )
    by_hand, _ = _train(alone, model, 5)
    _assert_models_close(trained, by_hand, rtol=1e-6, atol=0.0)
    table = gradtx.explain(tx, _params(model))
    assert table["layers/0/weight"].frozen and table["layers/0/weight"].learning_rate == 0.0
    assert not table["layers/1/weight"].frozen


# --- jitted, donated steps -------------------------------------------------------------------


def _step_fn(tx) -> Callable:
    def step(batch, model, state):
        x, y = batch
        loss, grads = eqx.filter_value_and_grad(_loss)(model, x, y)
        updates, state = tx.update(grads, state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), state, loss

    return step


def test_a_filter_jit_step_with_donated_model_and_state():
    tx = gradtx.chain(
        gradtx.clip_by_global_norm(1.0), gradtx.adamw(1e-2, weight_decay=0.1, mask="**/weight")
    )
    plain = eqx.filter_jit(_step_fn(tx))
    donated = eqx.filter_jit(_step_fn(tx), donate="all-except-first")
    batch = _data()
    model = _model()
    state = tx.init(_params(model))
    for _ in range(3):  # the step's outputs can be donated again: same structure and dtypes
        want_model, want_state, want_loss = plain(batch, model, state)
        # jit leaves out the inputs a step never reads, and does not donate them: clip's
        # statistics are written, never read
        read = {k: v for k, v in gradtx.state_dict(state).items() if k.startswith("adamw/")}
        buffers = jax.tree.leaves(_params(model)) + list(read.values())
        model, state, loss = donated(batch, model, state)
        assert all(b.is_deleted() for b in buffers)
        assert len(read) == 3 * 6  # count, mu and nu of 6 paths
        _assert_models_equal(model, want_model)
        flat, want_flat = gradtx.state_dict(state), gradtx.state_dict(want_state)
        assert flat.keys() == want_flat.keys()
        for key in flat:
            np.testing.assert_array_equal(flat[key], want_flat[key], err_msg=key)
        assert float(loss) == float(want_loss)
    assert not any(b.is_deleted() for b in jax.tree.leaves(batch))  # the batch was kept


# --- state keys and explain ------------------------------------------------------------------


def test_state_dict_and_explain_read_the_field_paths():
    model = _model()
    tx = gradtx.chain(
        gradtx.clip_by_global_norm(1.0), gradtx.adamw(1e-3, weight_decay=0.1, mask="**/weight")
    )
    state = tx.init(_params(model))
    flat = gradtx.state_dict(state)
    assert "adamw/mu/layers/1/weight" in flat and "adamw/nu/layers/2/bias" in flat
    assert flat["adamw/mu/layers/1/weight"].shape == model.layers[1].weight.shape
    table = gradtx.explain(tx, _params(model))
    assert [row.path for row in table.rows] == [p for pair in zip(WEIGHTS, BIASES) for p in pair]
    weight, bias = table["layers/0/weight"], table["layers/0/bias"]
    assert weight.learning_rate == pytest.approx(1e-3) and weight.weight_decay == pytest.approx(0.1)
    assert bias.weight_decay == 0.0
    assert weight.state_dtypes == {"adamw/count": "i32", "adamw/mu": "f32", "adamw/nu": "f32"}
    assert "layers/0/weight" in str(table)
    # the flat state loads back into the same structure
    loaded, report = gradtx.load_state_dict(tx, _params(model), flat)
    assert report.clean
    assert jax.tree.structure(loaded) == jax.tree.structure(state)


def test_reconcile_after_adding_a_layer_keeps_the_surviving_fields_state():
    model = _model()
    tx = gradtx.adam(1e-2)
    _, state = _train(tx, model, 2)
    wider = MLP(jax.random.PRNGKey(0), sizes=(3, 16, 8, 4, 1))
    new_state, report = gradtx.reconcile(tx, state, _params(wider))
    assert "mu/layers/3/weight" in report.missing and "mu/layers/2/weight" in report.mismatched
    old, new = gradtx.state_dict(state), gradtx.state_dict(new_state)
    np.testing.assert_array_equal(new["mu/layers/0/weight"], old["mu/layers/0/weight"])


# --- training --------------------------------------------------------------------------------


def test_loss_goes_down_on_a_small_regression():
    tx = gradtx.adamw(1e-2, weight_decay=1e-4, mask="**/weight")
    step = eqx.filter_jit(_step_fn(tx), donate="all-except-first")
    batch = _data()
    model = _model()
    state = tx.init(_params(model))
    first = float(_loss(model, *batch))
    for _ in range(300):
        model, state, loss = step(batch, model, state)
    assert float(loss) < 0.1 * first, (first, float(loss))


# --- misuse --------------------------------------------------------------------------------------


def test_init_on_an_unfiltered_module_names_the_field_that_is_not_an_array():
    with pytest.raises(TypeError, match=r"'activation' is a .*eqx.filter\(model"):
        gradtx.adam(1e-3).init(_model())


def test_update_takes_the_unfiltered_module_as_params():
    # Only the paths with a gradient read their param, so the function field is never touched.
    model = _model()
    tx = gradtx.adamw(1e-2, weight_decay=0.1, mask="**/weight")
    grads = eqx.filter_grad(_loss)(model, *_data())
    state = tx.init(_params(model))
    from_module, _ = tx.update(grads, state, model)
    from_filtered, _ = tx.update(grads, state, _params(model))
    # two compiled programs (other input trees): XLA may fuse them differently, by an ulp
    _assert_models_close(from_module, from_filtered, rtol=1e-6, atol=0.0)


def test_python_number_fields_get_state_like_arrays():
    # Equinox modules may hold Python numbers as leaves (eqx.nn.Dropout's `p`); optax makes
    # state for them too. filter_grad gives them `None`, so they never move.
    class Scaled(eqx.Module):
        linear: eqx.nn.Linear
        gain: float

        def __call__(self, x):
            return self.gain * self.linear(x)

    model = Scaled(eqx.nn.Linear(3, 1, key=jax.random.PRNGKey(0)), 2.0)
    tx = gradtx.adam(1e-2)
    state = tx.init(model)
    assert gradtx.state_dict(state)["mu/gain"].dtype == jnp.float32
    grads = eqx.filter_grad(_loss)(model, *_data())
    assert grads.gain is None
    updates, new_state = tx.update(grads, state, model)
    assert updates.gain is None
    assert int(gradtx.state_dict(new_state)["count/gain"]) == 0
    assert gradtx.apply_updates(model, updates).gain == 2.0
