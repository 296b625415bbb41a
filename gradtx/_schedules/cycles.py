"""Cyclic schedules: one-cycle policies and cosine warm restarts (SGDR)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jax.core import Tracer

from gradtx._core.module import as_float
from gradtx._schedules.base import Join
from gradtx._schedules.decays import PiecewiseInterpolate
from gradtx._schedules.warmups import warmup_cosine_decay


def _cycle_length(fn: str, transition_steps: int, **fractions: float) -> int:
    """`transition_steps` as an int, checked with the fractions of it that end phases."""
    if isinstance(transition_steps, Tracer) or int(transition_steps) <= 0:
        raise ValueError(
            f"{fn}: `transition_steps` must be a concrete positive number of steps, got "
            f"{transition_steps!r}."
        )
    for name, value in fractions.items():
        if not 0 <= float(value) < 1:
            raise ValueError(f"{fn}: `{name}` must be in [0, 1), got {value!r}.")
    return int(transition_steps)


def _onecycle_values(
    fn: str, peak_value: float, div_factor: float, final_div_factor: float
) -> tuple[Any, Any, Any]:
    """`(low, peak, final)`: `peak / div_factor`, the peak, and `low / final_div_factor`."""
    peak = as_float(peak_value, f"{fn}.peak_value")
    low = peak / as_float(div_factor, f"{fn}.div_factor")
    return low, peak, low / as_float(final_div_factor, f"{fn}.final_div_factor")


def linear_onecycle(
    transition_steps: int,
    peak_value: float,
    pct_start: float = 0.3,
    pct_final: float = 0.85,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> PiecewiseInterpolate:
    """The one-cycle schedule with three linear phases (Smith & Topin, 2017).

    With $v_0 = $ `peak_value / div_factor`: from step 0 to `int(pct_start * T)` the value rises
    linearly from $v_0$ to `peak_value`; until `int(pct_final * T)` it falls back to $v_0$;
    until `T` it falls to $v_0$ / `final_div_factor`, and stays there (as optax's
    `linear_onecycle_schedule`).

    Args:
        transition_steps: the length $T$ of the cycle (positive).
        peak_value: the value at the end of the rise.
        pct_start: fraction of $T$ spent rising, in `[0, 1)`.
        pct_final: fraction of $T$ at which the value is back at $v_0$, in
            `(pct_start, 1)`.
        div_factor: $v_0$ = `peak_value / div_factor`.
        final_div_factor: the final value is $v_0$ / `final_div_factor`.

    Examples:
        >>> sched = gradtx.schedules.linear_onecycle(100, 1.0, div_factor=10.0)
        >>> sched(0), sched(30), sched(85)
        (Array(0.1, dtype=float32), Array(1., dtype=float32), Array(0.1, dtype=float32))
    """
    fn = "linear_onecycle"
    T = _cycle_length(fn, transition_steps, pct_start=pct_start, pct_final=pct_final)
    boundaries = (int(pct_start * T), int(pct_final * T), T)
    if not boundaries[0] < boundaries[1] < boundaries[2]:
        raise ValueError(
            f"{fn}: the phases end at steps {list(boundaries)}, which must strictly increase; "
            "need pct_start < pct_final and enough `transition_steps` to separate them."
        )
    low, peak, final = _onecycle_values(fn, peak_value, div_factor, final_div_factor)
    return PiecewiseInterpolate(np.asarray(boundaries, np.int32), (low, peak, low, final), "linear")


def cosine_onecycle(
    transition_steps: int,
    peak_value: float,
    pct_start: float = 0.3,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> PiecewiseInterpolate:
    """The one-cycle schedule with two cosine phases (Smith & Topin, 2017).

    With $v_0 = $ `peak_value / div_factor`: from step 0 to `int(pct_start * T)` the value rises
    along a half cosine from $v_0$ to `peak_value`, then falls along a half cosine to
    $v_0$ / `final_div_factor` at step `T` and stays there (as optax's
    `cosine_onecycle_schedule`).

    Args:
        transition_steps: the length $T$ of the cycle (positive).
        peak_value: the value at the end of the rise.
        pct_start: fraction of $T$ spent rising, in `[0, 1)`.
        div_factor: $v_0$ = `peak_value / div_factor`.
        final_div_factor: the final value is $v_0$ / `final_div_factor`.

    Examples:
        >>> sched = gradtx.schedules.cosine_onecycle(100, 1.0, div_factor=10.0)
        >>> sched(0), sched(30), sched(65)  # halfway down: (1 + 1e-5) / 2
        (Array(0.1, dtype=float32), Array(1., dtype=float32), Array(0.500005, dtype=float32))
    """
    fn = "cosine_onecycle"
    T = _cycle_length(fn, transition_steps, pct_start=pct_start)
    boundaries = (int(pct_start * T), T)
    if not boundaries[0] < boundaries[1]:
        raise ValueError(
            f"{fn}: the rise ends at step {boundaries[0]}, not before `transition_steps`={T}."
        )
    values = _onecycle_values(fn, peak_value, div_factor, final_div_factor)
    return PiecewiseInterpolate(np.asarray(boundaries, np.int32), values, "cosine")


_SGDR_KEYS = ("init_value", "peak_value", "warmup_steps", "decay_steps", "end_value", "exponent")


def sgdr(cosine_kwargs: Sequence[Mapping[str, Any]]) -> Join:
    """Stochastic gradient descent with warm restarts (Loshchilov & Hutter, 2017).

    Cycles of `warmup_cosine_decay(**kwargs)` run one after another; each lasts its
    `decay_steps` and restarts its step count at 0 (as optax's `sgdr_schedule`).

    Args:
        cosine_kwargs: one dict per cycle with the arguments of `warmup_cosine_decay`
            (`init_value`, `peak_value`, `warmup_steps`, `decay_steps`, and optionally
            `end_value`, `exponent`).

    Examples:
        >>> cycle = dict(init_value=0.0, peak_value=1.0, warmup_steps=2, decay_steps=10)
        >>> sched = gradtx.schedules.sgdr([cycle, cycle])
        >>> sched(2), sched(10), sched(12)
        (Array(1., dtype=float32), Array(0., dtype=float32), Array(1., dtype=float32))
    """
    cycles = list(cosine_kwargs)
    if not cycles:
        raise ValueError("sgdr: `cosine_kwargs` must hold at least one cycle.")
    parts, boundaries, total = [], [], 0
    for i, kwargs in enumerate(cycles):
        unknown = sorted(set(kwargs) - set(_SGDR_KEYS))
        missing = [k for k in _SGDR_KEYS[:4] if k not in kwargs]
        if unknown or missing:
            raise ValueError(
                f"sgdr: `cosine_kwargs[{i}]` must have the arguments of warmup_cosine_decay; "
                f"unknown: {unknown}, missing: {missing}."
            )
        parts.append(warmup_cosine_decay(**kwargs))
        total += int(kwargs["decay_steps"])
        boundaries.append(total)
    return Join(tuple(parts), np.asarray(boundaries[:-1], np.int32))
