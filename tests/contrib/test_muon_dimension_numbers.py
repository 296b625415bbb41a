"""Muon on leaves of more than 2 dimensions: matrix axes as optax's `MuonDimensionNumbers`.

JAX's convolution kernels are HWIO; optax orthogonalises the matrix of the reduction axes
(rows) by the output axes (columns), each slice of the other (batch) axes alone, and scales
by the products of those axes' sizes. optax is the oracle, on a small HWIO kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

import gradtx
from gradtx import contrib

RNG = np.random.default_rng(0)
PARAMS = {
    "conv": jnp.asarray(RNG.normal(size=(3, 3, 4, 8)), jnp.float32),
    "w": jnp.asarray(RNG.normal(size=(5, 6)), jnp.float32),
    "b": jnp.asarray(RNG.normal(size=8), jnp.float32),
}
GRADS = [
    jax.tree.map(lambda x: jnp.asarray(RNG.normal(size=x.shape), jnp.float32), PARAMS)
    for _ in range(4)
]
Dims = optax.contrib.MuonDimensionNumbers


def _run(tx: object, update: object, apply: object, steps: int = 4) -> list[dict]:
    params, state, out = PARAMS, tx.init(PARAMS), []
    for g in GRADS[:steps]:
        u, state = update(g, state, params)
        params = apply(params, u)
        out.append(params)
    return out


def _run_optax(tx: object, steps: int = 4) -> list[dict]:
    with jax.numpy_dtype_promotion("standard"):  # optax mixes Python floats and int32 counts
        return _run(tx, tx.update, optax.apply_updates, steps)


@pytest.mark.parametrize(
    "dims, options",
    [
        (((0, 1, 2), 3), {"weight_decay": 0.1}),
        ((2, 3), {"consistent_rms": 0.2}),
        (((0, 1), (2, 3)), {"nesterov": False, "adaptive": True}),
    ],
    ids=["whole-kernel-decay", "per-tap-consistent_rms", "spatial-by-channels-adaptive"],
)
def test_muon_on_an_hwio_kernel_matches_optax(dims, options):
    """Four steps of `muon` with the kernel's axes agree with optax's (given the same axes,
    the matrix its own and the vector Adam) to float32 rounding; flattening the kernel's
    trailing axes instead, or leaving it to Adam, misses by orders of magnitude more."""
    tx = contrib.muon(0.02, muon_weight_dimension_numbers={"conv": dims}, **options)
    oracle = optax.contrib.muon(
        0.02,
        muon_weight_dimension_numbers={"conv": Dims(*dims), "w": Dims(), "b": None},
        **options,
    )
    assert "nu/conv" not in gradtx.state_dict(tx.init(PARAMS))
    mine = _run(tx, jax.jit(tx.update), gradtx.apply_updates)
    theirs = _run_optax(oracle)
    plain = contrib.muon(0.02, **options)  # the kernel takes Adam steps
    adam = _run(plain, plain.update, gradtx.apply_updates)
    for m, t, a in zip(mine, theirs, adam):
        for path in PARAMS:
            np.testing.assert_allclose(m[path], t[path], rtol=0, atol=2e-6, err_msg=path)
        assert float(jnp.max(jnp.abs(a["conv"] - t["conv"]))) > 1e-3


@pytest.mark.parametrize("dims", [((0, 1, 2), 3), (2, 3)], ids=["whole-kernel", "per-tap"])
def test_scale_by_muon_on_an_hwio_kernel_matches_optax(dims):
    tx = contrib.scale_by_muon(mask="conv", weight_dimension_numbers={"conv": dims})
    params = {"conv": PARAMS["conv"]}
    oracle = optax.contrib.scale_by_muon(weight_dimension_numbers={"conv": Dims(*dims)})
    state, o_state = tx.init(params), oracle.init(params)
    for g in GRADS[:3]:
        u, state = tx.update({"conv": g["conv"]}, state, params)
        with jax.numpy_dtype_promotion("standard"):
            o_u, o_state = oracle.update({"conv": g["conv"]}, o_state, params)
        np.testing.assert_allclose(u["conv"], o_u["conv"], rtol=0, atol=1e-5)
    # the matrices are nearly orthogonal: the (36, 8) kernel, or each tap's (4, 8) matrix
    kernel = np.asarray(u["conv"], np.float64)
    matrices = [kernel.reshape(-1, 8)] if dims == ((0, 1, 2), 3) else list(kernel.reshape(9, 4, 8))
    for m in matrices:
        singular = np.linalg.svd(m, compute_uv=False)
        assert np.all((singular > 0.6) & (singular < 1.3)), singular


def test_one_pair_for_every_leaf_of_more_than_two_dimensions():
    """A single pair applies to every leaf of more than 2 dimensions, which then takes Muon
    steps; matrices keep their own axes and vectors Adam's."""
    tx = contrib.muon(0.02, muon_weight_dimension_numbers=Dims((0, 1, 2), 3))
    keys = set(gradtx.state_dict(tx.init(PARAMS)))
    assert {"mu/conv", "mu/w", "nu/b"} <= keys and not {"nu/conv", "nu/w"} & keys
    by_path = contrib.muon(0.02, muon_weight_dimension_numbers={"conv": ((0, 1, 2), 3)})
    for mine, theirs in zip(
        _run(tx, tx.update, gradtx.apply_updates, 2),
        _run(by_path, by_path.update, gradtx.apply_updates, 2),
    ):
        for path in PARAMS:
            np.testing.assert_array_equal(mine[path], theirs[path])


