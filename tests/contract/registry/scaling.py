"""Registry entries of the elementary transformations: `identity`, `set_to_zero`, scaling
by a constant, a learning rate or a schedule, and weight decay (`add_decayed_weights`).
"""

from __future__ import annotations

import optax
import references as ref

import gradtx
from gradtx import schedules
from registry.entry import LR_SWEEP, Entry, _f, is_w, optax_w_mask

ENTRIES: tuple[Entry, ...] = (
    Entry(
        id="identity",
        name="identity",
        make=lambda s: gradtx.identity(),
        reference=lambda s: ref.identity(),
        oracle=lambda s: optax.identity(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        uses_scalar=False,
    ),
    Entry(
        id="set_to_zero",
        name="set_to_zero",
        make=lambda s: gradtx.set_to_zero(),
        reference=lambda s: ref.set_to_zero(),
        oracle=lambda s: optax.set_to_zero(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        uses_scalar=False,
    ),
    Entry(
        id="scale",
        name="scale",
        make=lambda s: gradtx.scale(s),
        reference=lambda s: ref.scale(s),
        oracle=lambda s: optax.scale(_f(s)),
        scalar=0.5,
        sweep=(0.25, 0.5, 2.0),
        converges=False,
    ),
    Entry(
        id="scale_by_learning_rate",
        name="scale_by_learning_rate",
        make=lambda lr: gradtx.scale_by_learning_rate(lr),
        reference=lambda lr: ref.scale_by_learning_rate(lr),
        oracle=lambda lr: optax.scale_by_learning_rate(_f(lr)),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
    ),
    Entry(
        id="scale_by_learning_rate-schedule",
        name="scale_by_learning_rate",
        make=lambda lr: gradtx.scale_by_learning_rate(schedules.linear(lr, 0.5 * lr, 10)),
        reference=lambda lr: ref.scale_by_learning_rate(
            ref.linear_schedule(lr, 0.5 * ref.f32(lr), 10)
        ),
        oracle=lambda lr: optax.scale_by_learning_rate(
            optax.linear_schedule(_f(lr), _f(0.5 * ref.f32(lr)), 10)
        ),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
    ),
    Entry(
        id="scale_by_schedule-cosine",
        name="scale_by_schedule",
        make=lambda s: gradtx.scale_by_schedule(schedules.cosine_decay(s, 10, alpha=0.1)),
        reference=lambda s: ref.scale_by_schedule(ref.cosine_decay_schedule(s, 10, 0.1)),
        oracle=lambda s: optax.scale_by_schedule(
            optax.cosine_decay_schedule(_f(s), 10, alpha=_f(0.1))
        ),
        scalar=0.5,
        sweep=(0.25, 0.5, 2.0),
        converges=False,
    ),
    Entry(
        id="add_decayed_weights",
        name="add_decayed_weights",
        make=lambda wd: gradtx.add_decayed_weights(wd),
        reference=lambda wd: ref.add_decayed_weights(wd),
        oracle=lambda wd: optax.add_decayed_weights(_f(wd)),
        scalar=0.1,
        sweep=(0.01, 0.1, 0.5),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="add_decayed_weights-mask",
        name="add_decayed_weights",
        make=lambda wd: gradtx.add_decayed_weights(wd, mask="**/w"),
        reference=lambda wd: ref.add_decayed_weights(wd, mask=is_w),
        oracle=lambda wd: optax.add_decayed_weights(_f(wd), mask=optax_w_mask),
        scalar=0.1,
        sweep=(0.01, 0.1, 0.5),
        converges=False,
        needs_params=True,
    ),
)
