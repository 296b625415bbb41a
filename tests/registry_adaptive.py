"""Registry entries of the optimizer catalogue (see `registry.Entry`): the adaptive-moment family.

The scalar of a transformation is its main decay; the scalar of an optimizer its learning rate.
optax oracles get float32 hyperparameters (`_f`), like gradtx stores them.
"""

from __future__ import annotations

import optax
import references as ref
import references_adaptive as ra
from registry import LR_SWEEP, Entry, _f, is_w, optax_w_mask

import gradtx
from gradtx import schedules

DECAY_SWEEP = (0.5, 0.8, 0.9)


def _transform_entries() -> tuple[Entry, ...]:
    return (
        Entry(
            # decay 0.95: at 0.9 every update agrees with optax within an ulp, but the
            # scalar leaf's 20 updates of size ~1 sum to ~0.2, where the final-params check
            # (rtol 1e-6 of the leaf's own size) sees the ulps of the terms.
            id="scale_by_rms",
            name="scale_by_rms",
            make=lambda d: gradtx.scale_by_rms(decay=d),
            reference=lambda d: ra.scale_by_rms(decay=d),
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
            reference=lambda d: ra.scale_by_rms(
                d, eps=1e-6, initial_scale=0.5, eps_in_sqrt=False, bias_correction=True
            ),
            oracle=lambda d: optax.scale_by_rms(
                _f(d), _f(1e-6), _f(0.5), eps_in_sqrt=False, bias_correction=True
            ),
            scalar=0.9,
            sweep=DECAY_SWEEP,
            converges=False,
            with_state_dtype=lambda d, dt: gradtx.scale_by_rms(
                d, 1e-6, 0.5, False, True, nu_dtype=dt
            ),
        ),
        Entry(
            # decay 0.95: at 0.9 every update agrees with optax within an ulp, but the
            # scalar leaf's 20 updates of size ~1 sum to ~0.2, where the final-params check
            # (rtol 1e-6 of the leaf's own size) sees the ulps of the terms.
            id="scale_by_stddev",
            name="scale_by_stddev",
            make=lambda d: gradtx.scale_by_stddev(decay=d),
            reference=lambda d: ra.scale_by_rms(decay=d, centered=True),
            oracle=lambda d: optax.scale_by_stddev(decay=_f(d), eps=_f(1e-8), initial_scale=_f(0)),
            scalar=0.95,
            sweep=DECAY_SWEEP,
            converges=False,
            with_state_dtype=lambda d, dt: gradtx.scale_by_stddev(
                decay=d, mu_dtype=dt, nu_dtype=dt
            ),
        ),
        Entry(
            # With bias correction the first variance estimate is exactly 0 and float32
            # rounding decides the first step, so this variant is checked without it.
            id="scale_by_stddev-eps_outside-initial_scale",
            name="scale_by_stddev",
            make=lambda d: gradtx.scale_by_stddev(d, 1e-6, 1.0, eps_in_sqrt=False),
            reference=lambda d: ra.scale_by_rms(d, 1e-6, 1.0, eps_in_sqrt=False, centered=True),
            oracle=lambda d: optax.scale_by_stddev(_f(d), _f(1e-6), _f(1.0), eps_in_sqrt=False),
            scalar=0.9,
            sweep=DECAY_SWEEP,
            converges=False,
        ),
        Entry(
            id="scale_by_amsgrad",
            name="scale_by_amsgrad",
            make=lambda b1: gradtx.scale_by_amsgrad(b1=b1),
            reference=lambda b1: ra.scale_by_amsgrad(b1=b1),
            oracle=lambda b1: optax.scale_by_amsgrad(b1=_f(b1), b2=_f(0.999), eps=_f(1e-8)),
            scalar=0.9,
            sweep=DECAY_SWEEP,
            converges=False,
            with_state_dtype=lambda b1, dt: gradtx.scale_by_amsgrad(
                b1=b1, mu_dtype=dt, nu_dtype=dt
            ),
        ),
        Entry(
            id="scale_by_amsgrad-no_bias_correction",
            name="scale_by_amsgrad",
            make=lambda b1: gradtx.scale_by_amsgrad(
                b1=b1, b2=0.99, bias_correction_mu=False, bias_correction_nu=False
            ),
            reference=lambda b1: ra.scale_by_amsgrad(
                b1=b1, b2=0.99, bias_correction_mu=False, bias_correction_nu=False
            ),
            oracle=lambda b1: optax.scale_by_amsgrad(
                b1=_f(b1),
                b2=_f(0.99),
                eps=_f(1e-8),
                bias_correction_mu=False,
                bias_correction_nu=False,
            ),
            scalar=0.9,
            sweep=DECAY_SWEEP,
            converges=False,
        ),
        Entry(
            id="scale_by_adamax",
            name="scale_by_adamax",
            make=lambda b1: gradtx.scale_by_adamax(b1=b1),
            reference=lambda b1: ra.scale_by_adamax(b1=b1),
            oracle=lambda b1: optax.scale_by_adamax(b1=_f(b1), b2=_f(0.999), eps=_f(1e-8)),
            scalar=0.9,
            sweep=DECAY_SWEEP,
            converges=False,
            with_state_dtype=lambda b1, dt: gradtx.scale_by_adamax(b1=b1, mu_dtype=dt, nu_dtype=dt),
        ),
        Entry(
            id="scale_by_belief",
            name="scale_by_belief",
            make=lambda b1: gradtx.scale_by_belief(b1=b1),
            reference=lambda b1: ra.scale_by_belief(b1=b1),
            oracle=lambda b1: optax.scale_by_belief(
                b1=_f(b1), b2=_f(0.999), eps=_f(1e-16), eps_root=_f(1e-16)
            ),
            scalar=0.9,
            sweep=DECAY_SWEEP,
            converges=False,
            with_state_dtype=lambda b1, dt: gradtx.scale_by_belief(b1=b1, mu_dtype=dt, nu_dtype=dt),
        ),
        Entry(
            id="scale_by_belief-nesterov",
            name="scale_by_belief",
            make=lambda b1: gradtx.scale_by_belief(b1=b1, eps=1e-8, eps_root=0.0, nesterov=True),
            reference=lambda b1: ra.scale_by_belief(b1=b1, eps=1e-8, eps_root=0.0, nesterov=True),
            oracle=lambda b1: optax.scale_by_belief(
                b1=_f(b1), b2=_f(0.999), eps=_f(1e-8), eps_root=_f(0.0), nesterov=True
            ),
            scalar=0.9,
            sweep=DECAY_SWEEP,
            converges=False,
        ),
        Entry(
            # optax evaluates rho_t as written in float32, which for b2 = 0.999 changes the
            # rectification by ~1e-3 relative (see `scale_by_radam`): no oracle here, the
            # b2 = 0.9 entries below have one.
            id="scale_by_radam",
            name="scale_by_radam",
            make=lambda b1: gradtx.scale_by_radam(b1=b1),
            reference=lambda b1: ra.scale_by_radam(b1=b1),
            oracle=None,
            scalar=0.9,
            sweep=DECAY_SWEEP,
            converges=False,
            with_state_dtype=lambda b1, dt: gradtx.scale_by_radam(b1=b1, mu_dtype=dt, nu_dtype=dt),
        ),
        Entry(
            id="scale_by_radam-b2_0.9",
            name="scale_by_radam",
            make=lambda b1: gradtx.scale_by_radam(b1=b1, b2=0.9),
            reference=lambda b1: ra.scale_by_radam(b1=b1, b2=0.9),
            oracle=lambda b1: optax.scale_by_radam(
                b1=_f(b1), b2=_f(0.9), eps=_f(1e-8), threshold=_f(5.0)
            ),
            scalar=0.9,
            sweep=DECAY_SWEEP,
            converges=False,
        ),
        Entry(
            id="scale_by_radam-b2_0.9-nesterov-threshold",
            name="scale_by_radam",
            make=lambda b1: gradtx.scale_by_radam(b1=b1, b2=0.9, threshold=6.0, nesterov=True),
            reference=lambda b1: ra.scale_by_radam(b1=b1, b2=0.9, threshold=6.0, nesterov=True),
            oracle=lambda b1: optax.scale_by_radam(
                b1=_f(b1), b2=_f(0.9), eps=_f(1e-8), threshold=_f(6.0), nesterov=True
            ),
            scalar=0.9,
            sweep=DECAY_SWEEP,
            converges=False,
        ),
        Entry(
            id="scale_by_yogi",
            name="scale_by_yogi",
            make=lambda b1: gradtx.scale_by_yogi(b1=b1),
            reference=lambda b1: ra.scale_by_yogi(b1=b1),
            oracle=lambda b1: optax.scale_by_yogi(
                b1=_f(b1),
                b2=_f(0.999),
                eps=_f(1e-3),
                eps_root=_f(0.0),
                initial_accumulator_value=_f(1e-6),
            ),
            scalar=0.9,
            sweep=DECAY_SWEEP,
            converges=False,
            with_state_dtype=lambda b1, dt: gradtx.scale_by_yogi(b1=b1, mu_dtype=dt, nu_dtype=dt),
        ),
        Entry(
            id="scale_by_adan",
            name="scale_by_adan",
            make=lambda b1: gradtx.scale_by_adan(b1=b1),
            reference=lambda b1: ra.scale_by_adan(b1=b1, eps_root=0.0),
            oracle=lambda b1: optax.scale_by_adan(
                b1=_f(b1), b2=_f(0.92), b3=_f(0.99), eps=_f(1e-8), eps_root=_f(0.0)
            ),
            scalar=0.98,
            sweep=(0.9, 0.95, 0.98),
            converges=False,
            with_state_dtype=lambda b1, dt: gradtx.scale_by_adan(b1=b1, mu_dtype=dt, nu_dtype=dt),
        ),
        Entry(
            # The scalar is eps: initial_accumulator_value only acts at init (see adagrad).
            id="scale_by_rss",
            name="scale_by_rss",
            make=lambda eps: gradtx.scale_by_rss(eps=eps),
            reference=lambda eps: ra.scale_by_rss(eps=eps),
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
            reference=lambda rho: ra.scale_by_adadelta(rho=rho),
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
            reference=lambda rho: ra.scale_by_adadelta(rho=rho, eps=1e-2),
            oracle=lambda rho: optax.scale_by_adadelta(rho=_f(rho), eps=_f(1e-2)),
            scalar=0.9,
            sweep=DECAY_SWEEP,
            converges=False,
            with_state_dtype=lambda rho, dt: gradtx.scale_by_adadelta(
                rho, 1e-2, accumulator_dtype=dt
            ),
        ),
    )


