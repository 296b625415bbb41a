"""Registry entries of gradtx.contrib's differentially private methods.

They take one gradient made into a batch of per-example gradients
(`registry.per_example.FromOneGradient`); their noise comes from other random streams than
optax's, so they have no oracle.
"""

from __future__ import annotations

import references.contrib_private as rdp

from gradtx import contrib
from registry.entry import LR_SWEEP, Entry
from registry.per_example import FromOneGradient, on_examples

ENTRIES: tuple[Entry, ...] = (
    # --- DP-SGD (per-example gradients made from one gradient; no oracle: other streams) ---
    Entry(
        id="contrib.differentially_private_aggregate",
        name="contrib.differentially_private_aggregate",
        make=lambda c: FromOneGradient(contrib.differentially_private_aggregate(c, 0.5, key=3)),
        reference=lambda c: on_examples(rdp.differentially_private_aggregate(c, 0.5, key=3)),
        oracle=None,
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=False,
        packed=False,
    ),
    Entry(
        id="contrib.dpsgd-momentum",
        name="contrib.dpsgd",
        make=lambda lr: FromOneGradient(contrib.dpsgd(lr, 1.0, 0.1, seed=3, momentum=0.9)),
        reference=lambda lr: on_examples(rdp.dpsgd(lr, 1.0, 0.1, seed=3, momentum=0.9)),
        oracle=None,
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        packed=False,
    ),
)
