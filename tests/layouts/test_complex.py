"""Complex parameters are pairs of reals: a complex leaf behaves as its stacked real view.

The convention (gradtx/_layouts/complex.py): a complex leaf `z` behaves exactly like the real leaf
`stack([z.real, z.imag])`; the update comes back as `u[0] + 1j * u[1]` and the leaf's state is
kept in the real layout. The gradient passed for `z` is `dL/dre + 1j * dL/dim`, the conjugate
of what `jax.grad` returns.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from registry import REGISTRY
from registry.per_example import FromOneGradient
from registry.quadratic import WithLoss, WithObjective, contract_loss, contract_loss_of_real_view
from test_contract import PARAM_SHAPES as SHAPES
from test_contract import make_tree as _tree

import gradtx

N_STEPS = 3
COMPLEX = "enc/w"  # the complex leaf; the others stay float32
RTOL = 0.0  # bit-for-bit: op by op, both runs do the same float32 arithmetic

# Entries that refuse complex parameters, with the reason; they must raise a clear error
# that names the complex path.
REFUSES_COMPLEX: dict[str, str] = {
    # A complex per-example gradient's real view would put the batch axis second.
    "per_example_global_norm_clip": "needs a leading batch axis",
    "per_example_layer_norm_clip": "needs a leading batch axis",
    "contrib.differentially_private_aggregate": "needs a leading batch axis",
    "contrib.dpsgd-momentum": "needs a leading batch axis",
}
# Entries that make a complex leaf two parameters on purpose (`p/real`, `p/imaginary`): their
# updates and params are the real view's, and so is their state once each pair of entries is
# joined again (`stack([real, imaginary])`).
SPLITS_COMPLEX = {"contrib.split_real_and_imaginary-adam"}


def _values(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {p: rng.normal(size=s).astype(np.float32) for p, s in SHAPES.items()}
    imag = rng.normal(size=SHAPES[COMPLEX]).astype(np.float32)
    out[COMPLEX] = (out[COMPLEX] + 1j * imag).astype(np.complex64)
    return out


def _real_view(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    z = values[COMPLEX]
    return {**values, COMPLEX: np.stack([z.real, z.imag])}


def _pair(seed: int) -> tuple[dict, dict]:
    """A tree with a complex64 leaf and the same tree with that leaf as its real view."""
    values = _values(seed)
    as_complex = _tree({p: jnp.asarray(v) for p, v in values.items()})
    as_real = _tree({p: jnp.asarray(v) for p, v in _real_view(values).items()})
    return as_complex, as_real


PARAMS, PARAMS_REAL = _pair(0)
GRADS = [_pair(1 + k) for k in range(N_STEPS)]
GRADS_C = jax.tree.map(lambda *xs: jnp.stack(xs), *[g for g, _ in GRADS])
GRADS_R = jax.tree.map(lambda *xs: jnp.stack(xs), *[g for _, g in GRADS])


def _flat(tree: Any) -> dict[str, Any]:
    kps, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(kp, simple=True, separator="/"): x for kp, x in kps}


def _as_real(x: Any) -> np.ndarray:
    x = np.asarray(x)
    return np.stack([x.real, x.imag]) if np.iscomplexobj(x) else x


class LossOfRealView(gradtx.Transformation):
    """The contract's Polyak wrapper, with the loss taken of the params' real view (so the
    complex and the real run see the same loss value)."""

    inner: Any = None

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        real = jax.tree.map(
            lambda x: jnp.stack([x.real, x.imag]) if x.dtype == jnp.complex64 else x, params
        )
        value = contract_loss(real)
        return self.inner.update(updates, state, params, **{**extra, "value": value})


def _make(entry: Any) -> Any:
    """The entry's transformation; its test wrappers replaced by complex-aware ones."""
    tx = entry.make(entry.scalar)
    if isinstance(tx, WithLoss):
        return LossOfRealView(tx.inner)
    if isinstance(tx, WithObjective):  # Sophia's objective, of the real view too
        return tx.replace(objective=contract_loss_of_real_view)
    return tx


def _run(tx: Any, params: Any, grads: Any) -> tuple[Any, Any, Any]:
    """`N_STEPS` steps in one `lax.scan`: (stacked updates, final state, final params)."""

    def step(carry: tuple, g: Any) -> tuple:
        params, state = carry
        updates, state = tx.update(g, state, params)
        return (gradtx.apply_updates(params, updates), state), updates

    (params, state), history = jax.lax.scan(step, (params, tx.init(params)), grads)
    return history, state, params


