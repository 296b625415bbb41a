"""gradtx.contrib beyond the contract suite: coverage of the registry, the published defaults
step by step against the references and optax, Rosenbrock, SAM's modes, Muon's split, errors.

The contract suite (tests/contract) runs every entry of the contrib families. Some of those
entries use a larger initial step size than the published default, because with the default
(d0 = 1e-6 for Prodigy, r_eps = 1e-6 (1 + |x0|) for DoG, alpha = 100 for COCOB) the first
steps move the params by less than float32 resolves, and no float32 run can follow a float64
trajectory. Here the defaults are checked *teacher-forced*: at each step the reference (and
optax) get the very params gradtx produced, so only the arithmetic is compared, at 1e-5.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest
import references as ref
import references.contrib_lr_free as rlf
import references.contrib_orthogonal as ror
import test_contract as tc
from optax.contrib import _dog as optax_dog
from registry import CONTRIB
from teacher_forcing import teacher_forced

import gradtx
from gradtx import contrib

# Public names of gradtx.contrib that are not transformations (a function, a type).
NOT_TRANSFORMATIONS = {"orthogonalize_via_newton_schulz", "GaLoreDimensionNumbers"}


def _f(x: float) -> np.float32:
    return np.float32(x)


# --- the registry covers gradtx.contrib -----------------------------------------------------------


def test_every_contrib_name_has_a_registry_entry():
    covered = {e.name for e in CONTRIB}
    public = {f"contrib.{n}" for n in contrib.__all__ if n not in NOT_TRANSFORMATIONS}
    assert public - covered == set(), sorted(public - covered)
    assert covered <= public, sorted(covered - public)
    assert NOT_TRANSFORMATIONS <= set(contrib.__all__)


def test_contrib_is_exported():
    assert "contrib" in gradtx.__all__ and gradtx.contrib is contrib


# --- published defaults, teacher-forced -----------------------------------------------------------


DEFAULTS = {
    "prodigy": (
        lambda: contrib.prodigy(),
        lambda: rlf.prodigy(),
        lambda: optax.contrib.prodigy(betas=(_f(0.9), _f(0.999)), eps=_f(1e-8)),
    ),
    "dog": (
        lambda: contrib.dog(),
        lambda: rlf.dog(),
        lambda: optax.contrib.dog(_f(1.0), ("heuristic", _f(1e-6)), _f(1e-8)),
    ),
    "dowg": (
        lambda: contrib.dowg(),
        lambda: rlf.dowg(),
        lambda: optax.contrib.dowg(_f(1.0), None, _f(1e-4)),
    ),
    "cocob": (
        lambda: contrib.cocob(),
        lambda: rlf.cocob(),
        lambda: optax.contrib.cocob(_f(1.0), _f(100.0), _f(1e-8)),
    ),
    "scale_by_dog-learning_rate": (
        lambda: contrib.scale_by_dog(("learning_rate", 0.5)),
        lambda: rlf.scale_by_dog(("learning_rate", 0.5)),
        lambda: optax_dog.scale_by_dog(("learning_rate", _f(0.5)), _f(1e-8)),
    ),
}


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_published_defaults_step_by_step(name):
    make, reference, oracle = DEFAULTS[name]
    # Against optax: Prodigy's estimate d = max(d, r / |s|_1) sums terms of both signs, which
    # optax adds in another order (and with 1 - b**t computed directly): 1e-5 apart. COCOB's
    # optax step is -x + (x0 + bet), rounded at the scale of x (an ulp of x, absolute);
    # gradtx's (x0 - x) + bet follows the reference at 1e-5.
    oracle_rtol = 2e-5 if name == "prodigy" else 1e-5
    ulps = 2.0 if name == "cocob" else 0.0
    teacher_forced(make(), reference(), oracle(), 1e-5, oracle_rtol, ulps)


def test_dadapt_bias_correction_is_more_accurate_than_optax():
    """gradtx's first D-Adapt steps follow the float64 reference to 1e-6, where optax's
    `1 - b2**t` in float32 is off by ~3e-5 (why the contract's oracle tolerance is 1e-4)."""
    tx, reference = contrib.dadapt_adamw(), rlf.dadapt_adamw()
    params, grads = tc.PARAMS, tc.GRADS[:3]
    _, _, history = tc.run_eager(tx, params, grads)
    ref_params = {p: np.asarray(x, np.float64) for p, x in tc.flat(params).items()}
    state = reference.init(ref_params)
    for k, g in enumerate(grads):
        want, state = reference.update(
            {p: np.asarray(x, np.float64) for p, x in tc.flat(g).items()}, state, ref_params
        )
        ref_params = {p: x + want[p] for p, x in ref_params.items()}
        for path, u in tc.flat(history[k]).items():
            atol = 1e-6 * float(np.max(np.abs(want[path])))
            np.testing.assert_allclose(np.asarray(u, np.float64), want[path], rtol=1e-6, atol=atol)


# --- convergence on Rosenbrock ------------------------------------------------------------------


def _rosenbrock(params: Any) -> jax.Array:
    x, y = params["xy"].reshape(-1)[0], params["xy"].reshape(-1)[1]
    return (1 - x) ** 2 + 100.0 * (y - x * x) ** 2


S = gradtx.schedules
# name: (optimizer, shape of the (x, y) leaf, steps). From (-1.2, 1), f = 24.2; every one
# must be below 0.05 within its last 100 steps: DoWG's growing step overshoots the valley
# now and then, for tens of steps. A (1, 2) leaf is a matrix, so Muon orthogonalises it.
ROSENBROCK = {
    "adopt": (lambda: contrib.adopt(0.01, b2=0.99), (2,), 3000),
    "ademamix": (lambda: contrib.ademamix(0.01, b3=0.999), (2,), 1000),
    "cocob": (lambda: contrib.cocob(), (2,), 3000),
    "dadapt_adamw": (lambda: contrib.dadapt_adamw(S.cosine_decay(1.0, 3000)), (2,), 3000),
    "prodigy": (lambda: contrib.prodigy(), (2,), 1000),
    "dog": (lambda: contrib.dog(), (2,), 5000),
    "dowg": (lambda: contrib.dowg(), (2,), 4000),
    "muon-matrix": (lambda: contrib.muon(S.cosine_decay(0.02, 3000)), (1, 2), 3000),
    "muon-adam": (lambda: contrib.muon(0.01), (2,), 3000),
    "sam-adam": (
        lambda: contrib.sam(
            gradtx.adam(0.01),
            gradtx.chain(gradtx.normalize_by_update_norm(), gradtx.sgd(1e-4)),
        ),
        (2,),
        4000,
    ),
}


@pytest.mark.parametrize("name", sorted(ROSENBROCK))
def test_converges_on_rosenbrock(name):
    make, shape, steps = ROSENBROCK[name]
    tx = make()
    start = {"xy": jnp.array([-1.2, 1.0]).reshape(shape)}

    @jax.jit
    def run(params):
        def body(carry, _):
            params, state = carry
            updates, state = tx.update(jax.grad(_rosenbrock)(params), state, params)
            params = gradtx.apply_updates(params, updates)
            return (params, state), _rosenbrock(params)

        return jax.lax.scan(body, (params, tx.init(params)), None, length=steps)[1]

    assert float(_rosenbrock(start)) > 24
    assert float(np.min(run(start)[-100:])) < 0.05


# --- global scalars and partial updates ---------------------------------------------------------


def test_global_scalars_are_named_entries_and_partial_updates_keep_slots():
    tx = contrib.prodigy()
    state = tx.init(tc.PARAMS)
    keys = set(gradtx.state_dict(state))
    assert {"estim_lr", "numerator_weighted", "count"} <= keys
    assert "exp_avg/enc/w" in keys and "params0/layers/1/s" in keys
    _, state, _ = tc.run_eager(tx, tc.PARAMS, tc.GRADS[:2])
    grads = {**tc.GRADS[2], "enc": {"w": None, "b": tc.GRADS[2]["enc"]["b"]}}
    _, new, (updates,) = tc.run_eager(tx, tc.PARAMS, [grads], state)
    assert updates["enc"]["w"] is None
    before, after = gradtx.state_dict(state), gradtx.state_dict(new)
    assert int(after["count"]) == 3  # global: advances at every update
    for slot in ("exp_avg", "exp_avg_sq", "grad_sum", "params0"):
        np.testing.assert_array_equal(after[f"{slot}/enc/w"], before[f"{slot}/enc/w"])
    assert not np.array_equal(after["exp_avg/enc/b"], before["exp_avg/enc/b"])


def test_init_with_shape_dtype_structs_restores_a_checkpoint():
    """`params0` is a copy of the params made by init; abstract params give a template that
    a checkpoint fills in."""
    tx = contrib.prodigy()
    _, state, _ = tc.run_eager(tx, tc.PARAMS, tc.GRADS[:2])
    structs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tc.PARAMS)
    restored, report = gradtx.load_state_dict(tx, structs, gradtx.state_dict(state))
    assert report.clean
    tc.assert_trees_equal(restored, state)


