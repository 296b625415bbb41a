"""Registry entries of Schedule-Free learning and of `ema_params`, with the references of
`references.schedule_free`.
"""

from __future__ import annotations

import optax
import references as ref
from references import f32
from references.schedule_free import around, schedule_free_adamw, schedule_free_sgd

import gradtx
from gradtx import schedules
from registry.entry import LR_SWEEP, Entry, _f

WARMUP, SGD_DECAY, ADAMW_DECAY = 5, 0.01, 0.05


def _linear_warmup(lr):
    return schedules.linear(0.0, lr, 4)


# ORACLE_NOTE: optax is the oracle in tests/combinators/test_schedule_free.py, on the params
# and the eval params. Its update is the new params minus the old in float32, which carries
# the weights' rounding (about 1e-7 for weights near 1) into updates down to 1e-4, or gives
# -1.5e-8 for a step of exactly 0: more than this suite's tolerance on the update's own size.
ENTRIES: tuple[Entry, ...] = (
    Entry(
        id="schedule_free_sgd-warmup-wd",
        name="schedule_free_sgd",
        make=lambda lr: gradtx.schedule_free_sgd(
            lr, warmup_steps=WARMUP, weight_decay=SGD_DECAY, weight_lr_power=1.5
        ),
        reference=lambda lr: schedule_free_sgd(lr, WARMUP, 0.9, SGD_DECAY, 1.5),
        oracle=None,  # see ORACLE_NOTE
        scalar=0.5,
        sweep=(0.1, 0.3, 0.5),
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: gradtx.schedule_free_sgd(
            lr, warmup_steps=WARMUP, weight_decay=SGD_DECAY, weight_lr_power=1.5, state_dtype=dt
        ),
        # The update reads z - y: the float32 rounding of weights near 1 (about 1e-7) is
        # carried into updates down to 1e-4.
        reference_rtol=1e-4,
    ),
    Entry(
        id="schedule_free_adamw-warmup-wd",
        name="schedule_free_adamw",
        make=lambda lr: gradtx.schedule_free_adamw(
            lr, warmup_steps=WARMUP, weight_decay=ADAMW_DECAY
        ),
        reference=lambda lr: schedule_free_adamw(lr, WARMUP, weight_decay=ADAMW_DECAY),
        oracle=None,  # see ORACLE_NOTE
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: gradtx.schedule_free_adamw(
            lr, warmup_steps=WARMUP, weight_decay=ADAMW_DECAY, state_dtype=dt, nu_dtype=dt
        ),
        reference_rtol=1e-4,  # as above
    ),
    Entry(
        id="schedule_free-adam",
        name="schedule_free",
        make=lambda lr: gradtx.schedule_free(gradtx.adam(lr, b1=0.0), lr, weight_lr_power=1.0),
        reference=lambda lr: around(ref.adam(lr, b1=0.0), lambda t: f32(lr), 0.9, 1.0),
        oracle=None,  # see ORACLE_NOTE
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: gradtx.schedule_free(
            gradtx.adam(lr, b1=0.0, mu_dtype=dt, nu_dtype=dt),
            lr,
            weight_lr_power=1.0,
            state_dtype=dt,
        ),
        reference_rtol=1e-4,  # as above
    ),
    Entry(
        # A schedule that starts at 0: the first step has no averaging weight (c = 0).
        id="schedule_free-sgd-schedule",
        name="schedule_free",
        make=lambda lr: gradtx.schedule_free(gradtx.sgd(_linear_warmup(lr)), _linear_warmup(lr)),
        reference=lambda lr: around(
            ref.sgd(ref.linear_schedule(0.0, lr, 4)),
            lambda t: ref.linear_schedule(0.0, lr, 4)(t - 1),
            0.9,
            2.0,
        ),
        oracle=None,  # see ORACLE_NOTE
        scalar=0.5,
        sweep=(0.1, 0.3, 0.5),
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: gradtx.schedule_free(
            gradtx.sgd(_linear_warmup(lr)), _linear_warmup(lr), state_dtype=dt
        ),
        reference_rtol=1e-4,  # as above
    ),
    Entry(
        id="ema_params-sgd-momentum",
        name="ema_params",
        make=lambda lr: gradtx.ema_params(gradtx.sgd(lr, momentum=0.9), decay=0.9),
        reference=lambda lr: ref.sgd(lr, momentum=0.9),
        oracle=lambda lr: optax.sgd(_f(lr), momentum=_f(0.9)),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: gradtx.ema_params(
            gradtx.sgd(lr, momentum=0.9, accumulator_dtype=dt), decay=0.9, accumulator_dtype=dt
        ),
    ),
)
