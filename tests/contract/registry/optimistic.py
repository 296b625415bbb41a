"""Registry entries of the optimistic methods: `scale_by_optimistic_gradient`,
`optimistic_gradient_descent` and `optimistic_adam`.
"""

from __future__ import annotations

import warnings
from typing import Any

import optax
import references.optimistic as ro

import gradtx
from registry.entry import LR_SWEEP, Entry, _f


def optax_optimistic_adam(learning_rate: float) -> Any:
    """optax 0.2.8's `optimistic_adam` (deprecated there in favour of `optimistic_adam_v2`,
    whose arguments differ; the algorithm is the same)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return optax.optimistic_adam(_f(learning_rate), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8))


ENTRIES: tuple[Entry, ...] = (
    Entry(
        id="scale_by_optimistic_gradient",
        name="scale_by_optimistic_gradient",
        make=lambda b: gradtx.scale_by_optimistic_gradient(beta=b),
        reference=lambda b: ro.scale_by_optimistic_gradient(beta=b),
        oracle=lambda b: optax.scale_by_optimistic_gradient(alpha=_f(1.0), beta=_f(b)),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=False,
    ),
    Entry(
        id="optimistic_gradient_descent",
        name="optimistic_gradient_descent",
        make=lambda lr: gradtx.optimistic_gradient_descent(lr),
        reference=lambda lr: ro.optimistic_gradient_descent(lr),
        oracle=lambda lr: optax.optimistic_gradient_descent(_f(lr), _f(1.0), _f(1.0)),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
    ),
    Entry(
        id="optimistic_adam",
        name="optimistic_adam",
        make=lambda lr: gradtx.optimistic_adam(lr),
        reference=lambda lr: ro.optimistic_adam(lr),
        oracle=optax_optimistic_adam,
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        # u = 2 lr r_t - lr r_{t-1} subtracts two Adam directions, whose bias correction
        # `1 - 0.999**t` keeps only a few float32 digits at small t (in optax too): the
        # difference amplifies that rounding, and optax rounds NAdam's terms in another order.
        reference_rtol=1e-4,
        oracle_rtol=1e-5,
    ),
)
