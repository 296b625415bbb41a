"""Teacher-forced comparison of a transformation with its NumPy reference and optax oracle."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import test_contract as tc

import gradtx


def teacher_forced(
    tx: Any,
    reference: Any,
    oracle: Any,
    rtol: float,
    oracle_rtol: float,
    ulps: float = 0.0,
    leaf_atol: float = 1e-6,
) -> None:
    """Run `tx` for the contract's 20 steps; at each step give the reference and the optax
    oracle the params gradtx has, and compare the updates. `ulps`: float32 ulps of the param
    the optax update may be off by (an update computed as the difference of two positions).
    `leaf_atol`: the absolute tolerance, relative to the leaf's largest expected update."""
    step = jax.jit(lambda tx, p, s, g: tx.update(g, s, p))
    params, state = tc.PARAMS, tx.init(tc.PARAMS)
    ref_state = reference.init({p: np.asarray(x, np.float64) for p, x in tc.flat(params).items()})
    with jax.numpy_dtype_promotion("standard"):
        o_state = oracle.init(params)
    for k, grads in enumerate(tc.GRADS):
        updates, state = step(tx, params, state, grads)
        flat_params = {p: np.asarray(x, np.float64) for p, x in tc.flat(params).items()}
        flat_grads = {p: np.asarray(x, np.float64) for p, x in tc.flat(grads).items()}
        want, ref_state = reference.update(flat_grads, ref_state, flat_params)
        with jax.numpy_dtype_promotion("standard"):
            o_updates, o_state = oracle.update(grads, o_state, params)
        o_flat = tc.flat(o_updates)
        for path, u in tc.flat(updates).items():
            got = np.asarray(u, np.float64)
            scale = float(np.max(np.abs(flat_params[path]), initial=0.0))
            checks = (
                ("reference", want[path], rtol, 0.0),
                ("optax", o_flat[path], oracle_rtol, ulps * np.finfo(np.float32).eps * scale),
            )
            for name, expected, tolerance, floor in checks:
                expected = np.asarray(expected, np.float64)
                np.testing.assert_allclose(
                    got,
                    expected,
                    rtol=tolerance,
                    atol=max(floor, leaf_atol * float(np.max(np.abs(expected), initial=0.0))),
                    err_msg=f"{name}, step {k}, path {path}",
                )
        params = gradtx.apply_updates(params, updates)
