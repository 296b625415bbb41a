"""Parameter-group scenarios reported against other libraries, end to end.

- optax#1101: groups built in a loop, each `masked(inject_hyperparams(adam)(schedule_i),
  mask_i)` in one `chain`, gave zero updates for some groups. Here every group must equal
  `adam` with its own schedule, and the same with `partition`.
- Two models, one feeding the other, trained in turn from one `partition` with partial
  updates, must equal two separate optimizers bit for bit.
- Gradient accumulation inside a partition equals one step on the whole batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx import schedules

GROUPS = {
    "embed": ("embed", schedules.linear(0.05, 0.01, 6)),
    "body": ("body", schedules.warmup_cosine_decay(0.0, 0.02, 2, 6)),
    "head": ("head", schedules.constant(0.1)),
}


def _params():
    rng = np.random.default_rng(3)
    shapes = {"embed": {"w": (4, 2)}, "body": {"w": (2, 3), "b": (3,)}, "head": {"w": (3,)}}
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(size=s), jnp.float32),
        shapes,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def _grads(params, t):
    return jax.tree.map(lambda p: jnp.sin(p * (t + 1.0)) + 0.05 * t, params)


def _assert_equal(a, b):
    for (path, x), (_, y) in zip(gradtx.paths.leaves(a).items(), gradtx.paths.leaves(b).items()):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=path)


def _assert_close(a, b):
    for (path, x), (_, y) in zip(gradtx.paths.leaves(a).items(), gradtx.paths.leaves(b).items()):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-9, err_msg=path)


def _loop_chain():
    parts = []
    for name, (where, schedule) in GROUPS.items():
        inner = gradtx.inject_hyperparams(gradtx.adam)(learning_rate=schedule)
        parts.append(gradtx.masked(inner, where, name=name))
    return gradtx.chain(*parts)


def _loop_partition():
    transforms = {
        name: gradtx.inject_hyperparams(gradtx.adam)(learning_rate=schedule)
        for name, (_, schedule) in GROUPS.items()
    }
    return gradtx.partition(transforms, {name: where for name, (where, _) in GROUPS.items()})


@pytest.mark.parametrize("build", [_loop_chain, _loop_partition], ids=["masks", "partition"])
def test_loop_built_groups_each_equal_adam_with_their_schedule(build):
    tx = build()
    params = _params()
    state = tx.init(params)
    singles = {name: gradtx.adam(schedule) for name, (_, schedule) in GROUPS.items()}
    single_params = {name: {name: params[name]} for name in GROUPS}
    single_states = {name: singles[name].init(single_params[name]) for name in GROUPS}
    step = jax.jit(tx.update)
    for t in range(6):
        grads = _grads(params, t)
        updates, state = step(grads, state, params)
        params = gradtx.apply_updates(params, updates)
        for name in GROUPS:
            u, single_states[name] = singles[name].update(
                {name: grads[name]}, single_states[name], single_params[name]
            )
            single_params[name] = gradtx.apply_updates(single_params[name], u)
            # The group runs inside one program with the other groups, the single optimizer in
            # a program of its own: XLA fuses and vectorises them differently, which moves
            # float32 results by an ulp or two, so equality is to 1e-6 relative.
            _assert_close(updates[name], u[name])
            for x in jax.tree.leaves(updates[name]):
                assert float(jnp.abs(x).max()) > 0 or (name == "body" and t == 0)  # warm-up
    for name in GROUPS:
        _assert_close(params[name], single_params[name][name])
    values = gradtx.hyperparams(state)
    assert float(values["head/learning_rate"]) == pytest.approx(0.1)
    assert float(values["embed/learning_rate"]) == pytest.approx(0.05 - 0.04 * 5 / 6, rel=1e-6)


# --- two models, one feeding the other -------------------------------------------------------


def _models():
    rng = np.random.default_rng(5)
    return {
        "gen": {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), "b": jnp.zeros(4)},
        "critic": {"w": jnp.asarray(rng.normal(size=(4,)), jnp.float32), "b": jnp.zeros(())},
    }


def _gen_loss(gen, critic, z):
    fake = jnp.tanh(z @ gen["w"] + gen["b"][None, :])
    return -jnp.mean(fake @ critic["w"] + critic["b"])


def _critic_loss(critic, gen, z, real):
    fake = jax.lax.stop_gradient(jnp.tanh(z @ gen["w"] + gen["b"][None, :]))
    score = lambda x: x @ critic["w"] + critic["b"]  # noqa: E731
    return jnp.mean(score(fake)) - jnp.mean(score(real)) + 0.1 * jnp.sum(critic["w"] ** 2)


def test_two_models_in_one_partition_equal_two_optimizers():
    def make_gen():
        return gradtx.adam(schedules.warmup_cosine_decay(0.0, 0.05, 2, 10))

    def make_critic():
        return gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.sgd(0.05, momentum=0.9))

    one = gradtx.partition(
        {"gen": make_gen(), "critic": make_critic()}, {"gen": "gen", "critic": "critic"}
    )
    sep = {"gen": make_gen(), "critic": make_critic()}
    params = _models()
    state = one.init(params)
    alone = {k: {k: params[k]} for k in sep}
    alone_state = {k: sep[k].init(alone[k]) for k in sep}

    @jax.jit
    def step(tx, params, state, grads):
        u, state = tx.update(grads, state, params, partial=True)  # one model at a time
        return gradtx.apply_updates(params, u), state

    rng = np.random.default_rng(0)
    for who in ["critic", "critic", "gen"] * 3:
        z = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)
        real = jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)
        if who == "gen":
            g = jax.grad(_gen_loss)(params["gen"], params["critic"], z)
        else:
            g = jax.grad(_critic_loss)(params["critic"], params["gen"], z, real)
        other = "critic" if who == "gen" else "gen"
        before_params, before_state = params[other], state[other]
        params, state = step(one, params, state, {who: g})
        alone[who], alone_state[who] = step(sep[who], alone[who], alone_state[who], {who: g})
        _assert_equal(params[other], before_params)
        _assert_equal(state[other], before_state)
        _assert_equal(params[who], alone[who][who])
        _assert_equal(state[who], alone_state[who])
    flat = gradtx.state_dict(state)
    assert int(flat["gen/count/gen/w"]) == 3
    assert flat["critic/sgd/trace/critic/w"].shape == (4,)


# --- gradient accumulation inside a partition -------------------------------------------------


def _loss(params, x, y):
    pred = jnp.tanh(x @ params["body"]["w"] + params["body"]["b"][None, :]) @ params["head"]["w"]
    return jnp.mean((pred - y) ** 2)


def test_accumulate_in_a_partition_equals_one_step_on_the_whole_batch():
    def groups():
        return gradtx.partition(
            {"body": gradtx.adam(0.05), "frozen": gradtx.set_to_zero(), "head": gradtx.sgd(0.1)},
            {"body": "body", "frozen": "embed", "head": "head"},
        )

    params = _params()
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(8, 2)), jnp.float32)
    y = jnp.asarray(rng.normal(size=(8,)), jnp.float32)
    acc = gradtx.accumulate(groups(), every=4)
    whole = groups()
    acc_state, whole_state = acc.init(params), whole.init(params)
    p_acc, p_whole = params, params
    grad = jax.jit(jax.grad(_loss))
    for _ in range(3):
        for i in range(4):
            g = grad(p_acc, x[2 * i : 2 * i + 2], y[2 * i : 2 * i + 2])
            u, acc_state = acc.update(g, acc_state, p_acc)
            p_acc = gradtx.apply_updates(p_acc, u)
        u, whole_state = whole.update(grad(p_whole, x, y), whole_state, p_whole)
        p_whole = gradtx.apply_updates(p_whole, u)
        # The mean of four equal-sized micro-batch gradients is the whole batch's gradient,
        # up to float32 summation order.
        for a, b in zip(jax.tree.leaves(p_acc), jax.tree.leaves(p_whole)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert int(gradtx.state_dict(acc_state)["inner/body/count/body/w"]) == 3


def test_accumulate_keeps_one_buffer_per_trainable_path_only():
    tx = gradtx.accumulate(gradtx.freeze(gradtx.adam(0.1), "embed"), every=2)
    keys = [k for k in gradtx.state_dict(tx.init(_params())) if k.startswith("acc/")]
    assert sorted(keys) == ["acc/body/b", "acc/body/w", "acc/head/w"]


# --- selectors inside groups read the whole model -----------------------------------------------


class _Seen(gradtx.Transformation):
    """Records the paths its `init` gets (absent ones included) and passes updates through."""

    @property
    def name(self):
        return "seen"

    def init(self, params):
        _SEEN.append(gradtx.paths.leaves(params))
        return {}

    def update(self, updates, state, params=None, **extra):
        return updates, state


_SEEN: list = []


def test_a_group_gets_every_path_of_the_model_none_outside_it():
    _SEEN.clear()
    tx = gradtx.partition({"a": _Seen(), "b": gradtx.sgd(0.1)}, {"a": "body", "b": ["**", "!body"]})
    tx.init(_params())
    (seen,) = _SEEN
    assert list(seen) == gradtx.paths.paths(_params())  # the whole model's paths
    assert [p for p, x in seen.items() if x is not None] == ["body/b", "body/w"]


def test_masks_and_freezes_nested_in_groups_read_the_whole_model():
    whole = jax.tree.map(lambda p: p.ndim > 1, _params())  # embed/w, body/w
    tx = gradtx.partition(
        {
            # a mask of the whole model; in "head" it selects none of the group's paths
            "body": gradtx.masked(gradtx.adam(0.05), whole),
            "head": gradtx.chain(
                gradtx.freeze(gradtx.sgd(0.1), "embed"), gradtx.masked(gradtx.sgd(0.1), whole)
            ),
            "embed": gradtx.sgd(0.2),
        },
        {"body": "body", "head": "head", "embed": "embed"},
    )
    params = _params()
    state = tx.init(params)
    assert sorted(k for k in gradtx.state_dict(state) if k.startswith("body/")) == [
        "body/count/body/w",
        "body/mu/body/w",
        "body/nu/body/w",
    ]
    grads = _grads(params, 0)
    u, _ = tx.update(grads, state, params)
    np.testing.assert_array_equal(u["body"]["b"], grads["body"]["b"])  # not masked in: as is
    np.testing.assert_allclose(u["head"]["w"], -0.1 * grads["head"]["w"], rtol=1e-6)
    np.testing.assert_allclose(u["embed"]["w"], -0.2 * grads["embed"]["w"], rtol=1e-6)
    # the same masks with a typo fail, inside the group too
    typo = gradtx.partition(
        {"x": gradtx.freeze(gradtx.sgd(0.1), "emebd"), "y": gradtx.sgd(0.1)},
        {"x": "head", "y": ["**", "!head"]},
    )
    with pytest.raises(gradtx.paths.SelectorError, match="the glob 'emebd' matches no path"):
        typo.init(params)


def test_a_partition_nested_in_a_group_labels_its_own_paths():
    inner = gradtx.partition(
        {"w": gradtx.sgd(0.1), "b": gradtx.sgd(0.0)},
        # labels for the whole model: the outer group holds only "body"
        {"w": "**/w", "b": "**/b"},
    )
    tx = gradtx.partition(
        {"body": inner, "rest": gradtx.sgd(0.2)}, {"body": "body", "rest": ["**", "!body"]}
    )
    params = _params()
    grads = _grads(params, 0)
    u, state = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(u["body"]["w"], -0.1 * grads["body"]["w"], rtol=1e-6)
    np.testing.assert_array_equal(u["body"]["b"], jnp.zeros(3))
    np.testing.assert_allclose(u["head"]["w"], -0.2 * grads["head"]["w"], rtol=1e-6)
