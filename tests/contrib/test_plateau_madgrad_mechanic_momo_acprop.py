"""reduce_on_plateau, MADGRAD, Mechanic, MoMo, MoMo-Adam and ACProp beyond the contract suite:
published defaults step by step against the references and optax, the windows and cooldown of
reduce_on_plateau, where gradtx follows the paper rather than optax, and errors.

Like tests/contrib/test_contrib.py, the defaults are checked *teacher-forced*: at each step the
reference and optax get the params gradtx produced, so only the arithmetic is compared.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest
import references as ref
import references.contrib_adam_family as rca
import references.contrib_lr_free as rlf
import test_contract as tc
from registry import CONTRIB
from registry.contrib_adam_family import optax_acprop
from registry.quadratic import OptaxWithLoss, WithLoss, reference_loss
from teacher_forcing import teacher_forced

import gradtx
from gradtx import contrib

NAMES = (
    "acprop",
    "madgrad",
    "mechanize",
    "momo",
    "momo_adam",
    "reduce_on_plateau",
    "scale_by_acprop",
    "scale_by_madgrad",
)


def _f(x: float) -> np.float32:
    return np.float32(x)


def test_each_name_is_exported_with_one_registry_entry():
    assert set(NAMES) <= set(contrib.__all__)
    names = [e.name for e in CONTRIB if e.name.removeprefix("contrib.") in NAMES]
    assert sorted(names) == sorted(f"contrib.{n}" for n in NAMES)


# --- published defaults, teacher-forced ---------------------------------------------------------


_ADAM = {"b1": _f(0.9), "b2": _f(0.999), "eps": _f(1e-8)}

# name: (gradtx, reference, optax, reference rtol, optax rtol, optax ulps)
DEFAULTS = {
    "madgrad": (
        lambda: contrib.madgrad(0.01),
        lambda: rca.madgrad(0.01),
        lambda: optax.contrib.madgrad(_f(0.01), _f(0.9), _f(0.0), _f(1e-6)),
        # optax's update is x_new - x in float32: an ulp of x, absolute.
        (1e-5, 1e-5, 1.0),
    ),
    "mechanize": (
        lambda: contrib.mechanize(gradtx.adam(1e-2)),
        lambda: rlf.mechanize(ref.adam(1e-2)),
        lambda: optax.contrib.mechanize(
            optax.adam(_f(1e-2), **_ADAM), _f(1e-2), _f(1e-8), _f(1e-6)
        ),
        # see madgrad; Mechanic scales Adam's steps, and an element whose first moment
        # nearly cancels rounds relative to the leaf's largest step: a few ulps of it.
        (1e-5, 1e-5, 1.0, 4e-6),
    ),
    "momo": (
        lambda: WithLoss(contrib.momo()),
        lambda: rlf.momo(reference_loss),
        lambda: OptaxWithLoss(optax.contrib.momo()),
        # The step divides the model's gap, a difference of the averaged loss and inner
        # products (terms of ~20 that nearly cancel), by |d|^2; optax sums in another order.
        (1e-5, 1e-4, 0.0),
    ),
    "momo-adapt_lower_bound": (
        lambda: WithLoss(contrib.momo(adapt_lower_bound=True)),
        lambda: rlf.momo(reference_loss, adapt_lower_bound=True),
        lambda: OptaxWithLoss(optax.contrib.momo(adapt_lower_bound=True)),
        (1e-5, 1e-4, 0.0),  # see momo
    ),
    "momo_adam": (
        lambda: WithLoss(contrib.momo_adam()),
        lambda: rlf.momo_adam(reference_loss),
        lambda: OptaxWithLoss(optax.contrib.momo_adam()),
        # optax computes 1 - b**t in float32 directly (gradtx: expm1); see momo.
        (1e-5, 1e-4, 0.0),
    ),
    "momo_adam-adapt_lower_bound": (
        lambda: WithLoss(contrib.momo_adam(adapt_lower_bound=True)),
        lambda: rlf.momo_adam(reference_loss, adapt_lower_bound=True),
        lambda: OptaxWithLoss(optax.contrib.momo_adam(adapt_lower_bound=True)),
        # The estimated bound climbs to within 1e-3 of the averaged loss, so the model's gap
        # (see momo) is a difference of nearly equal float32 numbers: 6e-4 by step 20.
        (1e-3, 1e-3, 0.0),
    ),
    "acprop": (
        lambda: contrib.acprop(1e-3),
        lambda: rca.acprop(1e-3),
        lambda: optax.chain(optax_acprop(), optax.scale_by_learning_rate(_f(1e-3))),
        (1e-5, 1e-5, 0.0),
    ),
}


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_published_defaults_step_by_step(name):
    make, reference, oracle, tolerances = DEFAULTS[name]
    teacher_forced(make(), reference(), oracle(), *tolerances)


# --- where gradtx follows the paper rather than optax 0.2.8 -------------------------------------


def test_momo_weight_decay_is_the_proximal_step():
    """One step on sum(x^2) from (1, 2, 3), learning rate 1, weight decay 0.1: the paper and
    its authors' code give (x - tau d) / (1 + lr wd) = (0.5, 1, 1.5); optax 0.2.8 divides
    only x and gives (0.459, 0.918, 1.377)."""
    params = {"w": jnp.array([1.0, 2.0, 3.0])}
    loss, grads = jax.value_and_grad(lambda p: jnp.sum(p["w"] ** 2))(params)
    tx = contrib.momo(1.0, weight_decay=0.1)
    updates, _ = tx.update(grads, tx.init(params), params, value=loss)
    np.testing.assert_allclose(gradtx.apply_updates(params, updates)["w"], [0.5, 1.0, 1.5])
    with jax.numpy_dtype_promotion("standard"):
        oracle = optax.contrib.momo(_f(1.0), weight_decay=_f(0.1))
        o_updates, _ = oracle.update(grads, oracle.init(params), params, value=loss)
    np.testing.assert_allclose(params["w"] + o_updates["w"], [0.459, 0.918, 1.377], atol=1e-3)


def test_momo_adam_weight_decay_is_the_proximal_step():
    """MoMo-Adam with weight decay follows the paper's reference, not optax 0.2.8."""
    square = lambda p: jnp.sum(p["w"] ** 2)  # noqa: E731
    params = {"w": jnp.array([1.0, 2.0, 3.0])}
    tx = contrib.momo_adam(1.0, weight_decay=0.1)
    reference = rlf.momo_adam(lambda p: float(np.sum(p["w"] ** 2)), 1.0, weight_decay=0.1)
    state, ref_state = tx.init(params), reference.init({"w": np.array([1.0, 2.0, 3.0])})
    for _ in range(3):
        loss, grads = jax.value_and_grad(square)(params)
        updates, state = tx.update(grads, state, params, value=loss)
        flat = {"w": np.asarray(params["w"], np.float64)}
        want, ref_state = reference.update({"w": np.asarray(grads["w"])}, ref_state, flat)
        np.testing.assert_allclose(updates["w"], want["w"], rtol=1e-5)
        params = gradtx.apply_updates(params, updates)


