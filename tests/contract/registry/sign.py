"""Registry entries of the sign-based methods: Lion, sign descent, signum and Rprop."""

from __future__ import annotations

import optax
import references as ref
import references.sign as rs

import gradtx
from gradtx import schedules
from registry.entry import LR_SWEEP, Entry, _f, is_w, optax_w_mask

ENTRIES: tuple[Entry, ...] = (
    Entry(
        id="scale_by_lion",
        name="scale_by_lion",
        make=lambda b1: gradtx.scale_by_lion(b1=b1),
        reference=lambda b1: rs.scale_by_lion(b1=b1),
        oracle=lambda b1: optax.scale_by_lion(b1=_f(b1), b2=_f(0.99)),
        scalar=0.9,
        sweep=(0.1, 0.5, 0.99),
        converges=False,
        with_state_dtype=lambda b1, dt: gradtx.scale_by_lion(b1=b1, mu_dtype=dt),
    ),
    Entry(
        id="scale_by_sign",
        name="scale_by_sign",
        make=lambda s: gradtx.scale_by_sign(),
        reference=lambda s: rs.scale_by_sign(),
        oracle=lambda s: optax.scale_by_sign(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        uses_scalar=False,
    ),
    Entry(
        # optax 0.2.8 returns the previous step's update (google-deepmind/optax#1725): no oracle.
        id="scale_by_rprop",
        name="scale_by_rprop",
        make=lambda eta_plus: gradtx.scale_by_rprop(0.1, eta_plus=eta_plus),
        reference=lambda eta_plus: rs.scale_by_rprop(0.1, eta_plus=eta_plus),
        oracle=None,
        scalar=1.2,
        sweep=(1.1, 1.2, 1.5),
        converges=False,
    ),
    # --- optimizers ---
    Entry(
        id="lion-mask",
        name="lion",
        make=lambda lr: gradtx.lion(lr, weight_decay=0.1, mask="**/w"),
        reference=lambda lr: rs.lion(lr, weight_decay=0.1, mask=is_w),
        oracle=lambda lr: optax.lion(
            _f(lr), b1=_f(0.9), b2=_f(0.99), weight_decay=_f(0.1), mask=optax_w_mask
        ),
        scalar=0.03,
        sweep=(0.01, 0.03, 0.05),
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: gradtx.lion(lr, weight_decay=0.1, mask="**/w", mu_dtype=dt),
    ),
    Entry(
        id="lion-schedule",
        name="lion",
        make=lambda lr: gradtx.lion(schedules.cosine_decay(lr, 15, alpha=0.5)),
        reference=lambda lr: rs.lion(ref.cosine_decay_schedule(lr, 15, 0.5)),
        oracle=lambda lr: optax.lion(
            optax.cosine_decay_schedule(_f(lr), 15, alpha=_f(0.5)),
            b1=_f(0.9),
            b2=_f(0.99),
            weight_decay=_f(1e-3),
        ),
        scalar=0.03,
        sweep=(0.01, 0.03, 0.05),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="sign_sgd",
        name="sign_sgd",
        make=lambda lr: gradtx.sign_sgd(lr),
        reference=lambda lr: rs.sign_sgd(lr),
        oracle=lambda lr: optax.sign_sgd(_f(lr)),
        scalar=0.03,
        sweep=(0.01, 0.03, 0.05),
        converges=True,
    ),
    Entry(
        id="signum",
        name="signum",
        make=lambda lr: gradtx.signum(lr),
        reference=lambda lr: rs.signum(lr),
        oracle=lambda lr: optax.signum(_f(lr), beta=_f(0.9)),
        scalar=0.03,
        sweep=(0.01, 0.03, 0.05),
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.signum(lr, accumulator_dtype=dt),
    ),
    Entry(
        id="rprop",
        name="rprop",
        make=lambda eta_minus: gradtx.rprop(0.05, eta_minus=eta_minus),
        reference=lambda eta_minus: rs.rprop(0.05, eta_minus=eta_minus),
        oracle=None,  # see scale_by_rprop
        scalar=0.5,
        sweep=(0.3, 0.5, 0.7),
        converges=True,
    ),
)