# --- SAM ----------------------------------------------------------------------------------------


def _adversary(rho: float) -> Any:
    return gradtx.chain(gradtx.normalize_by_update_norm(), gradtx.sgd(rho))


def _optax_adversary(rho: float) -> Any:
    return optax.chain(optax.normalize_by_update_norm(_f(1.0), _f(1e-6)), optax.sgd(_f(rho)))


def test_sam_around_adam_matches_optax():
    tx = contrib.sam(gradtx.adam(0.05), _adversary(0.03), sync_period=3)
    oracle = optax.contrib.sam(
        optax.adam(_f(0.05), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8)),
        _optax_adversary(0.03),
        sync_period=3,
    )
    params, _, history = tc.run_eager(tx, tc.PARAMS, tc.GRADS[:9])
    with jax.numpy_dtype_promotion("standard"):
        o_params, o_state = tc.PARAMS, oracle.init(tc.PARAMS)
        for k, grads in enumerate(tc.GRADS[:9]):
            o_updates, o_state = oracle.update(grads, o_state, o_params)
            o_params = jax.tree.map(lambda p, u: p + u, o_params, o_updates)
            tc.assert_trees_close(history[k], o_updates, rtol=1e-6)
    tc.assert_trees_close(params, o_params, rtol=1e-6)


