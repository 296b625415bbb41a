"""Registry entries of gradtx.contrib's methods that set their own step size: COCOB,
D-Adaptation, Prodigy, DoG, DoWG, Mechanic, MoMo, MoMo-Adam and reduce_on_plateau.

Methods that read the loss get the contract's quadratic at the params as `value`
(`registry.quadratic.WithLoss`), their references the same quadratic in float64. Where optax
0.2.8 departs from the paper (MoMo's weight decay) the entry follows the paper.
"""

from __future__ import annotations

import optax
import optax.contrib
import references as ref
import references.contrib_lr_free as rlf
from optax.contrib import _dog as optax_dog

import gradtx
from gradtx import contrib, schedules
from registry.entry import Entry, _f, is_w, optax_w_mask
from registry.quadratic import OptaxWithLoss, WithLoss, reference_loss

ENTRIES: tuple[Entry, ...] = (
    # --- COCOB ---
    Entry(
        id="contrib.scale_by_cocob",
        name="contrib.scale_by_cocob",
        make=lambda alpha: contrib.scale_by_cocob(alpha),
        reference=lambda alpha: rlf.scale_by_cocob(alpha),
        oracle=lambda alpha: optax.contrib.scale_by_cocob(_f(alpha), _f(1e-8)),
        scalar=10.0,
        sweep=(5.0, 10.0, 50.0),
        converges=True,
        needs_params=True,
        # The reward feeds g * (x - x0) back: float32 rounding of the params compounds. At
        # alpha = 100 (tiny first steps) a float32 run drifts 3e-3 from the float64 reference
        # and 9e-5 from optax; alpha = 10 keeps the reference within 3e-5 (test_contrib checks
        # alpha = 100 step by step against the reference fed the same params).
        reference_rtol=3e-5,
        oracle_rtol=1e-5,
    ),
    Entry(
        id="contrib.cocob-weight_decay",
        name="contrib.cocob",
        make=lambda lr: contrib.cocob(lr, alpha=10.0, weight_decay=0.01),
        reference=lambda lr: rlf.cocob(lr, alpha=10.0, weight_decay=0.01),
        oracle=lambda lr: optax.contrib.cocob(_f(lr), _f(10.0), _f(1e-8), _f(0.01)),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
        oracle_rtol=1e-5,  # see scale_by_cocob
    ),
    # --- D-Adaptation, Prodigy (global step-size estimates) ---
    Entry(
        id="contrib.dadapt_adamw",
        name="contrib.dadapt_adamw",
        make=lambda lr: contrib.dadapt_adamw(lr),
        reference=lambda lr: rlf.dadapt_adamw(lr),
        oracle=lambda lr: optax.contrib.dadapt_adamw(
            _f(lr), betas=(_f(0.9), _f(0.999)), eps=_f(1e-8), estim_lr0=_f(1e-6)
        ),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
        # optax computes the bias corrections 1 - b**t in float32 directly, which loses digits
        # for b2 = 0.999 at small t (gradtx uses expm1): 3e-5 apart; the reference is at 1e-5.
        oracle_rtol=1e-4,
    ),
    Entry(
        id="contrib.dadapt_adamw-schedule-weight_decay",
        name="contrib.dadapt_adamw",
        make=lambda lr: contrib.dadapt_adamw(
            schedules.linear(lr, 0.5 * lr, 10), estim_lr0=1e-3, weight_decay=0.1
        ),
        reference=lambda lr: rlf.dadapt_adamw(
            ref.linear_schedule(lr, 0.5 * ref.f32(lr), 10), estim_lr0=1e-3, weight_decay=0.1
        ),
        oracle=lambda lr: optax.contrib.dadapt_adamw(
            optax.linear_schedule(_f(lr), _f(0.5 * ref.f32(lr)), 10),
            betas=(_f(0.9), _f(0.999)),
            eps=_f(1e-8),
            estim_lr0=_f(1e-3),
            weight_decay=_f(0.1),
        ),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=False,
        needs_params=True,
        oracle_rtol=1e-4,  # see contrib.dadapt_adamw
    ),
    Entry(
        id="contrib.prodigy",
        name="contrib.prodigy",
        # With the default d0 = 1e-6 the first steps move the params by ~1e-6, below float32's
        # resolution of params near 1, so <g, x0 - x> (and with it d) is float32 noise at first
        # and no float32 run follows a float64 reference; d0 = 1e-2 is well conditioned.
        # test_contrib checks the default against optax and step by step against the reference.
        make=lambda lr: contrib.prodigy(lr, estim_lr0=1e-2),
        reference=lambda lr: rlf.prodigy(lr, estim_lr0=1e-2),
        oracle=lambda lr: optax.contrib.prodigy(
            _f(lr), betas=(_f(0.9), _f(0.999)), eps=_f(1e-8), estim_lr0=_f(1e-2)
        ),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
        oracle_rtol=1e-4,  # see contrib.dadapt_adamw
        # d = max(d, r / |s|_1) with r a global sum with cancellations: the order XLA adds
        # in (eager vs inside lax.scan) moves d by a few 1e-6.
        scan_rtol=1e-5,
    ),
    Entry(
        id="contrib.prodigy-safeguard-beta3-weight_decay",
        name="contrib.prodigy",
        make=lambda wd: contrib.prodigy(
            schedules.linear(1.0, 0.5, 10),
            beta3=0.9,
            estim_lr0=1e-3,
            estim_lr_coef=2.0,
            weight_decay=wd,
            safeguard_warmup=True,
        ),
        reference=lambda wd: rlf.prodigy(
            ref.linear_schedule(1.0, 0.5, 10),
            beta3=0.9,
            estim_lr0=1e-3,
            estim_lr_coef=2.0,
            weight_decay=wd,
            safeguard_warmup=True,
        ),
        oracle=lambda wd: optax.contrib.prodigy(
            optax.linear_schedule(_f(1.0), _f(0.5), 10),
            betas=(_f(0.9), _f(0.999)),
            beta3=_f(0.9),
            eps=_f(1e-8),
            estim_lr0=_f(1e-3),
            estim_lr_coef=_f(2.0),
            weight_decay=_f(wd),
            safeguard_warmup=True,
        ),
        scalar=0.1,
        sweep=(0.01, 0.1, 0.5),
        converges=False,
        needs_params=True,
        oracle_rtol=1e-4,  # see contrib.dadapt_adamw
    ),
    # --- DoG, DoWG ---
    Entry(
        id="contrib.scale_by_dog-heuristic",
        name="contrib.scale_by_dog",
        make=lambda eps: contrib.scale_by_dog(("heuristic", 1e-2), eps),
        reference=lambda eps: rlf.scale_by_dog(("heuristic", 1e-2), eps),
        oracle=lambda eps: optax_dog.scale_by_dog(("heuristic", _f(1e-2)), _f(eps)),
        scalar=1e-8,
        sweep=(1e-8, 1.0, 10.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="contrib.scale_by_dog-learning_rate",
        name="contrib.scale_by_dog",
        make=lambda eps: contrib.scale_by_dog(("learning_rate", 0.1), eps),
        reference=lambda eps: rlf.scale_by_dog(("learning_rate", 0.1), eps),
        oracle=lambda eps: optax_dog.scale_by_dog(("learning_rate", _f(0.1)), _f(eps)),
        scalar=1e-8,
        sweep=(1e-8, 1.0, 10.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="contrib.dog",
        name="contrib.dog",
        # r_eps = 1e-2 (1 + ||x0||): with the default 1e-6 the distance travelled is below
        # float32's resolution at first (see contrib.prodigy); test_contrib checks the default.
        make=lambda lr: contrib.dog(lr, ("heuristic", 1e-2)),
        reference=lambda lr: rlf.dog(lr, ("heuristic", 1e-2)),
        oracle=lambda lr: optax.contrib.dog(_f(lr), ("heuristic", _f(1e-2)), _f(1e-8)),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
    ),
    Entry(
        id="contrib.dog-distance-weight_decay",
        name="contrib.dog",
        make=lambda wd: contrib.dog(1.0, ("distance", 0.1), weight_decay=wd, mask="**/w"),
        reference=lambda wd: ref.chain(
            ref.add_decayed_weights(wd, is_w), rlf.dog(1.0, ("distance", 0.1))
        ),
        oracle=lambda wd: optax.contrib.dog(
            _f(1.0), ("distance", _f(0.1)), _f(1e-8), weight_decay=_f(wd), mask=optax_w_mask
        ),
        scalar=0.01,
        sweep=(0.01, 0.1, 0.5),
        converges=True,
        needs_params=True,
    ),
    Entry(
        id="contrib.scale_by_dowg",
        name="contrib.scale_by_dowg",
        make=lambda eps: contrib.scale_by_dowg(0.01, eps),
        reference=lambda eps: rlf.scale_by_dowg(0.01, eps),
        oracle=lambda eps: optax_dog.scale_by_dowg(_f(0.01), _f(eps)),
        scalar=1e-4,
        sweep=(1e-4, 1.0, 10.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="contrib.dowg",
        name="contrib.dowg",
        make=lambda lr: contrib.dowg(lr, 1e-2),  # see contrib.dog
        reference=lambda lr: rlf.dowg(lr, 1e-2),
        oracle=lambda lr: optax.contrib.dowg(_f(lr), _f(1e-2), _f(1e-4)),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
        # The step size is a ratio of sums over every element, and optax sums in another
        # order: a few float32 ulps apart by the last steps.
        oracle_rtol=1e-5,
    ),
    Entry(
        # patience 1 without cooldown: every window that does not improve lowers the scale,
        # so a new factor changes the third step of test_new_scalar_does_not_recompile (which
        # repeats the first step's loss). Cooldown and windows:
        # tests/contrib/test_plateau_madgrad_mechanic_momo_acprop.py.
        id="contrib.reduce_on_plateau",
        name="contrib.reduce_on_plateau",
        make=lambda f: WithLoss(contrib.reduce_on_plateau(f, patience=1, min_scale=0.01)),
        reference=lambda f: rlf.reduce_on_plateau(reference_loss, f, patience=1, min_scale=0.01),
        oracle=lambda f: OptaxWithLoss(
            optax.contrib.reduce_on_plateau(
                factor=_f(f), patience=1, rtol=_f(1e-4), atol=_f(0.0), min_scale=_f(0.01)
            )
        ),
        scalar=0.5,
        sweep=(0.3, 0.5, 0.8),
        converges=False,
        needs_params=True,
    ),
    Entry(
        # Mechanic reads the summed base updates back from the params, (x0 - x) / sum(s):
        # with the default s_init = 1e-6 the first steps move float32 params near 1 by less
        # than they resolve, so that difference is float32 noise at first and no float32 run
        # follows a float64 reference (see contrib.prodigy). s_init = 0.1 and Adam steps of
        # 1 are conditioned well enough for 1e-4 (smaller steps, 1e-3 of the params, lose a
        # few digits in x0 - x). test_plateau_madgrad_mechanic_momo_acprop checks the default
        # teacher-forced. With
        # steps of 1 the quadratic's loss swings between 0 and 0.55 after 150 steps, so
        # whether it ended 100x down after 200 hung on the last bits; with 0.5 it stays
        # below 0.07.
        id="contrib.mechanize-adam",
        name="contrib.mechanize",
        make=lambda lr: contrib.mechanize(gradtx.adam(lr), s_init=0.1),
        reference=lambda lr: rlf.mechanize(ref.adam(lr), s_init=0.1),
        oracle=lambda lr: optax.contrib.mechanize(
            optax.adam(_f(lr), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8)),
            weight_decay=_f(1e-2),
            eps=_f(1e-8),
            s_init=_f(0.1),
        ),
        scalar=0.5,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
        reference_rtol=1e-4,
        oracle_rtol=1e-4,
    ),
    Entry(
        # optax 0.2.8 divides only x by 1 + lr * wd, not the step (its PR #1787 fixes that):
        # no oracle with weight decay; test_plateau_madgrad_mechanic_momo_acprop compares with optax
        # without it.
        id="contrib.momo-weight_decay-adapt_lower_bound",
        name="contrib.momo",
        make=lambda lr: WithLoss(contrib.momo(lr, weight_decay=0.01, adapt_lower_bound=True)),
        reference=lambda lr: rlf.momo(
            reference_loss, lr, weight_decay=0.01, adapt_lower_bound=True
        ),
        oracle=None,
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
    ),
    Entry(
        # The estimated lower bound overshoots on the quadratic and slows MoMo-Adam down
        # (as in optax); test_plateau_madgrad_mechanic_momo_acprop checks
        # adapt_lower_bound against optax.
        id="contrib.momo_adam-weight_decay",
        name="contrib.momo_adam",
        make=lambda lr: WithLoss(contrib.momo_adam(lr, weight_decay=0.01)),
        reference=lambda lr: rlf.momo_adam(reference_loss, lr, weight_decay=0.01),
        oracle=None,  # see contrib.momo
        scalar=0.1,
        sweep=(0.05, 0.1, 0.2),
        converges=True,
        needs_params=True,
    ),
)
