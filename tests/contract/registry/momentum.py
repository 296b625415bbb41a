"""Registry entries of the momentum family: `trace`, `sgd` (plain, momentum, Nesterov),
the `nesterov` optimizer and the exponential moving average `ema`.
"""

from __future__ import annotations

import optax
import references as ref
import references.momentum as rmom

import gradtx
from registry.entry import LR_SWEEP, Entry, _f

ENTRIES: tuple[Entry, ...] = (
    Entry(
        id="trace",
        name="trace",
        make=lambda d: gradtx.trace(d),
        reference=lambda d: ref.trace(d),
        oracle=lambda d: optax.trace(_f(d)),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        with_state_dtype=lambda d, dt: gradtx.trace(d, accumulator_dtype=dt),
    ),
    Entry(
        id="trace-nesterov",
        name="trace",
        make=lambda d: gradtx.trace(d, nesterov=True),
        reference=lambda d: ref.trace(d, nesterov=True),
        oracle=lambda d: optax.trace(_f(d), nesterov=True),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        with_state_dtype=lambda d, dt: gradtx.trace(d, nesterov=True, accumulator_dtype=dt),
    ),
    Entry(
        id="sgd",
        name="sgd",
        make=lambda lr: gradtx.sgd(lr),
        reference=lambda lr: ref.sgd(lr),
        oracle=lambda lr: optax.sgd(_f(lr)),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
    ),
    Entry(
        id="sgd-momentum",
        name="sgd",
        make=lambda lr: gradtx.sgd(lr, momentum=0.9),
        reference=lambda lr: ref.sgd(lr, momentum=0.9),
        oracle=lambda lr: optax.sgd(_f(lr), momentum=_f(0.9)),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.sgd(lr, momentum=0.9, accumulator_dtype=dt),
    ),
    Entry(
        id="sgd-nesterov",
        name="sgd",
        make=lambda lr: gradtx.sgd(lr, momentum=0.9, nesterov=True),
        reference=lambda lr: ref.sgd(lr, momentum=0.9, nesterov=True),
        oracle=lambda lr: optax.sgd(_f(lr), momentum=_f(0.9), nesterov=True),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.sgd(
            lr, momentum=0.9, nesterov=True, accumulator_dtype=dt
        ),
    ),
    Entry(
        id="ema",
        name="ema",
        make=lambda d: gradtx.ema(d),
        reference=lambda d: rmom.ema(d),
        oracle=lambda d: optax.ema(_f(d)),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        with_state_dtype=lambda d, dt: gradtx.ema(d, accumulator_dtype=dt),
    ),
    Entry(
        id="ema-no_debias",
        name="ema",
        make=lambda d: gradtx.ema(d, debias=False),
        reference=lambda d: rmom.ema(d, debias=False),
        oracle=lambda d: optax.ema(_f(d), debias=False),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        with_state_dtype=lambda d, dt: gradtx.ema(d, debias=False, accumulator_dtype=dt),
    ),
    Entry(
        id="nesterov",
        name="nesterov",
        make=lambda lr: gradtx.nesterov(lr),
        reference=lambda lr: rmom.nesterov(lr),
        oracle=lambda lr: optax.sgd(_f(lr), momentum=_f(0.9), nesterov=True),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.nesterov(lr, accumulator_dtype=dt),
    ),
)