def test_sam_cycle_returns_to_the_outer_params():
    """After each cycle the params are the outer params plus the outer step, whatever the
    adversarial steps did."""
    tx = contrib.sam(gradtx.sgd(0.1), _adversary(0.5), sync_period=3)
    params, _, history = tc.run_eager(tx, tc.PARAMS, tc.GRADS[:3])
    want = jax.tree.map(lambda p, g: p - np.float32(0.1) * g, tc.PARAMS, tc.GRADS[2])
    tc.assert_trees_close(params, want, rtol=1e-6)
    assert not np.allclose(history[0]["enc"]["w"], 0)


def _quadratic_grad_fn(params: Any, i: int) -> Any:
    return jax.grad(tc.quadratic)(params)


def test_sam_opaque_mode_matches_optax():
    tx = contrib.sam(gradtx.sgd(0.1), _adversary(0.05), sync_period=3, opaque_mode=True)
    oracle = optax.contrib.sam(
        optax.sgd(_f(0.1)), _optax_adversary(0.05), sync_period=3, opaque_mode=True
    )
    params, state = tc.PARAMS, tx.init(tc.PARAMS)
    assert "cache" not in state
    with jax.numpy_dtype_promotion("standard"):
        o_params, o_state = tc.PARAMS, oracle.init(tc.PARAMS)
    for _ in range(3):
        grads = _quadratic_grad_fn(params, 0)
        updates, state = tx.update(grads, state, params, grad_fn=_quadratic_grad_fn)
        with jax.numpy_dtype_promotion("standard"):
            o_updates, o_state = oracle.update(grads, o_state, o_params, grad_fn=_quadratic_grad_fn)
        tc.assert_trees_close(updates, o_updates, rtol=1e-6)
        params = gradtx.apply_updates(params, updates)
        o_params = optax.apply_updates(o_params, o_updates)
    with pytest.raises(ValueError, match="grad_fn"):
        tx.update(tc.GRADS[0], state, params)


# --- Muon ---------------------------------------------------------------------------------------


