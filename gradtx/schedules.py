"""Learning-rate and hyperparameter schedules, as pytrees callable as `schedule(step)`."""

from gradtx._schedules import (
    Schedule,
    constant,
    cosine_decay,
    exponential_decay,
    join,
    linear,
    piecewise_constant,
    polynomial,
    warmup_cosine_decay,
)

__all__ = [
    "Schedule",
    "constant",
    "cosine_decay",
    "exponential_decay",
    "join",
    "linear",
    "piecewise_constant",
    "polynomial",
    "warmup_cosine_decay",
]
