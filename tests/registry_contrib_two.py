"""Registry entries of gradtx.contrib (see `registry.Entry`): reduce_on_plateau, MADGRAD,
Mechanic, MoMo, MoMo-Adam and ACProp, one entry per public name.

Methods that read the loss (`reduce_on_plateau`, `momo`, `momo_adam`) get the contract's
quadratic at the params as `value` (`registry_misc.WithLoss`), their references the same
quadratic in float64. Where optax 0.2.8 departs from the paper (MoMo's weight decay, ACProp's
centring) the entry follows the paper; tests/test_contrib_two.py compares with optax where
the two agree.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
import optax.contrib
import references as ref
import references_contrib_two as rc
from registry import Entry, _f, is_w, optax_w_mask
from registry_misc import OptaxWithLoss, WithLoss, reference_loss

import gradtx
from gradtx import contrib, schedules


class CentredAcprop:
    """optax's `scale_by_acprop` centred with the new first moment, as its formula says.

    optax 0.2.8 computes the residual `g - m` with the previous moment (its PR #1716 fixes
    that): the wrapped state gets the new moment before the call and keeps it after, so the
    rest of the arithmetic (bias correction, the first step, eps) is optax's own.
    """

    def __init__(self, b1: float, **kwargs: Any) -> None:
        self.b1 = _f(b1)
        self.inner = optax.contrib.scale_by_acprop(b1=self.b1, **kwargs)

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        b1 = self.b1
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
        out, new = self.inner.update(updates, state._replace(mu=mu), params)
        return out, new._replace(mu=mu)


def optax_acprop(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-16) -> CentredAcprop:
    return CentredAcprop(b1, b2=_f(b2), eps=_f(eps), eps_root=_f(1e-16))


CONTRIB_TWO: tuple[Entry, ...] = (
    Entry(
        # patience 1 without cooldown: every window that does not improve lowers the scale,
        # so a new factor changes the third step of test_new_scalar_does_not_recompile (which
        # repeats the first step's loss). Cooldown and windows: tests/test_contrib_two.py.
        id="contrib.reduce_on_plateau",
        name="contrib.reduce_on_plateau",
        make=lambda f: WithLoss(contrib.reduce_on_plateau(f, patience=1, min_scale=0.01)),
        reference=lambda f: rc.reduce_on_plateau(reference_loss, f, patience=1, min_scale=0.01),
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
        id="contrib.scale_by_madgrad",
        name="contrib.scale_by_madgrad",
        make=lambda lr: contrib.scale_by_madgrad(lr),
        reference=lambda lr: rc.scale_by_madgrad(lr),
        oracle=lambda lr: optax.contrib.scale_by_madgrad(_f(lr), _f(0.9), _f(1e-6)),
        scalar=0.05,
        sweep=(0.02, 0.05, 0.1),
        converges=True,
        needs_params=True,
        # optax forms the new params and subtracts the old ones in float32, which rounds a
        # 1e-2 step of params near 1 by ~1e-5 of itself (gradtx and the reference: 1e-6).
        oracle_rtol=1e-4,
    ),
    Entry(
        id="contrib.madgrad-schedule-weight_decay",
        name="contrib.madgrad",
        make=lambda lr: contrib.madgrad(
            schedules.linear(lr, 0.5 * lr, 10), momentum=0.5, weight_decay=0.01
        ),
        reference=lambda lr: rc.madgrad(
            ref.linear_schedule(lr, 0.5 * ref.f32(lr), 10), momentum=0.5, weight_decay=0.01
        ),
        oracle=lambda lr: optax.contrib.madgrad(
            optax.linear_schedule(_f(lr), _f(0.5 * ref.f32(lr)), 10),
            momentum=_f(0.5),
            weight_decay=_f(0.01),
            eps=_f(1e-6),
        ),
        scalar=0.05,
        sweep=(0.02, 0.05, 0.1),
        converges=True,
        needs_params=True,
        oracle_rtol=1e-5,  # see contrib.scale_by_madgrad (smaller steps here)
    ),
    Entry(
        # Mechanic reads the summed base updates back from the params, (x0 - x) / sum(s):
        # with the default s_init = 1e-6 the first steps move float32 params near 1 by less
        # than they resolve, so that difference is float32 noise at first and no float32 run
        # follows a float64 reference (see contrib.prodigy). s_init = 0.1 and Adam steps of
        # 1 are conditioned well enough for 1e-4 (smaller steps, 1e-3 of the params, lose a
        # few digits in x0 - x). test_contrib_two checks the default teacher-forced. With
        # steps of 1 the quadratic's loss swings between 0 and 0.55 after 150 steps, so
        # whether it ended 100x down after 200 hung on the last bits; with 0.5 it stays
        # below 0.07.
        id="contrib.mechanize-adam",
        name="contrib.mechanize",
        make=lambda lr: contrib.mechanize(gradtx.adam(lr), s_init=0.1),
        reference=lambda lr: rc.mechanize(ref.adam(lr), s_init=0.1),
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
        # no oracle with weight decay; test_contrib_two compares with optax without it.
        id="contrib.momo-weight_decay-adapt_lower_bound",
        name="contrib.momo",
        make=lambda lr: WithLoss(contrib.momo(lr, weight_decay=0.01, adapt_lower_bound=True)),
        reference=lambda lr: rc.momo(reference_loss, lr, weight_decay=0.01, adapt_lower_bound=True),
        oracle=None,
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
    ),
    Entry(
        # The estimated lower bound overshoots on the quadratic and slows MoMo-Adam down
        # (as in optax); test_contrib_two checks adapt_lower_bound against optax.
        id="contrib.momo_adam-weight_decay",
        name="contrib.momo_adam",
        make=lambda lr: WithLoss(contrib.momo_adam(lr, weight_decay=0.01)),
        reference=lambda lr: rc.momo_adam(reference_loss, lr, weight_decay=0.01),
        oracle=None,  # see contrib.momo
        scalar=0.1,
        sweep=(0.05, 0.1, 0.2),
        converges=True,
        needs_params=True,
    ),
    Entry(
        id="contrib.scale_by_acprop",
        name="contrib.scale_by_acprop",
        make=lambda b1: contrib.scale_by_acprop(b1=b1),
        reference=lambda b1: rc.scale_by_acprop(b1=b1),
        oracle=lambda b1: optax_acprop(b1),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        # optax computes 1 - b2**t in float32 directly (gradtx: expm1), 3e-6 apart.
        oracle_rtol=1e-5,
    ),
    Entry(
        id="contrib.acprop-mask",
        name="contrib.acprop",
        make=lambda lr: contrib.acprop(lr, weight_decay=0.01, mask="**/w"),
        reference=lambda lr: rc.acprop(lr, weight_decay=0.01, mask=is_w),
        oracle=lambda lr: optax.chain(
            optax_acprop(),
            optax.add_decayed_weights(_f(0.01), optax_w_mask),
            optax.scale_by_learning_rate(_f(lr)),
        ),
        scalar=0.02,
        sweep=(0.01, 0.02, 0.05),
        converges=True,
        needs_params=True,
        oracle_rtol=1e-5,  # see contrib.scale_by_acprop
    ),
)
