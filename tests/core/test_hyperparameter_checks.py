"""Hyperparameter values are checked wherever they are known: at construction (numbers and
concrete arrays), in `set_hyperparams`, and for their shape where the update reads them."""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx
from gradtx import schedules


def _params():
    return {"enc": {"w": jnp.ones((3, 2))}, "head": jnp.ones(2)}


def _grads():
    return {"enc": {"w": jnp.full((3, 2), 0.5)}, "head": jnp.array([1.0, -1.0])}


def _inject_adam(**kwargs):
    tx = gradtx.inject_hyperparams(gradtx.adam)(learning_rate=0.1, **kwargs)
    return tx, tx.init(_params())


# --- set_hyperparams: the constructor's checks -----------------------------------------------


@pytest.mark.parametrize(
    ("values", "match"),
    [
        (
            {"learning_rate": float("nan")},
            r"'learning_rate' = nan is refused by adam: scale_by_learning_rate: "
            r"`learning_rate` must be finite",
        ),
        (
            {"b2": 1.5},
            r"'b2' = 1.5 is refused by adam: scale_by_adam: `b2` must be in \[0, 1\) "
            r"\(a decay rate\)",
        ),
        ({"eps": -1e-8}, r"'eps' = -1e-08 is refused by adam: scale_by_adam: `eps` must be >= 0"),
        ({"b1": np.float64(np.inf)}, r"'b1' = np.float64\(inf\) .* `b1` must be finite"),
        ({"b1": jnp.array(1.0)}, r"'b1' = Array\(1\., .* `b1` must be in \[0, 1\)"),
    ],
)
def test_set_hyperparams_refuses_what_the_constructor_refuses(values, match):
    _, state = _inject_adam()
    with pytest.raises(ValueError, match=r"^set_hyperparams: " + match):
        gradtx.set_hyperparams(state, values)


def test_set_hyperparams_checks_only_the_value_it_sets():
    _, state = _inject_adam()
    # each value set is checked, at the edges of its range too (b1=0 is a valid decay rate)
    new = gradtx.set_hyperparams(state, {"b1": 0.0, "b2": 0.5, "learning_rate": -0.1})
    got = {k: float(v) for k, v in gradtx.hyperparams(new).items()}
    assert got["b1"] == 0.0 and got["b2"] == 0.5 and got["learning_rate"] == pytest.approx(-0.1)
    with pytest.raises(ValueError, match=r"'b2' = 1.0 is refused"):
        gradtx.set_hyperparams(state, {"b1": 0.5, "b2": 1.0})


def test_set_hyperparams_names_the_grouped_path():
    tx = gradtx.partition(
        {
            "enc": gradtx.inject_hyperparams(gradtx.adam)(learning_rate=0.1),
            "head": gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=0.1, momentum=0.9),
        },
        {"enc": "enc/**", "head": "head"},
    )
    state = tx.init(_params())
    with pytest.raises(ValueError, match=r"'head/momentum' = 1.0 is refused by sgd: .*momentum"):
        gradtx.set_hyperparams(state, {"head/momentum": 1.0})
    with pytest.raises(ValueError, match=r"'enc/b2' = 2.0 is refused by adam"):
        gradtx.set_hyperparams(state, {"enc/b1": 0.5, "enc/b2": 2.0})


def test_set_hyperparams_checks_the_value_as_stored():
    # 0.9999 is a fine decay rate, but bfloat16 keeps it as 1.0, which is not
    tx = gradtx.inject_hyperparams(gradtx.sgd, hyperparam_dtype=jnp.bfloat16)(
        learning_rate=0.5, momentum=0.5
    )
    state = tx.init(_params())
    with pytest.raises(ValueError, match=r"'momentum' = 0.9999 \(stored as 1.0\) is refused"):
        gradtx.set_hyperparams(state, {"momentum": 0.9999})
    new = gradtx.set_hyperparams(state, {"momentum": 0.25})
    assert float(gradtx.hyperparams(new)["momentum"]) == 0.25


def test_a_traced_value_is_not_checked_inside_jit():
    # documented: a value computed inside jit cannot be checked without a host sync
    tx, state = _inject_adam()

    @jax.jit
    def set_and_step(state, lr):
        state = gradtx.set_hyperparams(state, {"learning_rate": lr})
        return tx.update(_grads(), state, _params())[0]

    updates = set_and_step(state, jnp.float32(jnp.nan))
    assert np.isnan(np.asarray(updates["head"])).all()


def test_a_factory_that_reads_its_values_is_checked_with_them():
    # A Python `if` on a hyperparameter cannot run on a traced value: the other values are
    # then given as stored.
    def factory(learning_rate, momentum=0.5):
        if momentum > 0:
            return gradtx.sgd(learning_rate, momentum=momentum)
        return gradtx.sgd(learning_rate)

    tx = gradtx.inject_hyperparams(factory)(learning_rate=0.1, momentum=0.5)
    state = tx.init(_params())
    with pytest.raises(ValueError, match=r"'learning_rate' = inf is refused by factory"):
        gradtx.set_hyperparams(state, {"learning_rate": float("inf")})
    new = gradtx.set_hyperparams(state, {"learning_rate": 0.2})
    assert float(gradtx.hyperparams(new)["learning_rate"]) == pytest.approx(0.2)


