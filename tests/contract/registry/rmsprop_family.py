"""Registry entries of the second-moment rescalings: RMSProp (`scale_by_rms`,
`scale_by_stddev`, `rmsprop`), AdaGrad (`scale_by_rss`, `adagrad`) and AdaDelta.
"""

from __future__ import annotations

import optax
import references as ref
import references.rmsprop_family as rrms

import gradtx
from gradtx import schedules
from registry.entry import LR_SWEEP, Entry, _f, is_w, optax_w_mask

DECAY_SWEEP = (0.5, 0.8, 0.9)


ENTRIES: tuple[Entry, ...] = (
    Entry(
        # decay 0.95: at 0.9 every update agrees with optax within an ulp, but the
        # scalar leaf's 20 updates of size ~1 sum to ~0.2, where the final-params check
        # (rtol 1e-6 of the leaf's own size) sees the ulps of the terms.
        id="scale_by_rms",
        name="scale_by_rms",
        make=lambda d: gradtx.scale_by_rms(decay=d),
        reference=lambda d: rrms.scale_by_rms(decay=d),
        oracle=lambda d: optax.scale_by_rms(decay=_f(d), eps=_f(1e-8), initial_scale=_f(0)),
        scalar=0.95,
        sweep=DECAY_SWEEP,
        converges=False,
        with_state_dtype=lambda d, dt: gradtx.scale_by_rms(decay=d, nu_dtype=dt),
    ),
    Entry(
        id="scale_by_rms-bias_correction-eps_outside-initial_scale",
        name="scale_by_rms",
        make=lambda d: gradtx.scale_by_rms(
            d, eps=1e-6, initial_scale=0.5, eps_in_sqrt=False, bias_correction=True
        ),
        reference=lambda d: rrms.scale_by_rms(
            d, eps=1e-6, initial_scale=0.5, eps_in_sqrt=False, bias_correction=True
        ),
        oracle=lambda d: optax.scale_by_rms(
            _f(d), _f(1e-6), _f(0.5), eps_in_sqrt=False, bias_correction=True
        ),
        scalar=0.9,
        sweep=DECAY_SWEEP,
        converges=False,
        with_state_dtype=lambda d, dt: gradtx.scale_by_rms(d, 1e-6, 0.5, False, True, nu_dtype=dt),
    ),
    Entry(
        # decay 0.95: at 0.9 every update agrees with optax within an ulp, but the
        # scalar leaf's 20 updates of size ~1 sum to ~0.2, where the final-params check
        # (rtol 1e-6 of the leaf's own size) sees the ulps of the terms.
        id="scale_by_stddev",
        name="scale_by_stddev",
        make=lambda d: gradtx.scale_by_stddev(decay=d),
        reference=lambda d: rrms.scale_by_rms(decay=d, centered=True),
        oracle=lambda d: optax.scale_by_stddev(decay=_f(d), eps=_f(1e-8), initial_scale=_f(0)),
        scalar=0.95,
        sweep=DECAY_SWEEP,
        converges=False,
        with_state_dtype=lambda d, dt: gradtx.scale_by_stddev(decay=d, mu_dtype=dt, nu_dtype=dt),
    ),
    Entry(
        # With bias correction the first variance estimate is exactly 0 and float32
        # rounding decides the first step, so this variant is checked without it.
        id="scale_by_stddev-eps_outside-initial_scale",
        name="scale_by_stddev",
        make=lambda d: gradtx.scale_by_stddev(d, 1e-6, 1.0, eps_in_sqrt=False),
        reference=lambda d: rrms.scale_by_rms(d, 1e-6, 1.0, eps_in_sqrt=False, centered=True),
        oracle=lambda d: optax.scale_by_stddev(_f(d), _f(1e-6), _f(1.0), eps_in_sqrt=False),
        scalar=0.9,
        sweep=DECAY_SWEEP,
        converges=False,
    ),
    Entry(
        # The scalar is eps: initial_accumulator_value only acts at init (see adagrad).
        id="scale_by_rss",
        name="scale_by_rss",
        make=lambda eps: gradtx.scale_by_rss(eps=eps),
        reference=lambda eps: rrms.scale_by_rss(eps=eps),
        oracle=lambda eps: optax.scale_by_rss(initial_accumulator_value=_f(0.1), eps=_f(eps)),
        scalar=0.1,
        sweep=(0.01, 0.1, 1.0),
        converges=False,
        with_state_dtype=lambda eps, dt: gradtx.scale_by_rss(eps=eps, accumulator_dtype=dt),
    ),
    Entry(
        id="scale_by_adadelta",
        name="scale_by_adadelta",
        make=lambda rho: gradtx.scale_by_adadelta(rho=rho),
        reference=lambda rho: rrms.scale_by_adadelta(rho=rho),
        oracle=lambda rho: optax.scale_by_adadelta(rho=_f(rho), eps=_f(1e-6)),
        scalar=0.9,
        sweep=DECAY_SWEEP,
        converges=False,
    ),
    Entry(
        # A larger eps gives steps that bf16 params can resolve (the default's first steps
        # are about 1e-3, below bf16's resolution at 1).
        id="scale_by_adadelta-eps_1e-2",
        name="scale_by_adadelta",
        make=lambda rho: gradtx.scale_by_adadelta(rho=rho, eps=1e-2),
        reference=lambda rho: rrms.scale_by_adadelta(rho=rho, eps=1e-2),
        oracle=lambda rho: optax.scale_by_adadelta(rho=_f(rho), eps=_f(1e-2)),
        scalar=0.9,
        sweep=DECAY_SWEEP,
        converges=False,
        with_state_dtype=lambda rho, dt: gradtx.scale_by_adadelta(rho, 1e-2, accumulator_dtype=dt),
    ),
    Entry(
        id="adagrad",
        name="adagrad",
        make=lambda lr: gradtx.adagrad(lr),
        reference=lambda lr: rrms.adagrad(lr),
        oracle=lambda lr: optax.adagrad(_f(lr), initial_accumulator_value=_f(0.1), eps=_f(1e-7)),
        scalar=0.5,
        sweep=(0.1, 0.5, 1.0),
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.adagrad(lr, accumulator_dtype=dt),
    ),
    Entry(
        id="adadelta",
        name="adadelta",
        make=lambda lr: gradtx.adadelta(lr, eps=1e-2),
        reference=lambda lr: rrms.adadelta(lr, eps=1e-2),
        oracle=lambda lr: optax.adadelta(_f(lr), rho=_f(0.9), eps=_f(1e-2)),
        scalar=0.5,
        sweep=(0.1, 0.5, 1.0),
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.adadelta(lr, eps=1e-2, accumulator_dtype=dt),
    ),
    Entry(
        id="adadelta-weight_decay-mask",
        name="adadelta",
        make=lambda lr: gradtx.adadelta(lr, eps=1e-2, weight_decay=0.1, mask="**/w"),
        reference=lambda lr: rrms.adadelta(lr, eps=1e-2, weight_decay=0.1, mask=is_w),
        oracle=lambda lr: optax.adadelta(
            _f(lr),
            rho=_f(0.9),
            eps=_f(1e-2),
            weight_decay=_f(0.1),
            weight_decay_mask=optax_w_mask,
        ),
        scalar=0.5,
        sweep=(0.1, 0.5, 1.0),
        converges=True,
        needs_params=True,
    ),
    Entry(
        id="rmsprop",
        name="rmsprop",
        make=lambda lr: gradtx.rmsprop(lr),
        reference=lambda lr: rrms.rmsprop(lr),
        oracle=lambda lr: optax.rmsprop(_f(lr), decay=_f(0.9), eps=_f(1e-8)),
        scalar=0.02,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.rmsprop(lr, nu_dtype=dt),
    ),
    Entry(
        id="rmsprop-centered-momentum",
        name="rmsprop",
        make=lambda lr: gradtx.rmsprop(lr, centered=True, momentum=0.9),
        reference=lambda lr: rrms.rmsprop(lr, centered=True, momentum=0.9),
        oracle=lambda lr: optax.rmsprop(
            _f(lr), decay=_f(0.9), eps=_f(1e-8), centered=True, momentum=_f(0.9)
        ),
        scalar=0.01,
        sweep=(0.005, 0.01, 0.02),
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.rmsprop(
            lr, centered=True, momentum=0.9, mu_dtype=dt, nu_dtype=dt, accumulator_dtype=dt
        ),
    ),
    Entry(
        id="rmsprop-nesterov-schedule-bias_correction",
        name="rmsprop",
        make=lambda lr: gradtx.rmsprop(
            schedules.linear(lr, 0.5 * lr, 10),
            eps=1e-6,
            initial_scale=1.0,
            eps_in_sqrt=False,
            momentum=0.5,
            nesterov=True,
            bias_correction=True,
        ),
        reference=lambda lr: rrms.rmsprop(
            ref.linear_schedule(lr, 0.5 * ref.f32(lr), 10),
            eps=1e-6,
            initial_scale=1.0,
            eps_in_sqrt=False,
            momentum=0.5,
            nesterov=True,
            bias_correction=True,
        ),
        oracle=lambda lr: optax.rmsprop(
            optax.linear_schedule(_f(lr), _f(0.5 * ref.f32(lr)), 10),
            decay=_f(0.9),
            eps=_f(1e-6),
            initial_scale=_f(1.0),
            eps_in_sqrt=False,
            momentum=_f(0.5),
            nesterov=True,
            bias_correction=True,
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
    ),
)