def test_a_kernel_selected_without_axes_is_an_error():
    """Without a mask a kernel keeps taking Adam steps (as before); a mask that selects it
    without its axes raises, naming the path and both arguments."""
    assert "nu/conv" in gradtx.state_dict(contrib.muon(0.02).init(PARAMS))
    match = r"`muon_mask` selects the parameter at 'conv' of shape \(3, 3, 4, 8\).*" + (
        r"muon_weight_dimension_numbers=\{'conv': \(reduction_axis, output_axis\)\}.*HWIO"
    )
    with pytest.raises(ValueError, match=match):
        contrib.muon(0.02, muon_mask=["conv", "w"]).init(PARAMS)
    with pytest.raises(ValueError, match=r"`mask` selects .*'conv'.*`weight_dimension_numbers"):
        contrib.scale_by_muon(mask="**").init(PARAMS)


def test_dimension_number_errors():
    def init(**kwargs: object) -> object:
        return contrib.muon(0.02, **kwargs).init(PARAMS)

    with pytest.raises(ValueError, match=r"'conv' \(shape \(3, 3, 4, 8\)\).*no axis 4"):
        init(muon_weight_dimension_numbers={"conv": ((0, 1, 2), 4)})
    with pytest.raises(ValueError, match=r"'conv'.*reduction axes \(0, 1, 3\).*repeat an axis"):
        init(muon_weight_dimension_numbers={"conv": ((0, 1, -1), 3)})
    with pytest.raises(ValueError, match=r"axes to the parameter at 'b' \(\(8,\)\).*at least 2"):
        init(muon_weight_dimension_numbers={"b": (0, 0)})
    with pytest.raises(ValueError, match="'conv' two entries"):
        init(muon_weight_dimension_numbers={"conv": (2, 3), "c*": (2, 3)})
    with pytest.raises(ValueError, match="'conv', which `muon_mask` does not select"):
        init(muon_mask="w", muon_weight_dimension_numbers={"conv": (2, 3)})
    with pytest.raises(TypeError, match=r"selector 'conv' maps to 3.*\(reduction_axis"):
        contrib.muon(0.02, muon_weight_dimension_numbers={"conv": 3})
    with pytest.raises(TypeError, match="`weight_dimension_numbers` must be None, a pair"):
        contrib.scale_by_muon(weight_dimension_numbers="conv")
    with pytest.raises(TypeError, match="`weight_dimension_numbers` must be None, a pair"):
        contrib.scale_by_muon(weight_dimension_numbers=((), (1,)))  # no reduction axis
