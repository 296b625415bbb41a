"""Registry entry of `monitor`, which records statistics of the tree it sees and passes it
on unchanged.
"""

from __future__ import annotations

import optax
import references as ref

import gradtx
from registry.entry import LR_SWEEP, Entry, _f

MONITORED = ("global_norm", "max_abs", "nonfinite_count", "norm", "update_ratio")


ENTRIES: tuple[Entry, ...] = (
    # Every statistic recorded in front of a plain SGD step: the updates must pass unchanged
    # (the reference is the SGD step alone) through jit, scan, vmap, donation and bf16.
    Entry(
        id="monitor-all",
        name="monitor",
        make=lambda lr: gradtx.chain(gradtx.monitor("grad", MONITORED), gradtx.scale(-lr)),
        reference=lambda lr: ref.scale(-lr),
        oracle=lambda lr: optax.scale(-_f(lr)),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
        packed=False,
    ),
)
