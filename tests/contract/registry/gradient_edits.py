"""Registry entries of the transformations that edit the gradient without keeping moments:
`centralize`, `normalize_by_update_norm`, contrib's `normalize`, `zero_nans`, added noise
(`add_noise`, `noisy_sgd`) and `keep_params_nonnegative`.
"""

from __future__ import annotations

import optax
import optax.contrib
import references as ref
import references.gradient_edits as rge

import gradtx
from gradtx import contrib
from registry.entry import LR_SWEEP, Entry, _f

ENTRIES: tuple[Entry, ...] = (
    Entry(
        id="centralize",
        name="centralize",
        make=lambda s: gradtx.centralize(),
        reference=lambda s: rge.centralize(),
        oracle=lambda s: optax.centralize(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        uses_scalar=False,
    ),
    Entry(
        # Different random streams from optax's: no oracle. The reference draws the noise
        # from the key stream the docstring documents and checks the rest of the math.
        id="add_noise",
        name="add_noise",
        make=lambda eta: gradtx.add_noise(eta, 0.55, seed=3),
        reference=lambda eta: rge.add_noise(eta, 0.55, seed=3),
        oracle=None,
        scalar=0.01,
        sweep=(0.001, 0.01, 0.1),
        converges=False,
        packed=False,
    ),
    Entry(
        id="normalize_by_update_norm",
        name="normalize_by_update_norm",
        make=lambda s: gradtx.normalize_by_update_norm(s),
        reference=lambda s: rge.normalize_by_update_norm(s),
        oracle=lambda s: optax.normalize_by_update_norm(_f(s), _f(1e-6)),
        scalar=0.5,
        sweep=(0.25, 0.5, 2.0),
        converges=False,
    ),
    Entry(
        id="zero_nans",
        name="zero_nans",
        make=lambda s: gradtx.zero_nans(),
        reference=lambda s: rge.zero_nans(),
        oracle=lambda s: optax.zero_nans(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        uses_scalar=False,
    ),
    Entry(
        id="keep_params_nonnegative",
        name="keep_params_nonnegative",
        make=lambda s: gradtx.keep_params_nonnegative(),
        reference=lambda s: rge.keep_params_nonnegative(),
        oracle=lambda s: optax.keep_params_nonnegative(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        needs_params=True,
        uses_scalar=False,
    ),
    Entry(
        id="chain-sgd-keep_params_nonnegative",
        name="keep_params_nonnegative",
        make=lambda lr: gradtx.chain(gradtx.sgd(lr), gradtx.keep_params_nonnegative()),
        reference=lambda lr: ref.chain(ref.sgd(lr), rge.keep_params_nonnegative()),
        oracle=lambda lr: optax.chain(optax.sgd(_f(lr)), optax.keep_params_nonnegative()),
        scalar=0.5,
        sweep=(0.1, 0.5, 1.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="noisy_sgd",
        name="noisy_sgd",
        make=lambda lr: gradtx.noisy_sgd(lr, seed=5),
        reference=lambda lr: rge.noisy_sgd(lr, seed=5),
        oracle=None,  # see add_noise
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
        packed=False,
    ),
    Entry(
        id="contrib.normalize",
        name="contrib.normalize",
        make=lambda s: contrib.normalize(),
        reference=lambda s: rge.normalize(),
        oracle=lambda s: optax.contrib.normalize(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        uses_scalar=False,
    ),
)
