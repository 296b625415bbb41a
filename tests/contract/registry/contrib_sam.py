"""Registry entries of gradtx.contrib's sharpness-aware minimisation (`sam`)."""

from __future__ import annotations

from typing import Any

import optax
import optax.contrib
import references as ref
import references.contrib_sam as rsam
import references.gradient_edits as rge

import gradtx
from gradtx import contrib
from registry.entry import LR_SWEEP, Entry, _f


def _optax_sam(outer: Any, rho: float, sync_period: int = 2, reset_state: bool = True) -> Any:
    adversary = optax.chain(optax.normalize_by_update_norm(_f(1.0), _f(1e-6)), optax.sgd(_f(rho)))
    return optax.contrib.sam(outer, adversary, sync_period=sync_period, reset_state=reset_state)


def _sam(outer: Any, rho: Any, sync_period: int = 2, reset_state: bool = True) -> Any:
    adversary = gradtx.chain(gradtx.normalize_by_update_norm(), gradtx.sgd(rho))
    return contrib.sam(outer, adversary, sync_period=sync_period, reset_state=reset_state)


ENTRIES: tuple[Entry, ...] = (
    # --- SAM ---
    Entry(
        id="contrib.sam-sgd",
        name="contrib.sam",
        make=lambda rho: _sam(gradtx.sgd(0.1), rho),
        reference=lambda rho: rsam.sam_sgd(0.1, rho),
        oracle=lambda rho: _optax_sam(optax.sgd(_f(0.1)), rho),
        scalar=0.02,
        sweep=(0.01, 0.02, 0.05),
        converges=True,
        needs_params=True,
    ),
    Entry(
        # Momentum on both sides: the outer trace moves at the end of each cycle only, the
        # adversary's at every ascent step (not reset).
        id="contrib.sam-momentum-sync3-keep_state",
        name="contrib.sam",
        make=lambda lr: contrib.sam(
            gradtx.sgd(lr, momentum=0.9),
            gradtx.chain(gradtx.normalize_by_update_norm(), gradtx.sgd(0.02, momentum=0.5)),
            sync_period=3,
            reset_state=False,
        ),
        reference=lambda lr: rsam.sam(
            ref.sgd(lr, momentum=0.9),
            ref.chain(rge.normalize_by_update_norm(1.0, 1e-6), ref.sgd(0.02, momentum=0.5)),
            sync_period=3,
            reset_state=False,
        ),
        oracle=lambda lr: optax.contrib.sam(
            optax.sgd(_f(lr), momentum=_f(0.9)),
            optax.chain(
                optax.normalize_by_update_norm(_f(1.0), _f(1e-6)),
                optax.sgd(_f(0.02), momentum=_f(0.5)),
            ),
            sync_period=3,
            reset_state=False,
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
    ),
)