def test_acprop_centres_with_the_new_first_moment():
    """s_1 = (1 - b2) (g - m_1)^2 with m_1 = (1 - b1) g: the second step divides by
    |g_1 - m_1| = b1 |g_1| (optax 0.2.8 uses m_0 = 0 and divides by |g_1|)."""
    tx = contrib.scale_by_acprop(b1=0.5, eps=0.0, eps_root=0.0)
    state = tx.init({"w": jnp.zeros(1)})
    _, state = tx.update({"w": jnp.array([4.0])}, state)
    np.testing.assert_allclose(state["nu"]["w"], [(1 - np.float32(0.999)) * 4.0], rtol=1e-5)
    updates, _ = tx.update({"w": jnp.array([1.0])}, state)
    np.testing.assert_allclose(updates["w"], [1.0 / 2.0], rtol=1e-5)


# --- reduce_on_plateau --------------------------------------------------------------------------

LOSSES = [5.0, 4.0, 4.0, 4.5, 3.0, 3.5, 3.5, 3.5, 3.6, 3.5, 3.4, 3.5, 3.5, 3.5, 3.5, 3.5]


def test_reduce_on_plateau_windows_and_cooldown_match_optax():
    kwargs = {"patience": 2, "cooldown": 1, "accumulation_size": 2, "min_scale": 0.3}
    tx = contrib.reduce_on_plateau(0.5, rtol=0.01, atol=0.05, **kwargs)
    oracle = optax.contrib.reduce_on_plateau(_f(0.5), rtol=_f(0.01), atol=_f(0.05), **kwargs)
    params = {"w": jnp.ones(2)}
    grads = {"w": jnp.array([1.0, -2.0])}
    state, o_state = tx.init(params), oracle.init(params)
    scales = []
    for loss in LOSSES:
        updates, state = tx.update(grads, state, value=loss)
        with jax.numpy_dtype_promotion("standard"):
            o_updates, o_state = oracle.update(grads, o_state, value=loss)
        for field in ("scale", "best_value", "plateau_count", "cooldown_count", "count"):
            np.testing.assert_array_equal(state[field], getattr(o_state, field), field)
        np.testing.assert_allclose(state["avg_value"], o_state.avg_value, rtol=1e-7)
        np.testing.assert_allclose(updates["w"], o_updates["w"], rtol=1e-7)
        scales.append(float(state["scale"]))
    # a reduction, a cooldown window, then a reduction that hits the floor
    assert sorted(set(scales), reverse=True) == [1.0, 0.5, pytest.approx(0.3)]


