"""Registry entries of gradtx.contrib's Adam-like methods: ADOPT, AdEMAMix, Simplified
AdEMAMix, MADGRAD and ACProp; names read `contrib.<name>`.

Where optax 0.2.8 departs from the paper (ACProp's centring) the entry follows the paper.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
import optax.contrib
import references as ref
import references.contrib_adam_family as rca

from gradtx import contrib, schedules
from registry.entry import LR_SWEEP, Entry, _f, is_w, optax_w_mask


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


ENTRIES: tuple[Entry, ...] = (
    # --- ADOPT ---
    Entry(
        id="contrib.scale_by_adopt",
        name="contrib.scale_by_adopt",
        make=lambda b1: contrib.scale_by_adopt(b1=b1),
        reference=lambda b1: rca.scale_by_adopt(b1=b1),
        oracle=lambda b1: optax.contrib.scale_by_adopt(b1=_f(b1), b2=_f(0.9999), eps=_f(1e-6)),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
    ),
    Entry(
        id="contrib.scale_by_adopt-nesterov-no_clipping",
        name="contrib.scale_by_adopt",
        make=lambda b2: contrib.scale_by_adopt(b2=b2, nesterov=True, use_clipping=False),
        reference=lambda b2: rca.scale_by_adopt(b2=b2, nesterov=True, use_clipping=False),
        oracle=lambda b2: optax.contrib.scale_by_adopt(
            b1=_f(0.9), b2=_f(b2), eps=_f(1e-6), nesterov=True, use_clipping=False
        ),
        scalar=0.99,
        sweep=(0.9, 0.99, 0.999),
        converges=False,
    ),
    Entry(
        id="contrib.adopt",
        name="contrib.adopt",
        make=lambda lr: contrib.adopt(lr),
        reference=lambda lr: rca.adopt(lr),
        oracle=lambda lr: optax.contrib.adopt(_f(lr), b1=_f(0.9), b2=_f(0.9999), eps=_f(1e-6)),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
    ),
    # --- AdEMAMix ---
    Entry(
        id="contrib.scale_by_ademamix",
        name="contrib.scale_by_ademamix",
        make=lambda alpha: contrib.scale_by_ademamix(b3=0.99, alpha=alpha),
        reference=lambda alpha: rca.scale_by_ademamix(b3=0.99, alpha=alpha),
        oracle=lambda alpha: optax.contrib.scale_by_ademamix(
            b1=_f(0.9), b2=_f(0.999), b3=_f(0.99), alpha=_f(alpha), eps=_f(1e-8)
        ),
        scalar=5.0,
        sweep=(2.0, 5.0, 8.0),
        converges=False,
        with_state_dtype=lambda alpha, dt: contrib.scale_by_ademamix(
            b3=0.99, alpha=alpha, mu_dtype=dt
        ),
    ),
    Entry(
        id="contrib.scale_by_ademamix-schedules",
        name="contrib.scale_by_ademamix",
        make=lambda alpha: contrib.scale_by_ademamix(
            b3=schedules.linear(0.9, 0.99, 10), alpha=schedules.linear(0.0, alpha, 10)
        ),
        reference=lambda alpha: rca.scale_by_ademamix(
            b3=ref.linear_schedule(0.9, 0.99, 10), alpha=ref.linear_schedule(0.0, alpha, 10)
        ),
        oracle=lambda alpha: optax.contrib.scale_by_ademamix(
            b1=_f(0.9),
            b2=_f(0.999),
            b3=optax.linear_schedule(_f(0.9), _f(0.99), 10),
            alpha=optax.linear_schedule(_f(0.0), _f(alpha), 10),
            eps=_f(1e-8),
        ),
        scalar=5.0,
        sweep=(2.0, 5.0, 8.0),
        converges=False,
    ),
    Entry(
        id="contrib.ademamix-mask",
        name="contrib.ademamix",
        make=lambda lr: contrib.ademamix(lr, b3=0.99, weight_decay=0.01, mask="**/w"),
        reference=lambda lr: rca.ademamix(lr, b3=0.99, weight_decay=0.01, mask=is_w),
        oracle=lambda lr: optax.contrib.ademamix(
            _f(lr),
            b1=_f(0.9),
            b2=_f(0.999),
            b3=_f(0.99),
            alpha=_f(5.0),
            eps=_f(1e-8),
            weight_decay=_f(0.01),
            mask=optax_w_mask,
        ),
        scalar=0.02,
        sweep=(0.01, 0.02, 0.05),
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: contrib.ademamix(
            lr, b3=0.99, weight_decay=0.01, mask="**/w", mu_dtype=dt
        ),
    ),
    Entry(
        id="contrib.scale_by_madgrad",
        name="contrib.scale_by_madgrad",
        make=lambda lr: contrib.scale_by_madgrad(lr),
        reference=lambda lr: rca.scale_by_madgrad(lr),
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
        reference=lambda lr: rca.madgrad(
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
        id="contrib.scale_by_acprop",
        name="contrib.scale_by_acprop",
        make=lambda b1: contrib.scale_by_acprop(b1=b1),
        reference=lambda b1: rca.scale_by_acprop(b1=b1),
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
        reference=lambda lr: rca.acprop(lr, weight_decay=0.01, mask=is_w),
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
    # --- Simplified AdEMAMix ---
    Entry(
        id="contrib.scale_by_simplified_ademamix-schedule",
        name="contrib.scale_by_simplified_ademamix",
        make=lambda alpha: contrib.scale_by_simplified_ademamix(
            b1=0.9, alpha=schedules.linear(0.0, alpha, 10), eps_root=1e-8
        ),
        reference=lambda alpha: rca.scale_by_simplified_ademamix(
            b1=0.9, alpha=ref.linear_schedule(0.0, alpha, 10), eps_root=1e-8
        ),
        oracle=lambda alpha: optax.contrib.scale_by_simplified_ademamix(
            b1=_f(0.9),
            b2=_f(0.95),
            alpha=optax.linear_schedule(_f(0.0), _f(alpha), 10),
            eps=_f(1e-8),
            eps_root=_f(1e-8),
        ),
        scalar=2.0,
        sweep=(1.0, 2.0, 5.0),
        converges=False,
        # m is an undamped sum of gradients: where m + alpha g nearly cancels (the scalar
        # leaf at step 15) float32 rounding of the terms is 2e-6 of the result, in optax too.
        oracle_rtol=1e-5,
    ),
    Entry(
        id="contrib.simplified_ademamix-mask",
        name="contrib.simplified_ademamix",
        make=lambda lr: contrib.simplified_ademamix(
            lr, b1=0.9, alpha=1.0, weight_decay=0.01, mask="**/w"
        ),
        reference=lambda lr: rca.simplified_ademamix(
            lr, b1=0.9, alpha=1.0, weight_decay=0.01, mask=is_w
        ),
        oracle=lambda lr: optax.contrib.simplified_ademamix(
            _f(lr),
            b1=_f(0.9),
            b2=_f(0.95),
            alpha=_f(1.0),
            eps=_f(1e-8),
            eps_root=_f(0.0),
            weight_decay=_f(0.01),
            mask=optax_w_mask,
        ),
        scalar=0.005,
        sweep=(0.002, 0.005, 0.01),
        converges=True,
        needs_params=True,
    ),
)