def test_an_optax_factory_has_no_checks_to_run():
    tx = gradtx.inject_hyperparams(optax.adam)(learning_rate=0.1)
    state = tx.init(_params())
    new = gradtx.set_hyperparams(state, {"b1": 0.5})
    assert float(gradtx.hyperparams(new)["b1"]) == 0.5


def test_equal_transformations_make_states_of_one_structure():
    # the check kept in the state is static structure: equal for equal transformations
    _, a = _inject_adam()
    _, b = _inject_adam()
    assert jax.tree.structure(a) == jax.tree.structure(b)
    _, c = _inject_adam(b1=0.5)  # another value: still one structure
    assert jax.tree.structure(a) == jax.tree.structure(c)


# --- known arrays are checked at construction ------------------------------------------------


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: gradtx.sgd(jnp.array(float("nan"))), r"`learning_rate` must be finite"),
        (lambda: gradtx.sgd(np.array(np.inf)), r"`learning_rate` must be finite"),
        (lambda: gradtx.adam(0.1, b2=jnp.array(1.5)), r"`b2` must be in \[0, 1\)"),
        (
            lambda: gradtx.adam(0.1, b1=jnp.array([0.9, 1.0])),
            r"`b1` must be in \[0, 1\) \(a decay rate\), got Array\(\[0.9, 1. \].*"
            r"\(an entry is 1\)",
        ),
        (lambda: gradtx.clip_by_global_norm(jnp.array(-1.0)), r"`max_norm` must be >= 0"),
    ],
)
def test_a_known_array_is_checked_like_a_number(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_traced_values_are_not_checked():
    # under jit and vmap the value is unknown at construction: built, not checked
    step = jax.jit(lambda lr: gradtx.sgd(lr).update(_grads(), {})[0]["head"])
    assert np.isnan(np.asarray(step(jnp.float32(jnp.nan)))).all()
    stacked = jax.vmap(lambda b: gradtx.adam(0.1, b2=b))(jnp.array([0.5, 1.5]))
    assert stacked.transforms[0].b2.shape == (2,)


def test_inf_stays_allowed_where_it_means_no_bound():
    tx = gradtx.clip_by_global_norm(jnp.array(jnp.inf))
    np.testing.assert_array_equal(tx.update(_grads(), tx.init(_params()))[0]["head"], [1.0, -1.0])


# --- a hyperparameter is a scalar where the update reads it ----------------------------------


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_a_vector_learning_rate_is_refused_by_update(jit):
    tx = gradtx.sgd(jnp.array([0.1, 10.0]))  # built: a stack to vmap over is built this way
    params = _params()
    update = jax.jit(tx.update) if jit else tx.update
    with pytest.raises(
        ValueError,
        match=r"^sgd: the hyperparameter `transforms\[0\].learning_rate` \(of "
        r"scale_by_learning_rate\) has shape \(2,\), but the update needs a scalar",
    ):
        update(_grads(), tx.init(params), params)


def test_a_vector_inside_a_combinator_is_named_by_its_path():
    tx = gradtx.partition(
        {"enc": gradtx.adam(0.1, b1=jnp.array([0.9, 0.5])), "head": gradtx.sgd(0.1)},
        {"enc": "enc/**", "head": "head"},
    )
    with pytest.raises(ValueError, match=r"`transforms\['enc'\].transforms\[0\].b1` \(of "):
        tx.update(_grads(), tx.init(_params()), _params())


def test_vmap_over_a_stack_sweeps_each_value():
    lrs = jnp.array([0.1, 10.0])
    stacked = jax.vmap(lambda lr: gradtx.sgd(lr, momentum=0.5))(lrs)
    params = _params()

    def step(tx):
        return tx.update(_grads(), tx.init(params), params)[0]

    swept = jax.jit(jax.vmap(step))(stacked)
    for i, lr in enumerate([0.1, 10.0]):
        alone = step(gradtx.sgd(lr, momentum=0.5))
        np.testing.assert_allclose(swept["head"][i], alone["head"], rtol=1e-6)
    # a stack built directly from the vector sweeps the same way (the first step of
    # momentum is the plain step)
    direct = jax.vmap(step)(gradtx.sgd(lrs))
    np.testing.assert_allclose(direct["head"], swept["head"], rtol=1e-6)


def test_vector_fields_by_design_are_not_hyperparameters():
    coeffs = jnp.array([3.4445, -4.7750, 2.0315])
    tx = gradtx.contrib.muon(0.1, ns_coeffs=coeffs)
    params = {"w": jnp.eye(3)}
    u, _ = jax.jit(tx.update)({"w": jnp.eye(3)}, tx.init(params), params)
    assert u["w"].shape == (3, 3)
    scheduled = gradtx.sgd(schedules.piecewise_constant(0.1, {2: 0.5, 4: 0.5}))
    u, _ = scheduled.update(_grads(), scheduled.init(_params()), _params())
    np.testing.assert_allclose(u["head"], [-0.1, 0.1], rtol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"learning_rate": lambda step: jnp.array([0.1, 10.0])},
            r"the schedule given as `learning_rate` must return a real number per step "
            r"\(shape \(\)\), got shape \(2,\)",
        ),
        (
            {"learning_rate": 0.1, "b1": lambda step: jnp.full((2,), 0.9)},
            r"the schedule given as `b1` must return .* got shape \(2,\)",
        ),
    ],
)
def test_an_injected_schedule_returning_a_vector_is_refused(kwargs, match):
    tx = gradtx.inject_hyperparams(gradtx.adam)(**kwargs)
    with pytest.raises(TypeError, match=r"^inject_hyperparams\(adam\): " + match):
        tx.init(_params())


