"""Learning-rate and hyperparameter schedules, as pytrees callable as `schedule(step)`."""

from gradtx._schedules.schedules import (
    Schedule,
    constant,
    cosine_decay,
    cosine_onecycle,
    exponential_decay,
    join,
    linear,
    linear_onecycle,
    piecewise_constant,
    piecewise_interpolate,
    polynomial,
    sgdr,
    warmup_constant,
    warmup_cosine_decay,
    warmup_exponential_decay,
)

__all__ = [
    "Schedule",
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