def _optimizer_entries() -> tuple[Entry, ...]:
    adam_hp = {"b1": _f(0.9), "b2": _f(0.999), "eps": _f(1e-8)}
    return (
        Entry(
            id="nadam",
            name="nadam",
            make=lambda lr: gradtx.nadam(lr),
            reference=lambda lr: ra.nadam(lr),
            oracle=lambda lr: optax.nadam(_f(lr), **adam_hp),
            scalar=0.05,
            sweep=LR_SWEEP,
            converges=True,
            with_state_dtype=lambda lr, dt: gradtx.nadam(lr, mu_dtype=dt, nu_dtype=dt),
        ),
        Entry(
            id="nadamw-mask",
            name="nadamw",
            make=lambda lr: gradtx.nadamw(lr, weight_decay=0.1, mask="**/w"),
            reference=lambda lr: ra.nadamw(lr, weight_decay=0.1, mask=is_w),
            oracle=lambda lr: optax.nadamw(
                _f(lr), **adam_hp, weight_decay=_f(0.1), mask=optax_w_mask
            ),
            scalar=0.05,
            sweep=LR_SWEEP,
            converges=True,
            needs_params=True,
            with_state_dtype=lambda lr, dt: gradtx.nadamw(
                lr, weight_decay=0.1, mask="**/w", mu_dtype=dt, nu_dtype=dt
            ),
        ),
        Entry(
            id="adamax",
            name="adamax",
            make=lambda lr: gradtx.adamax(lr),
            reference=lambda lr: ra.adamax(lr),
            oracle=lambda lr: optax.adamax(_f(lr), **adam_hp),
            scalar=0.05,
            sweep=LR_SWEEP,
            converges=True,
            with_state_dtype=lambda lr, dt: gradtx.adamax(lr, mu_dtype=dt, nu_dtype=dt),
        ),
        Entry(
            id="adamaxw-mask",
            name="adamaxw",
            make=lambda lr: gradtx.adamaxw(lr, weight_decay=0.1, mask="**/w"),
            reference=lambda lr: ra.adamaxw(lr, weight_decay=0.1, mask=is_w),
            oracle=lambda lr: optax.adamaxw(
                _f(lr), **adam_hp, weight_decay=_f(0.1), mask=optax_w_mask
            ),
            scalar=0.05,
            sweep=LR_SWEEP,
            converges=True,
            needs_params=True,
        ),
        Entry(
            id="amsgrad",
            name="amsgrad",
            make=lambda lr: gradtx.amsgrad(lr),
            reference=lambda lr: ra.amsgrad(lr),
            oracle=lambda lr: optax.amsgrad(_f(lr), **adam_hp),
            scalar=0.05,
            sweep=LR_SWEEP,
            converges=True,
            with_state_dtype=lambda lr, dt: gradtx.amsgrad(lr, mu_dtype=dt, nu_dtype=dt),
        ),
        Entry(
            id="adabelief",
            name="adabelief",
            make=lambda lr: gradtx.adabelief(lr),
            reference=lambda lr: ra.adabelief(lr),
            oracle=lambda lr: optax.adabelief(
                _f(lr), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-16), eps_root=_f(1e-16)
            ),
            scalar=0.05,
            sweep=LR_SWEEP,
            converges=True,
            with_state_dtype=lambda lr, dt: gradtx.adabelief(lr, mu_dtype=dt, nu_dtype=dt),
        ),
        Entry(
            id="radam",
            name="radam",
            make=lambda lr: gradtx.radam(lr),
            reference=lambda lr: ra.radam(lr),
            oracle=None,  # see the scale_by_radam entry
            scalar=0.05,
            sweep=LR_SWEEP,
            converges=True,
            with_state_dtype=lambda lr, dt: gradtx.radam(lr, mu_dtype=dt, nu_dtype=dt),
        ),
        Entry(
            id="radam-b2_0.9-schedule",
            name="radam",
            make=lambda lr: gradtx.radam(schedules.cosine_decay(lr, 15, alpha=0.5), b2=0.9),
            reference=lambda lr: ra.radam(ref.cosine_decay_schedule(lr, 15, 0.5), b2=0.9),
            oracle=lambda lr: optax.radam(
                optax.cosine_decay_schedule(_f(lr), 15, alpha=_f(0.5)),
                b1=_f(0.9),
                b2=_f(0.9),
                eps=_f(1e-8),
                threshold=_f(5.0),
            ),
            scalar=0.05,
            sweep=LR_SWEEP,
            converges=True,
        ),
        Entry(
            id="adagrad",
            name="adagrad",
            make=lambda lr: gradtx.adagrad(lr),
            reference=lambda lr: ra.adagrad(lr),
            oracle=lambda lr: optax.adagrad(
                _f(lr), initial_accumulator_value=_f(0.1), eps=_f(1e-7)
            ),
            scalar=0.5,
            sweep=(0.1, 0.5, 1.0),
            converges=True,
            with_state_dtype=lambda lr, dt: gradtx.adagrad(lr, accumulator_dtype=dt),
        ),
        Entry(
            id="adadelta",
            name="adadelta",
            make=lambda lr: gradtx.adadelta(lr, eps=1e-2),
            reference=lambda lr: ra.adadelta(lr, eps=1e-2),
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
            reference=lambda lr: ra.adadelta(lr, eps=1e-2, weight_decay=0.1, mask=is_w),
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
            reference=lambda lr: ra.rmsprop(lr),
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
            reference=lambda lr: ra.rmsprop(lr, centered=True, momentum=0.9),
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
            reference=lambda lr: ra.rmsprop(
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
        Entry(
            id="yogi",
            name="yogi",
            make=lambda lr: gradtx.yogi(lr),
            reference=lambda lr: ra.yogi(lr),
            oracle=lambda lr: optax.yogi(_f(lr), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-3)),
            scalar=0.05,
            sweep=LR_SWEEP,
            converges=True,
            with_state_dtype=lambda lr, dt: gradtx.yogi(lr, mu_dtype=dt, nu_dtype=dt),
        ),
        Entry(
            id="adan",
            name="adan",
            make=lambda lr: gradtx.adan(lr),
            reference=lambda lr: ra.adan(lr),
            oracle=lambda lr: optax.adan(
                _f(lr), b1=_f(0.98), b2=_f(0.92), b3=_f(0.99), eps=_f(1e-8), eps_root=_f(1e-8)
            ),
            scalar=0.05,
            sweep=LR_SWEEP,
            converges=True,
            with_state_dtype=lambda lr, dt: gradtx.adan(lr, mu_dtype=dt, nu_dtype=dt),
        ),
        Entry(
            id="adan-weight_decay-mask",
            name="adan",
            make=lambda lr: gradtx.adan(lr, weight_decay=0.1, mask="**/w"),
            reference=lambda lr: ra.adan(lr, weight_decay=0.1, mask=is_w),
            oracle=lambda lr: optax.adan(
                _f(lr),
                b1=_f(0.98),
                b2=_f(0.92),
                b3=_f(0.99),
                eps=_f(1e-8),
                eps_root=_f(1e-8),
                weight_decay=_f(0.1),
                mask=optax_w_mask,
            ),
            scalar=0.05,
            sweep=LR_SWEEP,
            converges=True,
            needs_params=True,
        ),
    )


ADAPTIVE: tuple[Entry, ...] = _transform_entries() + _optimizer_entries()