def test_reduce_on_plateau_matches_its_reference():
    tx = contrib.reduce_on_plateau(0.5, patience=2, cooldown=1, accumulation_size=2)
    losses = iter(LOSSES)
    reference = rlf.reduce_on_plateau(
        lambda _: next(losses), 0.5, patience=2, cooldown=1, accumulation_size=2
    )
    grads = {"w": jnp.array([1.0, -2.0])}
    state, ref_state = tx.init(grads), reference.init({"w": np.ones(2)})
    for loss in LOSSES:
        updates, state = tx.update(grads, state, value=loss)
        want, ref_state = reference.update({"w": np.array([1.0, -2.0])}, ref_state, {})
        np.testing.assert_allclose(updates["w"], want["w"], rtol=1e-7)


def test_reduce_on_plateau_in_a_chain_lowers_the_learning_rate():
    tx = gradtx.chain(gradtx.sgd(0.1), contrib.reduce_on_plateau(0.5, patience=1))
    params = {"w": jnp.ones(2)}
    state = tx.init(params)
    for _ in range(3):  # a constant loss: no improvement after the first call
        updates, state = tx.update({"w": jnp.ones(2)}, state, params, value=1.0)
    np.testing.assert_allclose(updates["w"], [-0.025, -0.025], rtol=1e-6)
    assert float(gradtx.state_dict(state)["reduce_on_plateau/scale"]) == 0.25


# --- Mechanic -----------------------------------------------------------------------------------


def test_mechanize_state_and_an_optax_base():
    tx = contrib.mechanize(gradtx.adam(0.01))
    state = tx.init({"w": jnp.ones(2)})
    keys = sorted(gradtx.state_dict(state))
    assert keys == [
        "base_optimizer/count/w",
        "base_optimizer/mu/w",
        "base_optimizer/nu/w",
        "count",
        "m",
        "r",
        "s",
        "v",
        "x0/w",
    ]
    assert state["s"].shape == (6,)
    wrapped = contrib.mechanize(optax.adam(_f(0.01), **_ADAM))
    params, _, history = tc.run_eager(tx, tc.PARAMS, tc.GRADS[:5])
    with jax.numpy_dtype_promotion("standard"):
        o_params, _, o_history = tc.run_eager(wrapped, tc.PARAMS, tc.GRADS[:5])
    for a, b in zip(history, o_history):
        tc.assert_trees_close(a, b, rtol=1e-5)


