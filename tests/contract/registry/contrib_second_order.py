"""Registry entries of gradtx.contrib's second-order methods: Hutchinson's estimator of the
Hessian's diagonal and Sophia.

They get the contract's quadratic as `obj_fn`; its Hessian is diagonal, so Hutchinson's
estimate is exact whatever the random signs, and the references and optax (which draws other
signs) agree with it.
"""

from __future__ import annotations

import optax
import optax.contrib
import references.contrib_second_order as rso

from gradtx import contrib
from registry.entry import LR_SWEEP, Entry, _f
from registry.quadratic import OptaxWithObjective, WithObjective, contract_hessian_diagonal

# A sign-descent start (no Hessian estimate yet: every step is clipped to the learning rate),
# then Newton-like steps once h approaches the curvature (b2 = 0.9, gamma = 1).
SOPHIA = {"b2": 0.9, "gamma": 1.0, "update_interval": 3}


ENTRIES: tuple[Entry, ...] = (
    # --- Sophia (the contract's quadratic as the objective) ---
    Entry(
        id="contrib.hutchinson_estimator_diag_hessian",
        name="contrib.hutchinson_estimator_diag_hessian",
        make=lambda s: WithObjective(contrib.hutchinson_estimator_diag_hessian(3)),
        reference=lambda s: rso.hessian_diagonal(contract_hessian_diagonal),
        oracle=lambda s: OptaxWithObjective(optax.contrib.hutchinson_estimator_diag_hessian()),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        needs_params=True,
        uses_scalar=False,
        packed=False,
    ),
    Entry(
        id="contrib.scale_by_sophia-no_clipping",
        name="contrib.scale_by_sophia",
        make=lambda b1: WithObjective(
            contrib.scale_by_sophia(b1=b1, clip_threshold=None, eps=1e-3, **SOPHIA)
        ),
        reference=lambda b1: rso.scale_by_sophia(
            contract_hessian_diagonal, b1=b1, clip_threshold=None, eps=1e-3, **SOPHIA
        ),
        oracle=lambda b1: OptaxWithObjective(
            optax.contrib._sophia.scale_by_sophia(
                b1=_f(b1),
                b2=_f(0.9),
                eps=_f(1e-3),
                gamma=_f(1.0),
                clip_threshold=None,
                update_interval=3,
            )
        ),
        scalar=0.9,
        sweep=(0.5, 0.9, 0.965),
        converges=False,
        needs_params=True,
        packed=False,
    ),
    Entry(
        id="contrib.sophia",
        name="contrib.sophia",
        make=lambda lr: WithObjective(contrib.sophia(lr, **SOPHIA)),
        reference=lambda lr: rso.sophia(lr, contract_hessian_diagonal, **SOPHIA),
        oracle=lambda lr: OptaxWithObjective(
            optax.contrib.sophia(
                _f(lr),
                b1=_f(0.965),
                b2=_f(0.9),
                eps=_f(1e-8),
                weight_decay=_f(1e-4),
                gamma=_f(1.0),
                clip_threshold=_f(1.0),
                update_interval=3,
            )
        ),
        scalar=0.5,
        sweep=(0.2, 0.5, 0.8),
        converges=True,
        needs_params=True,
        packed=False,
    ),
)