def test_newton_schulz_orthogonalises():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 6)), jnp.float32)
    o = contrib.orthogonalize_via_newton_schulz(x)
    singular = np.linalg.svd(np.asarray(o, np.float64), compute_uv=False)
    assert np.all((singular > 0.6) & (singular < 1.3)), singular
    # the same singular vectors as x: U^T o V is diagonal (new singular values, any order)
    u, _, vt = np.linalg.svd(np.asarray(x, np.float64), full_matrices=False)
    core = u.T @ np.asarray(o, np.float64) @ vt.T
    np.testing.assert_allclose(core - np.diag(np.diag(core)), 0, atol=1e-5)
    np.testing.assert_allclose(np.sort(np.diag(core)), np.sort(singular), rtol=1e-5)
    tc.assert_trees_close(contrib.orthogonalize_via_newton_schulz(x.T), o.T, rtol=1e-6)
    with pytest.raises(ValueError, match="matrix"):
        contrib.orthogonalize_via_newton_schulz(jnp.ones(3))


def test_muon_mask_routes_matrices_to_muon_and_the_rest_to_adam():
    tx = contrib.muon(0.02, muon_mask="enc/**")
    keys = set(gradtx.state_dict(tx.init(tc.PARAMS)))
    assert "nu/enc/w" not in keys and "mu/enc/w" in keys  # Muon
    assert {"nu/layers/0/w", "nu/enc/b", "nu/layers/1/s"} <= keys  # Adam, 2-D or not
    # the Adam paths take exactly AdamW's steps
    adam = gradtx.adamw(0.02, eps=1e-8, weight_decay=0.0, nesterov=True)
    _, _, history = tc.run_eager(tx, tc.PARAMS, tc.GRADS[:3])
    _, _, adam_history = tc.run_eager(adam, tc.PARAMS, tc.GRADS[:3])
    for mine, theirs in zip(history, adam_history):
        tc.assert_trees_close(mine["layers"], theirs["layers"], rtol=1e-6)
        tc.assert_trees_close(mine["enc"]["b"], theirs["enc"]["b"], rtol=1e-6)


def test_muon_refuses_packed_params():
    for tx in (contrib.muon(0.02), contrib.scale_by_muon()):
        with pytest.raises(TypeError, match="packed params"):
            tx.init(gradtx.pack(tc.PARAMS))


# --- errors -------------------------------------------------------------------------------------


def test_argument_errors():
    with pytest.raises(ValueError, match="init_step"):
        contrib.dog(init_step=("guess", 1e-6))
    with pytest.raises(ValueError, match="sync_period"):
        contrib.sam(gradtx.sgd(0.1), gradtx.sgd(0.1), sync_period=0)
    with pytest.raises(ValueError, match="preset"):
        contrib.muon(0.02, ns_coeffs="fast")
    with pytest.raises(ValueError, match="ns_coeffs"):
        contrib.scale_by_muon(ns_coeffs=(1.0, 2.0))
    with pytest.raises(TypeError, match="clip_value_fn"):
        contrib.scale_by_adopt(clip_value_fn=0.5)
    with pytest.raises(TypeError, match="transformation"):
        contrib.sam(gradtx.sgd(0.1), "sgd")
    with pytest.raises(gradtx.paths.SelectorError, match="matches no path"):
        contrib.muon(0.02, muon_mask="decoder/**").init(tc.PARAMS)


@pytest.mark.parametrize(
    "tx",
    [
        contrib.prodigy(),
        contrib.dadapt_adamw(),
        contrib.scale_by_dog(),
        contrib.sam(gradtx.sgd(0.1), gradtx.sgd(0.1)),
    ],
    ids=["prodigy", "dadapt_adamw", "scale_by_dog", "sam"],
)
def test_params_are_required(tx):
    with pytest.raises(ValueError, match="needs the params"):
        tx.update(tc.GRADS[0], tx.init(tc.PARAMS))


def test_references_are_independent_of_gradtx():
    """The references run on plain NumPy (a smoke check of the Muon reference's shape rule)."""
    o = ror.newton_schulz(np.eye(2, 3))
    assert o.shape == (2, 3)
    assert isinstance(ref.f32(0.1), float)