def test_an_injected_schedule_returning_a_vector_is_refused_at_trace_time():
    # the check reads shapes only, so it runs while `update` is traced
    tx = gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=lambda step: jnp.full((2,), 0.1))
    state = gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=0.1).init(_params())
    with pytest.raises(TypeError, match=r"`learning_rate` must return .* got shape \(2,\)"):
        jax.jit(tx.update)(_grads(), state, _params())


def test_vmap_over_stacked_injected_transformations_sweeps():
    lrs = jnp.array([0.1, 10.0])
    stacked = jax.vmap(lambda lr: gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=lr))(lrs)
    params = _params()

    def step(tx):
        return tx.update(_grads(), tx.init(params), params)[0]["head"]

    np.testing.assert_allclose(jax.vmap(step)(stacked), [[-0.1, 0.1], [-10.0, 10.0]], rtol=1e-6)
    with pytest.raises(ValueError, match=r"'learning_rate' has shape \(2,\); it must be"):
        stacked.init(params)  # outside vmap: the stack is no one transformation


# --- what the optax guide shows ----------------------------------------------------------------


def test_static_args_naming_no_argument_raises_when_called():
    wrapped = gradtx.inject_hyperparams(gradtx.sgd, static_args=("nesterov", "nope"))
    with pytest.raises(TypeError, match=r"inject_hyperparams\(sgd\): static_args \['nope'\]"):
        wrapped(learning_rate=0.1)


def test_an_argument_passed_through_keywords_can_be_static():
    # why the check waits for the call: a name taken by **kwargs is known only then
    def factory(learning_rate, **kwargs):
        return gradtx.sgd(learning_rate, momentum=kwargs.get("momentum", 0.0))

    tx = gradtx.inject_hyperparams(factory, static_args="momentum")(0.1, momentum=0.9)
    assert sorted(tx.hparams) == ["learning_rate"]


def test_scale_by_lion_mode_is_checked_when_built():
    with pytest.raises(ValueError, match=r"scale_by_lion: `mode` must be one of"):
        gradtx.scale_by_lion(mode="soft")


def test_a_stateful_schedule_must_keep_its_state_dtypes():
    class Halving(gradtx.schedules.StatefulSchedule):
        def init(self):
            return jnp.zeros((), jnp.int32)

        def update(self, state, **extra):
            return state + 1.0  # int32 + float: float32, which the state was not

        def value(self, state, **extra):
            return 0.1 / 2.0 ** state.astype(jnp.float32)

    tx = gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=Halving())
    with (
        jax.numpy_dtype_promotion("standard"),
        pytest.raises(
            TypeError, match=r"`learning_rate` \(Halving\) returned .* int32\[\] became float32\[\]"
        ),
    ):
        tx.update(_grads(), tx.init(_params()), _params())


def test_an_optax_stateful_schedule_is_named_by_its_own_class():
    class Drift(optax.schedules.StatefulSchedule):
        def init(self):
            return jnp.zeros((), jnp.int32)

        def update(self, state, **extra):
            return state.astype(jnp.float32)

        def __call__(self, state, **extra):
            return jnp.float32(0.1)

    tx = gradtx.inject_hyperparams(gradtx.sgd)(learning_rate=Drift())
    with pytest.raises(TypeError, match=r"`learning_rate` \(Drift\) returned from `update`"):
        tx.update(_grads(), tx.init(_params()), _params())


def test_a_state_pickles_with_its_check_and_without_a_local_factory():
    _, state = _inject_adam()
    copied = pickle.loads(pickle.dumps(jax.device_get(state)))
    assert jax.tree.structure(copied) == jax.tree.structure(state)
    with pytest.raises(ValueError, match=r"'b2' = 1.5 is refused by adam"):
        gradtx.set_hyperparams(copied, {"b2": 1.5})

    def factory(learning_rate):  # local: pickle cannot name it
        return gradtx.sgd(learning_rate)

    state = gradtx.inject_hyperparams(factory)(learning_rate=0.1).init(_params())
    copied = pickle.loads(pickle.dumps(jax.device_get(state)))  # pickles as before
    new = gradtx.set_hyperparams(copied, {"learning_rate": 0.2})  # unchecked: no factory
    assert float(gradtx.hyperparams(new)["learning_rate"]) == pytest.approx(0.2)