def _both(tx: Any) -> tuple:
    """The complex run and the real-view run, op by op.

    Without `jit` every operation runs on its own (its compiled kernel cached across entries),
    which is much faster here than compiling a program per entry.
    """
    with jax.disable_jit():
        return _run(tx, PARAMS, GRADS_C), _run(tx, PARAMS_REAL, GRADS_R)


def _assert_same(got: dict[str, Any], want: dict[str, Any], what: str, rtol: float = RTOL) -> None:
    assert set(got) == set(want), what
    for key, x in got.items():
        y = want[key]
        x_real = _as_real(x)
        assert x_real.dtype == np.asarray(y).dtype, (what, key)
        assert x_real.shape == np.shape(y), (what, key)
        scale = float(np.max(np.abs(np.asarray(y, np.float64)), initial=0.0))
        np.testing.assert_allclose(
            x_real.astype(np.float64),
            np.asarray(y, np.float64),
            rtol=rtol,
            atol=rtol * scale,
            err_msg=f"{what} {key}",
        )


def _joined(flat: dict[str, Any]) -> dict[str, Any]:
    """A split state's `.../real` and `.../imaginary` entries as one `...` entry (a scalar,
    a step count, is the same for both parts)."""
    out = {}
    for key, x in flat.items():
        if key.endswith(f"/{COMPLEX}/imaginary"):
            continue
        if key.endswith(f"/{COMPLEX}/real"):
            base = key.removesuffix("/real")
            y = flat[f"{base}/imaginary"]
            x = x if np.ndim(x) == 0 else jnp.stack([x, y])
            key = base
        out[key] = x
    return out


def _assert_runs_same(run_c: tuple, run_r: tuple, rtol: float, joined: bool = False) -> None:
    (hist_c, state_c, params_c), (hist_r, state_r, params_r) = run_c, run_r
    assert _flat(hist_c)[COMPLEX].dtype == jnp.complex64
    for k in range(N_STEPS):
        u_c = {p: u[k] for p, u in _flat(hist_c).items()}
        u_r = {p: u[k] for p, u in _flat(hist_r).items()}
        _assert_same(u_c, u_r, f"updates of step {k}", rtol)
    flat_c = gradtx.state_dict(state_c)
    _assert_same(_joined(flat_c) if joined else flat_c, gradtx.state_dict(state_r), "state", rtol)
    assert _flat(params_c)[COMPLEX].dtype == jnp.complex64
    _assert_same(_flat(params_c), _flat(params_r), "params", rtol)


ENTRIES = [pytest.param(e, id=e.id) for e in REGISTRY if e.id not in REFUSES_COMPLEX]
REFUSING = [pytest.param(e, id=e.id) for e in REGISTRY if e.id in REFUSES_COMPLEX]


# A cross product of the registry: `make test` runs it, `make quick` leaves it out.
@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
def test_complex_leaf_equals_its_real_view(entry):
    """3 steps with a complex64 leaf give the updates, state and params of the real problem."""
    _assert_runs_same(*_both(_make(entry)), rtol=RTOL, joined=entry.id in SPLITS_COMPLEX)


@pytest.mark.parametrize("entry", REFUSING)
def test_refuses_complex_with_a_clear_error(entry):
    tx = entry.make(entry.scalar)
    grads = jax.tree.map(lambda g: g[0], GRADS_C)
    if isinstance(tx, FromOneGradient):  # the contract's wrapper: one gradient -> a batch
        tx, grads = tx.inner, jax.tree.map(lambda g: jnp.stack([g, 0.5 * g]), grads)
    state = tx.init(PARAMS)
    with pytest.raises(TypeError, match=f"{COMPLEX}.*complex.*{REFUSES_COMPLEX[entry.id]}"):
        tx.update(grads, state, PARAMS)


# --- the pieces of the convention ---------------------------------------------------------------


def test_jitted_optimizers_match_the_real_view():
    """Under `jit` (fused kernels) the complex run still equals the real-view run."""
    for tx in (gradtx.adam(0.1), gradtx.lamb(0.1, weight_decay=0.01), gradtx.adafactor(0.1)):
        run_c, run_r = jax.jit(
            lambda tx: (_run(tx, PARAMS, GRADS_C), _run(tx, PARAMS_REAL, GRADS_R))
        )(tx)
        _assert_runs_same(run_c, run_r, rtol=1e-6)


