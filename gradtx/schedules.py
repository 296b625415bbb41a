"""Learning-rate and hyperparameter schedules, as pytrees callable as `schedule(step)`.

Stateful schedules (`StatefulSchedule`) keep a state that `inject_hyperparams` holds.
"""

from gradtx._schedules.base import Schedule, constant, join
from gradtx._schedules.cycles import cosine_onecycle, linear_onecycle, sgdr
from gradtx._schedules.decays import (
    cosine_decay,
    exponential_decay,
    linear,
    piecewise_constant,
    piecewise_interpolate,
    polynomial,
)
from gradtx._schedules.stateful import StatefulSchedule, WrappedSchedule
from gradtx._schedules.warmups import warmup_constant, warmup_cosine_decay, warmup_exponential_decay

__all__ = [
    "Schedule",
    "StatefulSchedule",
    "WrappedSchedule",
    "constant",
    "cosine_decay",
    "cosine_onecycle",
    "exponential_decay",
    "join",
    "linear",
    "linear_onecycle",
    "piecewise_constant",
    "piecewise_interpolate",
    "polynomial",
    "sgdr",
    "warmup_constant",
    "warmup_cosine_decay",
    "warmup_exponential_decay",
]