def test_mechanize_starts_from_the_params_of_the_first_update():
    """`init` may get abstract params (to restore a checkpoint into): x0 is taken from the
    params at the first update."""
    tx = contrib.mechanize(gradtx.sgd(0.1))
    structs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tc.PARAMS)
    _, from_structs, history = tc.run_eager(tx, tc.PARAMS, tc.GRADS[:3], tx.init(structs))
    _, from_params, want = tc.run_eager(tx, tc.PARAMS, tc.GRADS[:3])
    tc.assert_trees_equal(history, want)
    tc.assert_trees_equal(from_structs, from_params)
    np.testing.assert_array_equal(from_params["x0"]["enc/w"], tc.PARAMS["enc"]["w"])


# --- partial updates and global scalars ---------------------------------------------------------


@pytest.mark.parametrize("name", ["momo", "momo_adam", "mechanize"])
def test_partial_updates_keep_slots_and_advance_the_global_count(name):
    make = {
        "momo": lambda: contrib.momo(),
        "momo_adam": lambda: contrib.momo_adam(),
        "mechanize": lambda: contrib.mechanize(gradtx.adam(0.1)),
    }[name]
    tx = make()
    step = jax.jit(lambda s, p, g: tx.update(g, s, p, value=3.0))
    state = tx.init(tc.PARAMS)
    _, state = step(state, tc.PARAMS, tc.GRADS[0])
    grads = {**tc.GRADS[1], "enc": {"w": None, "b": tc.GRADS[1]["enc"]["b"]}}
    updates, new = step(state, tc.PARAMS, grads)
    assert updates["enc"]["w"] is None
    before, after = gradtx.state_dict(state), gradtx.state_dict(new)
    assert int(after["count"]) == 2
    touched = [k for k in before if k.endswith("/enc/w")]
    assert touched
    for key in touched:
        np.testing.assert_array_equal(after[key], before[key], key)


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make", [contrib.reduce_on_plateau, contrib.momo, contrib.momo_adam], ids=lambda f: f.__name__
)
def test_methods_that_read_the_loss_say_so(make):
    tx = make()
    params = {"w": jnp.ones(2)}
    with pytest.raises(TypeError, match=r"needs the loss: pass it as the `value` argument"):
        tx.update({"w": jnp.ones(2)}, tx.init(params), params)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: contrib.reduce_on_plateau(factor=1.5), r"reduce_on_plateau: `factor` must be in"),
        (lambda: contrib.reduce_on_plateau(rtol=0.0), r"`rtol` and `atol` are both 0"),
        (lambda: contrib.reduce_on_plateau(rtol=2.0), r"`rtol` must be in \[0, 1\]"),
        (lambda: contrib.reduce_on_plateau(patience=-1), r"`patience` must be >= 0"),
        (lambda: contrib.reduce_on_plateau(accumulation_size=0), r"`accumulation_size`"),
        (lambda: contrib.momo(beta=1.0), r"momo: `beta` must be in \[0, 1\)"),
        (lambda: contrib.momo_adam(eps=-1.0), r"momo_adam: `eps` must be >= 0"),
        (lambda: contrib.acprop(1e-3, b2=1.0), r"scale_by_acprop: `b2` must be in \[0, 1\)"),
        (lambda: contrib.madgrad(0.1, momentum=1.0), r"`momentum` must be in \[0, 1\)"),
        (lambda: contrib.mechanize(gradtx.sgd(0.1), num_betas=0), r"`num_betas` must be"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_missing_learning_rate_or_base_optimizer_raises():
    with pytest.raises(TypeError, match=r"scale_by_madgrad: `learning_rate` must be a number"):
        contrib.scale_by_madgrad(None)
    with pytest.raises(TypeError, match=r"base_optimizer` must be a transformation"):
        contrib.mechanize("adam")
    with pytest.raises(ValueError, match="needs the params"):
        tx = contrib.madgrad(0.1)
        tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))
