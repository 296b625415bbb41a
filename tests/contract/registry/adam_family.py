"""Registry entries of the Adam family: `scale_by_adam`, `adam`, `adamw`, and AMSGrad,
AdaMax, AdaBelief, RAdam, Yogi, Adan, NAdam with their optimizers.

The scalar of a transformation is its main decay; the scalar of an optimizer its learning
rate. optax oracles get float32 hyperparameters (`_f`), like gradtx stores them.
"""

from __future__ import annotations

import optax
import references as ref
import references.adam_family as ra

import gradtx
from gradtx import schedules
from registry.entry import LR_SWEEP, Entry, _f, is_w, optax_w_mask

DECAY_SWEEP = (0.5, 0.8, 0.9)


# optax's Adam hyperparameters, float32 like gradtx stores them.
ADAM_HP = {"b1": _f(0.9), "b2": _f(0.999), "eps": _f(1e-8)}


ENTRIES: tuple[Entry, ...] = (
    Entry(
        id="scale_by_adam",
        name="scale_by_adam",
        make=lambda b1: gradtx.scale_by_adam(b1=b1),
        reference=lambda b1: ref.scale_by_adam(b1=b1),
        oracle=lambda b1: optax.scale_by_adam(b1=_f(b1), b2=_f(0.999), eps=_f(1e-8)),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        with_state_dtype=lambda b1, dt: gradtx.scale_by_adam(b1=b1, mu_dtype=dt, nu_dtype=dt),
    ),
    Entry(
        id="scale_by_adam-nesterov",
        name="scale_by_adam",
        make=lambda b1: gradtx.scale_by_adam(b1=b1, nesterov=True),
        reference=lambda b1: ref.scale_by_adam(b1=b1, nesterov=True),
        oracle=lambda b1: optax.scale_by_adam(b1=_f(b1), b2=_f(0.999), eps=_f(1e-8), nesterov=True),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        with_state_dtype=lambda b1, dt: gradtx.scale_by_adam(
            b1=b1, mu_dtype=dt, nu_dtype=dt, nesterov=True
        ),
    ),
    Entry(
        id="scale_by_adam-eps_root",
        name="scale_by_adam",
        make=lambda eps_root: gradtx.scale_by_adam(b2=0.99, eps=1e-6, eps_root=eps_root),
        reference=lambda eps_root: ref.scale_by_adam(b2=0.99, eps=1e-6, eps_root=eps_root),
        oracle=lambda eps_root: optax.scale_by_adam(
            b1=_f(0.9), b2=_f(0.99), eps=_f(1e-6), eps_root=_f(eps_root)
        ),
        scalar=0.01,
        sweep=(1e-3, 1e-2, 1e-1),
        converges=False,
        with_state_dtype=lambda eps_root, dt: gradtx.scale_by_adam(
            b2=0.99, eps=1e-6, eps_root=eps_root, mu_dtype=dt, nu_dtype=dt
        ),
    ),
    Entry(
        id="adam",
        name="adam",
        make=lambda lr: gradtx.adam(lr),
        reference=lambda lr: ref.adam(lr),
        oracle=lambda lr: optax.adam(_f(lr), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8)),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.adam(lr, mu_dtype=dt, nu_dtype=dt),
    ),
    Entry(
        id="adam-schedule",
        name="adam",
        make=lambda lr: gradtx.adam(schedules.cosine_decay(lr, 15, alpha=0.5)),
        reference=lambda lr: ref.adam(ref.cosine_decay_schedule(lr, 15, 0.5)),
        oracle=lambda lr: optax.adam(
            optax.cosine_decay_schedule(_f(lr), 15, alpha=_f(0.5)),
            b1=_f(0.9),
            b2=_f(0.999),
            eps=_f(1e-8),
        ),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
    ),
    Entry(
        id="adamw-mask",
        name="adamw",
        make=lambda lr: gradtx.adamw(lr, weight_decay=0.1, mask="**/w"),
        reference=lambda lr: ref.adamw(lr, weight_decay=0.1, mask=is_w),
        oracle=lambda lr: optax.adamw(
            _f(lr),
            b1=_f(0.9),
            b2=_f(0.999),
            eps=_f(1e-8),
            weight_decay=_f(0.1),
            mask=optax_w_mask,
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: gradtx.adamw(
            lr, weight_decay=0.1, mask="**/w", mu_dtype=dt, nu_dtype=dt
        ),
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
        with_state_dtype=lambda b1, dt: gradtx.scale_by_amsgrad(b1=b1, mu_dtype=dt, nu_dtype=dt),
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
        id="nadam",
        name="nadam",
        make=lambda lr: gradtx.nadam(lr),
        reference=lambda lr: ra.nadam(lr),
        oracle=lambda lr: optax.nadam(_f(lr), **ADAM_HP),
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
        oracle=lambda lr: optax.nadamw(_f(lr), **ADAM_HP, weight_decay=_f(0.1), mask=optax_w_mask),
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
        oracle=lambda lr: optax.adamax(_f(lr), **ADAM_HP),
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
        oracle=lambda lr: optax.adamaxw(_f(lr), **ADAM_HP, weight_decay=_f(0.1), mask=optax_w_mask),
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
        oracle=lambda lr: optax.amsgrad(_f(lr), **ADAM_HP),
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
