"""masked, partition, freeze, inject_hyperparams, and reading hyperparameters by name."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx import schedules
from gradtx.paths import LabelError, SelectorError


def _params(dtype=jnp.float32):
    return {
        "enc": {"w": jnp.full((2, 3), 0.5, dtype), "b": jnp.zeros(3, dtype)},
        "head": {"w": jnp.ones(3, dtype), "s": jnp.asarray(2.0, dtype)},
    }


def _grads(params, salt=1.0):
    return jax.tree.map(
        lambda p: (jnp.cos(p.astype(jnp.float32) * salt + 0.3) + 0.1).astype(p.dtype), params
    )


def _keys(state):
    return sorted(gradtx.state_dict(state))


def _nbytes(state):
    return sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))


def _equal(a, b):
    flat_a, flat_b = gradtx.paths.leaves(a), gradtx.paths.leaves(b)
    assert flat_a.keys() == flat_b.keys()
    for path, x in flat_a.items():
        if x is None:
            assert flat_b[path] is None, path
        else:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(flat_b[path]), err_msg=path)


def _run(tx, params, steps=3, jit=True):
    state = tx.init(params)
    step = jax.jit(tx.update) if jit else tx.update
    history = []
    for t in range(steps):
        u, state = step(_grads(params, 1.0 + t), state, params)
        params = gradtx.apply_updates(params, u)
        history.append(u)
    return params, state, history


# --- masked -----------------------------------------------------------------------------------


def test_masked_state_holds_only_the_selected_paths():
    tx = gradtx.masked(gradtx.adam(0.1), "**/w")
    assert _keys(tx.init(_params())) == [
        "count/enc/w",
        "count/head/w",
        "mu/enc/w",
        "mu/head/w",
        "nu/enc/w",
        "nu/head/w",
    ]


def test_masked_passes_other_updates_through_and_matches_inner_on_the_rest():
    params = _params()
    tx = gradtx.masked(gradtx.adam(0.1), "**/w")
    only_w = {"enc": {"w": params["enc"]["w"]}, "head": {"w": params["head"]["w"]}}
    alone = gradtx.adam(0.1)
    state, alone_state = tx.init(params), alone.init(only_w)
    grads = _grads(params)
    u, state = tx.update(grads, state, params)
    g_w = {"enc": {"w": grads["enc"]["w"]}, "head": {"w": grads["head"]["w"]}}
    u_alone, alone_state = alone.update(g_w, alone_state, only_w)
    _equal([u["enc"]["b"], u["head"]["s"]], [grads["enc"]["b"], grads["head"]["s"]])
    _equal({"enc": {"w": u["enc"]["w"]}, "head": {"w": u["head"]["w"]}}, u_alone)
    _equal(state, alone_state)


def test_nested_masks_apply_where_both_select():
    tx = gradtx.masked(gradtx.masked(gradtx.sgd(0.5), "**/w"), "enc")
    params = _params()
    u, state = tx.update(_grads(params), tx.init(params), params)
    g = _grads(params)
    np.testing.assert_array_equal(u["enc"]["w"], -0.5 * g["enc"]["w"])
    for path in (("enc", "b"), ("head", "w"), ("head", "s")):
        np.testing.assert_array_equal(u[path[0]][path[1]], g[path[0]][path[1]])


def test_masked_update_without_selected_gradients_leaves_state_untouched():
    tx = gradtx.masked(gradtx.inject_hyperparams(gradtx.adam)(learning_rate=0.1), "enc")
    params = _params()
    state = tx.init(params)
    _, state = tx.update(_grads(params), state, params)
    only_head = {"enc": None, "head": _grads(params)["head"]}
    u, after = tx.update(only_head, state, params)
    _equal(after, state)
    assert int(after.count) == 1
    _equal(u["head"], only_head["head"])


def test_masked_function_mask_is_called_with_the_params():
    def kernels(params):
        return jax.tree.map(lambda x: x.ndim == 2, params)

    tx = gradtx.masked(gradtx.sgd(0.1, momentum=0.9), kernels)
    assert _keys(tx.init(_params())) == ["trace/enc/w"]


def test_masked_whole_packed_params_and_refuses_a_split_buffer():
    params = {"body": gradtx.pack(_params()["enc"]), "head": _params()["head"]}
    tx = gradtx.masked(gradtx.adam(0.1), "body")
    state = tx.init(params)
    assert "mu/body/w" in gradtx.state_dict(state)
    grads = {"body": gradtx.pack(_grads(_params())["enc"]), "head": _grads(_params())["head"]}
    u, _ = jax.jit(tx.update)(grads, state, params)
    plain = gradtx.masked(gradtx.adam(0.1), "enc")
    u_plain, _ = plain.update(_grads(_params()), plain.init(_params()), _params())
    np.testing.assert_allclose(u["body"].unpack()["w"], u_plain["enc"]["w"], rtol=1e-6)
    with pytest.raises(ValueError, match="packed params at 'body'"):
        gradtx.masked(gradtx.adam(0.1), "body/w").init(params)


# --- partition --------------------------------------------------------------------------------


def test_partition_states_hold_each_label_and_counts_are_their_own():
    tx = gradtx.partition(
        {"enc": gradtx.adam(0.1), "head": gradtx.adam(schedules.linear(0.1, 0.0, 4))},
        {"enc": "enc", "head": "head"},
    )
    params = _params()
    state = tx.init(params)
    assert [k for k in _keys(state) if k.startswith("enc/")] == [
        "enc/count/enc/b",
        "enc/count/enc/w",
        "enc/mu/enc/b",
        "enc/mu/enc/w",
        "enc/nu/enc/b",
        "enc/nu/enc/w",
    ]
    assert "head/schedule_count/head/w" in _keys(state)
    grads = _grads(params)
    _, state = tx.update(grads, state, params)
    _, state = tx.update({"enc": grads["enc"], "head": None}, state, params)
    flat = gradtx.state_dict(state)
    assert int(flat["enc/count/enc/w"]) == 2
    assert int(flat["head/count/head/w"]) == 1
    assert int(flat["head/schedule_count/head/s"]) == 1


def test_multi_transform_is_partition_and_accepts_a_label_tree():
    labels = {"enc": "a", "head": {"w": "a", "s": "b"}}
    tx = gradtx.multi_transform({"a": gradtx.sgd(0.1), "b": gradtx.set_to_zero()}, labels)
    params = _params()
    u, _ = tx.update(_grads(params), tx.init(params), params)
    assert float(u["head"]["s"]) == 0.0
    np.testing.assert_array_equal(u["head"]["w"], -0.1 * _grads(params)["head"]["w"])


def test_partition_label_function_of_the_path():
    tx = gradtx.partition(
        {"kernel": gradtx.sgd(0.1), "other": gradtx.sgd(0.0)},
        lambda path, leaf: "kernel" if path.endswith("/w") else "other",
    )
    params = _params()
    u, _ = tx.update(_grads(params), tx.init(params), params)
    assert float(jnp.abs(u["enc"]["b"]).sum()) == 0.0
    assert float(jnp.abs(u["enc"]["w"]).sum()) > 0.0


# --- freeze -----------------------------------------------------------------------------------


def test_freeze_gives_exact_zeros_no_state_and_no_decay():
    params = _params()
    tx = gradtx.freeze(gradtx.adamw(0.1, weight_decay=0.5), "enc")
    _, state, history = _run(tx, params)
    for u in history:
        for leaf in jax.tree.leaves(u["enc"]):
            np.testing.assert_array_equal(leaf, np.zeros_like(leaf))
    assert all("/enc/" not in f"/{k}" for k in _keys(state))
    # The trainable paths move exactly as `adamw` on them alone.
    _, alone_state, alone = _run(gradtx.adamw(0.1, weight_decay=0.5), {"head": params["head"]})
    for u, v in zip(history, alone):
        _equal(u["head"], v["head"])
    _equal(state, alone_state)


def test_frozen_state_memory_equals_no_state_at_all():
    params = _params()
    for tx in (
        gradtx.freeze(gradtx.adam(0.1), "enc"),
        gradtx.trainable(gradtx.adam(0.1), "head"),
    ):
        assert _nbytes(tx.init(params)) == _nbytes(gradtx.adam(0.1).init({"head": params["head"]}))
        assert _nbytes(tx.init(params)) < _nbytes(gradtx.adam(0.1).init(params))


def test_frozen_paths_are_out_of_the_global_norm():
    params = _params()
    tx = gradtx.freeze(gradtx.chain(gradtx.clip_by_global_norm(0.1), gradtx.sgd(1.0)), "enc")
    u, _ = tx.update(_grads(params), tx.init(params), params)
    head = _grads(params)["head"]
    norm = gradtx.global_norm(head)
    np.testing.assert_allclose(u["head"]["w"], -head["w"] * (0.1 / norm), rtol=1e-6)
    assert tx.frozen_paths(params) == {"enc/w", "enc/b"}


def test_selective_transform_is_freeze():
    params = _params()
    a = gradtx.selective_transform(gradtx.sgd(0.1), freeze_mask="**/s")
    u, _ = a.update(_grads(params), a.init(params), params)
    assert float(u["head"]["s"]) == 0.0
    np.testing.assert_array_equal(u["enc"]["b"], -0.1 * _grads(params)["enc"]["b"])


# --- inject_hyperparams -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "lr", [0.1, schedules.warmup_cosine_decay(0.0, 0.1, 2, 8)], ids=["constant", "schedule"]
)
def test_inject_is_bit_for_bit_the_plain_optimizer(lr):
    params = _params()
    plain = gradtx.adamw(lr, weight_decay=0.01, mask="**/w")
    injected = gradtx.inject_hyperparams(gradtx.adamw)(lr, weight_decay=0.01, mask="**/w")
    p1, _, h1 = _run(plain, params, steps=5)
    p2, _, h2 = _run(injected, params, steps=5)
    for a, b in zip(h1, h2):
        _equal(a, b)
    _equal(p1, p2)


def test_inject_evaluates_the_schedule_at_its_count_and_stores_float32():
    tx = gradtx.inject_hyperparams(gradtx.adam)(
        learning_rate=schedules.linear(0.3, 0.0, 3), b2=0.999
    )
    params = _params(jnp.bfloat16)
    state = tx.init(params)
    values = gradtx.hyperparams(state)
    assert values["b2"].dtype == jnp.float32 and float(values["b2"]) == np.float32(0.999)
    seen = []
    for _ in range(4):
        _, state = jax.jit(tx.update)(_grads(params), state, params)
        seen.append(float(gradtx.hyperparams(state)["learning_rate"]))
    np.testing.assert_allclose(seen, [0.3, 0.2, 0.1, 0.0], atol=1e-7)
    assert int(state.count) == 4


def test_static_arguments_are_detected_by_kind():
    def kernels(path, leaf):
        return leaf.ndim == 2

    def optax_style(params):
        return jax.tree.map(lambda x: x.ndim == 2, params)

    for mask in (kernels, optax_style, "**/w", re.compile(r".*/w")):
        tx = gradtx.inject_hyperparams(gradtx.adamw)(0.1, mask=mask, mu_dtype=jnp.bfloat16)
        assert sorted(tx.hparams) == [
            "b1",
            "b2",
            "eps",
            "eps_root",
            "learning_rate",
            "weight_decay",
        ]
        assert dict(tx.static_kwargs)["mask"].value is mask
        params = _params()
        state = tx.init(params)
        u, _ = tx.update(_grads(params), state, params)  # the mask was used as a mask
        assert gradtx.state_dict(state)["inner/mu/enc/w"].dtype == jnp.bfloat16


def test_int_arguments_with_int_defaults_stay_static_and_static_args_force():
    def factory(learning_rate, every: int = 2, scale: float = 1.0):
        return gradtx.chain(gradtx.scale(scale * every), gradtx.sgd(learning_rate))

    tx = gradtx.inject_hyperparams(factory)(0.1, every=3, scale=2)
    assert sorted(tx.hparams) == ["learning_rate", "scale"]
    forced = gradtx.inject_hyperparams(factory, static_args="scale")(0.1, scale=2.0)
    assert sorted(forced.hparams) == ["learning_rate"]
    with pytest.raises(TypeError, match=r"static_args \['nope'\]"):
        gradtx.inject_hyperparams(factory, static_args=("nope",))(0.1)


def test_set_hyperparams_changes_the_step_without_recompiling():
    tx = gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=0.1)
    params = _params()

    @jax.jit
    def step(state, grads):
        return tx.update(grads, state, params)

    state = tx.init(params)
    grads = _grads(params)
    u1, _ = step(state, grads)
    state = gradtx.set_hyperparams(state, {"learning_rate": 0.01})
    u2, _ = step(state, grads)
    assert step._cache_size() == 1
    np.testing.assert_allclose(u2["enc"]["w"], 0.1 * u1["enc"]["w"], rtol=1e-6)


def test_hyperparams_are_named_by_group():
    params = _params()
    tx = gradtx.partition(
        {
            "encoder": gradtx.inject_hyperparams(gradtx.adam)(learning_rate=1e-3),
            "head": gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=schedules.constant(0.1)),
        },
        {"encoder": "enc", "head": "head"},
    )
    state = tx.init(params)
    names = gradtx.hyperparams(state)
    assert {"encoder/learning_rate", "encoder/b1", "head/learning_rate"} <= set(names)
    with pytest.raises(KeyError, match="no injected hyperparameter named 'encoder/lr'"):
        gradtx.set_hyperparams(state, {"encoder/lr": 0.1})
    with pytest.raises(ValueError, match="'head/learning_rate' follows a schedule"):
        gradtx.set_hyperparams(state, {"head/learning_rate": 0.1})
    new = gradtx.set_hyperparams(state, {"encoder/learning_rate": 5e-4})
    assert float(gradtx.hyperparams(new)["encoder/learning_rate"]) == np.float32(5e-4)
    assert float(gradtx.hyperparams(state)["encoder/learning_rate"]) == np.float32(1e-3)


# --- explain and reset ------------------------------------------------------------------------


def _loop_built_groups():
    groups = {"enc": (0.1, "enc"), "head": (0.01, "head")}
    return gradtx.chain(
        *[
            gradtx.masked(
                gradtx.inject_hyperparams(gradtx.adamw)(
                    learning_rate=schedules.linear(lr, 0.0, 10), weight_decay=0.1, mask="**/w"
                ),
                where,
                name=name,
            )
            for name, (lr, where) in groups.items()
        ]
    )


def test_explain_shows_each_groups_own_learning_rate():
    params = _params()
    table = gradtx.explain(_loop_built_groups(), params, step=5)
    assert table["enc/w"].learning_rate == pytest.approx(0.05, rel=1e-6)
    assert table["head/s"].learning_rate == pytest.approx(0.005, rel=1e-6)
    assert table["enc/w"].weight_decay == pytest.approx(0.1, rel=1e-6)
    assert table["enc/b"].weight_decay == 0.0
    assert table["head/w"].steps[0] == "[head]"
    assert table["head/w"].b2 == pytest.approx(0.999)
    assert table["enc/w"].state_dtypes["enc/inner/mu"] == "f32"
    text = str(table)
    assert text.splitlines()[0] == "step 5" and "enc/w" in text and "0.05" in text
    assert [row["path"] for row in table.to_dicts()] == ["enc/b", "enc/w", "head/s", "head/w"]


def test_explain_marks_frozen_paths_and_state_dtypes():
    tx = gradtx.freeze(gradtx.adam(0.1, mu_dtype=jnp.bfloat16), "enc/b")
    table = gradtx.explain(
        tx, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _params())
    )
    assert table["enc/b"].frozen and table["enc/b"].learning_rate == 0.0
    assert table["enc/b"].state_dtypes == {}
    assert table["enc/w"].state_dtypes == {"mu": "bf16", "nu": "f32", "count": "i32"}


def test_explain_warns_when_a_hyperparameter_rounds_badly():
    # Every other value is exact in bfloat16, so b2 is the only warning.
    tx = gradtx.inject_hyperparams(gradtx.adam, hyperparam_dtype=jnp.bfloat16)(
        2.0**-10, b1=0.5, b2=0.99, eps=2.0**-27
    )
    with pytest.warns(UserWarning, match=r"b2=0.99 is not representable in bfloat16"):
        table = gradtx.explain(tx, _params())
    assert table["enc/w"].b2 == 0.98828125  # what bf16 keeps of 0.99


def test_a_hyperparameter_the_dtype_rounds_out_of_range_is_refused():
    # bfloat16 keeps 0.999 as 1.0: Adam's second moment would never move (0 / 0 after bias
    # correction), so the values are checked as stored, and the message says why.
    tx = gradtx.inject_hyperparams(gradtx.adam, hyperparam_dtype=jnp.bfloat16)(1e-3, b2=0.999)
    with pytest.raises(ValueError, match=r"`b2` must be in \[0, 1\).* b2=0.999 is stored as 1;"):
        tx.init(_params())
    with pytest.raises(ValueError, match=r"b2=0.999 is stored as 1;"), pytest.warns(UserWarning):
        gradtx.explain(tx, _params())


def test_reset_reinitialises_only_the_selected_paths():
    params = _params()
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1))
    _, state, _ = _run(tx, params)
    new = gradtx.reset(tx, state, params, "enc")
    old, fresh = gradtx.state_dict(state), gradtx.state_dict(new)
    for key, value in old.items():
        if "/enc/" in key:
            assert not np.any(np.asarray(fresh[key])), key
        else:
            np.testing.assert_array_equal(fresh[key], value, err_msg=key)
    assert int(fresh["adam/count/enc/w"]) == 0 and int(fresh["adam/count/head/w"]) == 3


# --- misuse -----------------------------------------------------------------------------------


def test_mask_selecting_nothing_raises():
    with pytest.raises(SelectorError, match=r"masked\(mask='\*\*/kernel'\).*matches no path"):
        gradtx.masked(gradtx.adam(0.1), "**/kernel").init(_params())
    with pytest.raises(SelectorError, match="freeze.*matches no path"):
        gradtx.freeze(gradtx.adam(0.1), "decoder").init(_params())


def test_labels_missing_from_transforms_raise():
    tx = gradtx.partition({"a": gradtx.sgd(0.1)}, {"enc": "a", "head": "b"})
    # Keys that are not all labels, values that are not all labels: neither reading fits.
    with pytest.raises(LabelError, match=r"reads neither way.*keys \['enc', 'head'\].*'b'"):
        tx.init(_params())


def test_unlabelled_and_doubly_labelled_paths_raise():
    with pytest.raises(LabelError, match="path 'head/s' has no label"):
        gradtx.partition(
            {"a": gradtx.sgd(0.1), "b": gradtx.sgd(0.1)}, {"a": "enc", "b": "head/w"}
        ).init(_params())
    with pytest.raises(LabelError, match="path 'enc/w' has several labels"):
        gradtx.partition(
            {"a": gradtx.sgd(0.1), "b": gradtx.sgd(0.1)}, {"a": "enc", "b": ["**/w", "head"]}
        ).init(_params())


def test_bool_mask_of_the_wrong_structure_raises():
    with pytest.raises(SelectorError, match="has no entry for path 'head/s'"):
        gradtx.masked(gradtx.sgd(0.1), {"enc": True, "head": {"w": False}}).init(_params())


def test_function_mask_returning_the_wrong_structure_raises():
    with pytest.raises(SelectorError, match="has no entry for path"):
        gradtx.masked(gradtx.sgd(0.1), lambda params: {"encoder": True}).init(_params())
    with pytest.raises(SelectorError, match="must return a pytree of bools"):
        gradtx.masked(gradtx.sgd(0.1), lambda params: "enc").init(_params())


def test_optax_style_label_function_is_called_with_the_params():
    tx = gradtx.partition(
        {"a": gradtx.sgd(0.1), "b": gradtx.set_to_zero()}, lambda params: {"enc": "a", "head": "b"}
    )
    params = _params()
    u, _ = tx.update(_grads(params), tx.init(params), params)
    assert float(jnp.abs(u["head"]["w"]).sum()) == 0.0
    np.testing.assert_array_equal(u["enc"]["w"], -0.1 * _grads(params)["enc"]["w"])
