"""Registry entries of the Polyak step size (`scale_by_polyak`, `polyak_sgd`), which reads
the loss: the contract's quadratic, passed as `value` (`registry.quadratic.WithLoss`).
"""

from __future__ import annotations

import optax
import references.polyak as rp

import gradtx
from registry.entry import Entry, _f
from registry.quadratic import OptaxWithLoss, WithLoss, reference_loss

ENTRIES: tuple[Entry, ...] = (
    Entry(
        id="scale_by_polyak",
        name="scale_by_polyak",
        make=lambda m: WithLoss(gradtx.scale_by_polyak(max_learning_rate=m)),
        reference=lambda m: rp.scale_by_polyak(reference_loss, max_learning_rate=m),
        oracle=lambda m: OptaxWithLoss(optax.scale_by_polyak(max_learning_rate=_f(m))),
        scalar=0.5,
        sweep=(0.05, 0.2, 0.5),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="scale_by_polyak-sps+",
        name="scale_by_polyak",
        make=lambda f_min: WithLoss(gradtx.scale_by_polyak(f_min=f_min, variant="sps+")),
        reference=lambda f_min: rp.scale_by_polyak(reference_loss, f_min=f_min, variant="sps+"),
        oracle=lambda f_min: OptaxWithLoss(
            optax.scale_by_polyak(f_min=_f(f_min), max_learning_rate=_f(1.0), variant="sps+")
        ),
        scalar=1.0,
        sweep=(0.0, 1.0, 10.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="polyak_sgd",
        name="polyak_sgd",
        make=lambda m: WithLoss(gradtx.polyak_sgd(max_learning_rate=m)),
        reference=lambda m: rp.polyak_sgd(reference_loss, max_learning_rate=m),
        oracle=lambda m: OptaxWithLoss(optax.polyak_sgd(max_learning_rate=_f(m))),
        scalar=1.0,
        sweep=(0.05, 0.2, 1.0),
        converges=True,
        needs_params=True,
    ),
)
