"""End-to-end scenarios where a parameter's identity (its path) must carry the optimizer state."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx import schedules

LR, B1, B2, EPS = np.float32(0.1), np.float32(0.9), np.float32(0.999), np.float32(1e-8)


def _target():
    return {
        "w": jnp.asarray([2.0, -3.0, 0.25, -0.1], jnp.float32),
        "b": jnp.asarray([1.5, 0.3, -0.8], jnp.float32),
    }


def _quadratic_grads(params, target):
    # Gradient of sum(0.5 * (p - target)**2): independent per leaf.
    return jax.tree.map(lambda p, t: p - t, params, target)


# --- (a) clipping params after each step keeps the Adam state ----------------------------------


def _numpy_adam_then_clip(params, target, steps, bound=0.5):
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    b1, b2, lr, eps = float(B1), float(B2), float(LR), float(EPS)
    trajectory = []
    for t in range(1, steps + 1):
        for k in p:
            g = p[k] - np.asarray(target[k], np.float64)
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            m_hat = m[k] / (1 - b1**t)
            v_hat = v[k] / (1 - b2**t)
            p[k] = np.clip(p[k] - lr * m_hat / (np.sqrt(v_hat) + eps), -bound, bound)
        trajectory.append(
            (
                {k: x.copy() for k, x in p.items()},
                {k: x.copy() for k, x in m.items()},
                {k: x.copy() for k, x in v.items()},
            )
        )
    return trajectory


def _clip_tree_map(params):
    return jax.tree.map(lambda p: jnp.clip(p, -0.5, 0.5), params)


def _clip_rebuilt_dict(params):
    # A brand-new container, built in another key order, holding new arrays.
    out = {}
    for key in reversed(sorted(params)):
        out[key] = jnp.clip(params[key], -0.5, 0.5)
    return out


@pytest.mark.parametrize(
    "clip_fn", [_clip_tree_map, _clip_rebuilt_dict], ids=["tree_map", "new_dict"]
)
def test_clipping_params_keeps_adam_state(clip_fn):
    tx = gradtx.adam(LR, B1, B2, EPS)
    target = _target()
    params = {"w": jnp.asarray([0.1, -0.2, 0.3, 0.0]), "b": jnp.asarray([0.0, 0.1, -0.1])}
    state = tx.init(params)
    reference = _numpy_adam_then_clip(params, target, 10)

    @jax.jit
    def step(params, state):
        updates, state = tx.update(_quadratic_grads(params, target), state, params)
        return gradtx.apply_updates(params, updates), state

    for t in range(10):
        stepped, state = step(params, state)
        mu_before = {k: np.asarray(x) for k, x in state["mu"].items()}
        nu_before = {k: np.asarray(x) for k, x in state["nu"].items()}
        params = clip_fn(stepped)
        assert params is not stepped
        assert all(params[k] is not stepped[k] for k in params)
        # The clip made new arrays; the state is untouched and still addressed by the same paths.
        for k in params:
            np.testing.assert_array_equal(state["mu"][k], mu_before[k])
            np.testing.assert_array_equal(state["nu"][k], nu_before[k])
        ref_p, ref_m, ref_v = reference[t]
        for k in params:
            np.testing.assert_allclose(params[k], ref_p[k], rtol=1e-5, atol=1e-6, err_msg=k)
            np.testing.assert_allclose(state["mu"][k], ref_m[k], rtol=1e-5, atol=1e-7, err_msg=k)
            np.testing.assert_allclose(state["nu"][k], ref_v[k], rtol=1e-5, atol=1e-9, err_msg=k)
            assert int(state["count"][k]) == t + 1
    # The clip was active: some coordinates sit on the boundary.
    assert np.any(np.abs(np.asarray(params["w"])) == np.float32(0.5))


def test_clipping_then_reset_state_would_differ():
    # Guard for the test above: the reference with a fresh Adam state after every clip differs,
    # so keeping the moments is observable.
    target = _target()
    params = {"w": jnp.asarray([0.1, -0.2, 0.3, 0.0]), "b": jnp.asarray([0.0, 0.1, -0.1])}
    kept = _numpy_adam_then_clip(params, target, 3)[-1][0]
    p = params
    for _ in range(3):
        p = {k: jnp.asarray(v) for k, v in _numpy_adam_then_clip(p, target, 1)[0][0].items()}
    assert not np.allclose(kept["b"], p["b"], rtol=1e-3)


# --- (b) adding a layer ------------------------------------------------------------------------


def test_adding_a_layer_keeps_old_moments_and_training_continues():
    tx = gradtx.adam(LR, B1, B2, EPS)
    target = {"l0": {"w": jnp.full((3,), 2.0)}, "l1": {"w": jnp.full((2,), -1.0)}}
    params = {"l0": {"w": jnp.zeros(3)}}
    state = tx.init(params)

    def run(params, state, target, steps):
        for _ in range(steps):
            updates, state = tx.update(_quadratic_grads(params, target), state, params)
            params = gradtx.apply_updates(params, updates)
        return params, state

    params, state = run(params, state, {"l0": target["l0"]}, 3)
    old = gradtx.state_dict(state)

    grown = {**params, "l1": {"w": jnp.zeros(2)}}
    with pytest.raises(KeyError, match=r"'l1/w'.*gradtx.reconcile"):
        tx.update(_quadratic_grads(grown, target), state, grown)
    state, report = gradtx.reconcile(tx, state, grown)
    assert set(report.missing) == {"mu/l1/w", "nu/l1/w", "count/l1/w"}
    flat = gradtx.state_dict(state)
    for key, value in old.items():
        np.testing.assert_array_equal(flat[key], value)
    np.testing.assert_array_equal(flat["mu/l1/w"], np.zeros(2, np.float32))
    assert int(flat["count/l1/w"]) == 0

    grown_params, grown_state = run(grown, state, target, 4)
    # The old layer continues exactly as if nothing had been added (the loss is separable).
    alone_state = gradtx.reconcile(tx, state, params)[0]
    alone_params, alone_state = run(params, alone_state, {"l0": target["l0"]}, 4)
    np.testing.assert_array_equal(grown_params["l0"]["w"], alone_params["l0"]["w"])
    np.testing.assert_array_equal(grown_state["mu"]["l0/w"], alone_state["mu"]["l0/w"])
    assert int(grown_state["count"]["l0/w"]) == 7
    assert int(grown_state["count"]["l1/w"]) == 4
    # The new layer trains from a fresh state (bias correction restarts at its own step 1).
    fresh = _numpy_adam_then_clip({"w": np.zeros(2)}, {"w": target["l1"]["w"]}, 4, np.inf)
    np.testing.assert_allclose(grown_params["l1"]["w"], fresh[-1][0]["w"], rtol=1e-5)
    np.testing.assert_allclose(grown_state["mu"]["l1/w"], fresh[-1][1]["w"], rtol=1e-5)


# --- (c) different but path-equal containers ---------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Linear:
    w: jax.Array
    b: jax.Array


def test_dict_updates_for_dataclass_params():
    tx = gradtx.adamw(LR, B1, B2, EPS, weight_decay=0.1, mask="w")
    params = Linear(w=jnp.asarray([[1.0, -2.0]]), b=jnp.asarray([0.5]))
    as_dict = {"w": params.w, "b": params.b}
    assert gradtx.paths.paths(params) == ["w", "b"]
    state = tx.init(params)
    assert gradtx.state_dict(state).keys() == gradtx.state_dict(tx.init(as_dict)).keys()

    grads = {"w": jnp.asarray([[0.3, 0.4]]), "b": jnp.asarray([-1.0])}
    updates, new_state = tx.update(grads, state, params)
    assert isinstance(updates, dict)
    ref_updates, ref_state = tx.update(grads, tx.init(as_dict), as_dict)
    for k in ("w", "b"):
        np.testing.assert_array_equal(updates[k], ref_updates[k])
        np.testing.assert_array_equal(new_state["mu"][k], ref_state["mu"][k])
    # First Adam step is -lr * sign(g) (up to eps); decay on w only.
    np.testing.assert_allclose(updates["b"], [0.1], rtol=1e-5)
    np.testing.assert_allclose(
        updates["w"], -LR * (np.sign([[0.3, 0.4]]) + 0.1 * np.asarray([[1.0, -2.0]])), rtol=1e-5
    )

    new_params = gradtx.apply_updates(params, updates)
    assert isinstance(new_params, Linear)
    np.testing.assert_array_equal(new_params.w, params.w + updates["w"])
    np.testing.assert_array_equal(new_params.b, params.b + updates["b"])
    # And the other way round: dataclass updates for dict params.
    back = gradtx.apply_updates(as_dict, Linear(w=updates["w"], b=updates["b"]))
    assert isinstance(back, dict)
    np.testing.assert_array_equal(back["w"], new_params.w)


def test_rebuilt_container_under_jit():
    tx = gradtx.adam(LR, B1, B2, EPS)

    @jax.jit
    def step(params, grads, state):
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state

    params = Linear(w=jnp.ones((2, 2)), b=jnp.zeros(2))
    state = tx.init({"b": jnp.zeros(2), "w": jnp.ones((2, 2))})  # made from a dict
    grads = {"w": jnp.ones((2, 2)), "b": -jnp.ones(2)}
    params, state = step(params, grads, state)
    params, state = step(params, grads, state)
    assert isinstance(params, Linear)
    np.testing.assert_allclose(params.w, np.full((2, 2), 1 - 2 * LR), rtol=1e-5)
    np.testing.assert_allclose(params.b, np.full(2, 2 * LR), rtol=1e-5)


# --- (d) two models trained alternately from one optimizer -------------------------------------


def _gan_params():
    return {
        "gen": {"w": jnp.asarray([[0.5, -0.2], [0.1, 0.3]]), "b": jnp.asarray([0.0, 0.1])},
        "critic": {"w": jnp.asarray([0.7, -0.4]), "b": jnp.asarray(0.2)},
    }


def _gen_grads(params):
    # The generator's gradient depends on both models, as in a GAN.
    g, c = params["gen"], params["critic"]
    return {"w": jnp.tanh(g["w"]) * c["w"][None, :], "b": jnp.sin(g["b"]) + c["b"]}


def _critic_grads(params):
    g, c = params["gen"], params["critic"]
    return {"w": jnp.cos(c["w"]) - jnp.sum(g["w"], axis=0), "b": c["b"] * 2.0 - 0.3}


def _none_like(tree):
    return jax.tree.map(lambda _: None, tree)


def _schedule():
    return schedules.warmup_cosine_decay(0.0, 0.05, 2, 12)


def _check_alternating(jit):
    one = gradtx.adam(_schedule(), B1, B2, EPS)
    sep_gen = gradtx.adam(_schedule(), B1, B2, EPS)
    sep_critic = gradtx.adam(_schedule(), B1, B2, EPS)
    wrap = jax.jit if jit else (lambda f: f)

    @wrap
    def one_step(tx, params, state, grads):
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state

    params = _gan_params()
    state = one.init(params)
    gen = {"gen": params["gen"]}
    critic = {"critic": params["critic"]}
    gen_state, critic_state = sep_gen.init(gen), sep_critic.init(critic)

    schedule = ["gen", "gen", "critic"] * 3 + ["gen"]
    for who in schedule:
        before_params = params
        before_state = gradtx.state_dict(state)
        if who == "gen":
            g = _gen_grads(params)
            grads = {"gen": g, "critic": _none_like(params["critic"])}
            params, state = one_step(one, params, state, grads)
            gen, gen_state = one_step(sep_gen, gen, gen_state, {"gen": g})
            other = "critic"
        else:
            g = _critic_grads(params)
            grads = {"gen": _none_like(params["gen"]), "critic": g}
            params, state = one_step(one, params, state, grads)
            critic, critic_state = one_step(sep_critic, critic, critic_state, {"critic": g})
            other = "gen"
        # The other model's params and state did not move, bit for bit.
        for k in ("w", "b"):
            np.testing.assert_array_equal(params[other][k], before_params[other][k])
        after_state = gradtx.state_dict(state)
        for key, value in before_state.items():
            if f"/{other}/" in f"/{key}":
                np.testing.assert_array_equal(after_state[key], value, err_msg=key)
                assert after_state[key].dtype == value.dtype
        # The combined optimizer equals two separate ones, bit for bit.
        for k in ("w", "b"):
            np.testing.assert_array_equal(params["gen"][k], gen["gen"][k])
            np.testing.assert_array_equal(params["critic"][k], critic["critic"][k])
        separate = {**gradtx.state_dict(gen_state), **gradtx.state_dict(critic_state)}
        assert set(separate) == set(after_state)
        # Statistics read the last step of the whole optimizer (the scheduled learning rate
        # of its most advanced paths), not of one model: they are compared below.
        readings = set(gradtx.stats(state))
        for key, value in separate.items():
            if key not in readings:
                np.testing.assert_array_equal(after_state[key], value, err_msg=key)

    flat = gradtx.state_dict(state)
    for k in ("w", "b"):
        assert int(flat[f"count/gen/{k}"]) == 7
        assert int(flat[f"count/critic/{k}"]) == 3
        assert int(flat[f"schedule_count/gen/{k}"]) == 7
        assert int(flat[f"schedule_count/critic/{k}"]) == 3
    # The most advanced paths (the generator's, 7 steps) give the scheduled rate's reading.
    gen_rate = gradtx.state_dict(gen_state)["scheduled/learning_rate"]
    np.testing.assert_array_equal(flat["scheduled/learning_rate"], gen_rate)


def test_alternating_updates_equal_two_optimizers():
    _check_alternating(jit=False)


def test_alternating_updates_equal_two_optimizers_jitted():
    _check_alternating(jit=True)


def test_untouched_model_params_are_the_same_objects():
    tx = gradtx.adam(0.1)
    params = _gan_params()
    state = tx.init(params)
    grads = {"gen": _gen_grads(params), "critic": _none_like(params["critic"])}
    updates, state = tx.update(grads, state, params)
    assert updates["critic"] == {"w": None, "b": None}
    new = gradtx.apply_updates(params, updates)
    assert new["critic"]["w"] is params["critic"]["w"]
    assert new["critic"]["b"] is params["critic"]["b"]


# --- (e) nothing is mutated --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["jax", "numpy"])
def test_gradient_norm_after_update_equals_norm_before(kind):
    tx = gradtx.chain(gradtx.clip_by_global_norm(0.5), gradtx.adam(0.1))
    rng = np.random.default_rng(0)
    raw = {
        "a": rng.normal(size=(3, 4)).astype(np.float32),
        "b": rng.normal(size=5).astype(np.float32),
    }
    grads = raw if kind == "numpy" else jax.tree.map(jnp.asarray, raw)
    snapshot = {k: np.array(v, copy=True) for k, v in raw.items()}
    params = jax.tree.map(jnp.zeros_like, grads)
    state = tx.init(params)
    norm_before = float(gradtx.global_norm(grads))
    expected = np.sqrt(sum(np.sum(np.float64(v) ** 2) for v in snapshot.values()))
    np.testing.assert_allclose(norm_before, expected, rtol=1e-6)

    updates, state = tx.update(grads, state, params)
    norm_after = float(gradtx.global_norm(grads))
    assert norm_after == norm_before
    for k in raw:
        np.testing.assert_array_equal(np.asarray(grads[k]), snapshot[k])
    assert float(state["clip_by_global_norm"]["global_norm"]) == norm_before
    # The clipped updates that reached Adam had norm 0.5: Adam's first moment shows it.
    mu_norm = float(gradtx.global_norm(state["adam"]["mu"])) / (1 - float(B1))
    np.testing.assert_allclose(mu_norm, 0.5, rtol=1e-5)