def test_global_norm_counts_both_parts():
    z = jnp.array([3 + 4j, 1j], jnp.complex64)
    tree = {"z": z, "w": jnp.array([2.0])}
    assert gradtx.global_norm(tree) == jnp.sqrt(jnp.float32(25 + 1 + 4))
    tx = gradtx.clip_by_global_norm(1.0)
    u, state = tx.update(tree, tx.init(tree))
    assert state["global_norm"] == gradtx.global_norm(tree)
    assert u["z"].dtype == jnp.complex64
    np.testing.assert_allclose(np.asarray(u["z"]), np.asarray(z) / np.sqrt(30.0), rtol=1e-6)


def test_state_is_kept_in_the_real_layout():
    params = {"z": jnp.zeros((3,), jnp.complex64)}
    state = gradtx.adam(0.1, mu_dtype=jnp.bfloat16).init(params)
    flat = gradtx.state_dict(state)
    assert flat["mu/z"].shape == (2, 3) and flat["mu/z"].dtype == jnp.bfloat16
    assert flat["nu/z"].shape == (2, 3) and flat["nu/z"].dtype == jnp.float32
    abstract = {"z": jax.ShapeDtypeStruct((3,), jnp.complex64)}
    assert gradtx.state_dict(gradtx.adam(0.1).init(abstract))["nu/z"].shape == (2, 3)


def test_apply_updates_keeps_complex():
    params = {"z": jnp.array([1 + 1j], jnp.complex64)}
    new = gradtx.apply_updates(params, {"z": jnp.array([0.5 - 2j], jnp.complex64)})
    assert new["z"].dtype == jnp.complex64
    assert complex(new["z"][0]) == 1.5 - 1j


def test_real_update_for_complex_param_is_an_error():
    params = {"z": jnp.zeros((2,), jnp.complex64)}
    tx = gradtx.adam(0.1)
    with pytest.raises(TypeError, match="'z'.*complex parameter needs a complex update"):
        tx.update({"z": jnp.ones((2,))}, tx.init(params), params)


def test_packed_complex_params_are_refused():
    packed = gradtx.pack({"z": jnp.zeros((2,), jnp.complex64), "w": jnp.zeros(2)})
    with pytest.raises(TypeError, match="complex parameters are not supported in packed"):
        gradtx.adam(0.1).init(packed)


def test_complex_least_squares_converges_with_the_conjugated_gradient():
    """The gradient to pass is `conj(jax.grad(loss)(z))`; JAX's gradient as is ascends in
    the imaginary parts."""
    rng = np.random.default_rng(7)
    a = jnp.asarray(rng.normal(size=(6, 3)) + 1j * rng.normal(size=(6, 3)), jnp.complex64)
    b = jnp.asarray(rng.normal(size=6) + 1j * rng.normal(size=6), jnp.complex64)
    solution = np.linalg.lstsq(np.asarray(a), np.asarray(b), rcond=None)[0]

    def loss(z: jax.Array) -> jax.Array:
        r = a @ z - b
        return jnp.sum(r.real**2 + r.imag**2)

    # jax.grad gives conj(dL/dre + 1j dL/dim): check it on the real problem
    z0 = jnp.asarray([0.3 - 0.1j, -0.2 + 0.5j, 0.1j], jnp.complex64)
    d_re, d_im = jax.grad(lambda x, y: loss(jax.lax.complex(x, y)), argnums=(0, 1))(
        z0.real, z0.imag
    )
    np.testing.assert_allclose(
        np.asarray(jax.grad(loss)(z0)), np.asarray(d_re) - 1j * np.asarray(d_im), 1e-6
    )

    @functools.partial(jax.jit, static_argnums=1)
    def solve(tx: Any, conjugate: bool) -> jax.Array:
        def step(carry: tuple, _: Any) -> tuple:
            params, state = carry
            g = jax.grad(loss)(params["z"])
            grads = {"z": jnp.conj(g) if conjugate else g}
            updates, state = tx.update(grads, state, params)
            return (gradtx.apply_updates(params, updates), state), None

        params = {"z": jnp.zeros(3, jnp.complex64)}
        (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), None, length=300)
        return params["z"]

    for tx in (gradtx.sgd(0.02), gradtx.adam(0.05)):
        z = solve(tx, True)
        assert z.dtype == jnp.complex64
        np.testing.assert_allclose(np.asarray(z), solution, atol=2e-3)
        assert not np.allclose(np.asarray(solve(tx, False)), solution, atol=1e-1)
