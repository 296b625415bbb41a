"""gradtx: functional gradient transformations for JAX, where a parameter's identity is its path."""

from gradtx import paths, schedules
from gradtx._adam import scale_by_adam
from gradtx._apply import apply_updates
from gradtx._base import Transformation
from gradtx._chain import chain, named_chain
from gradtx._clipping import clip, clip_by_global_norm, global_norm
from gradtx._optimizers import adam, adamw, sgd
from gradtx._scale import identity, scale, scale_by_learning_rate, scale_by_schedule, set_to_zero
from gradtx._state_dict import (
    LoadReport,
    StateMismatchError,
    load_state_dict,
    reconcile,
    state_dict,
)
from gradtx._trace import trace
from gradtx._weight_decay import add_decayed_weights

__version__ = "0.1.0"

__all__ = [
    "LoadReport",
    "StateMismatchError",
    "Transformation",
    "adam",
    "adamw",
    "add_decayed_weights",
    "apply_updates",
    "chain",
    "clip",
    "clip_by_global_norm",
    "global_norm",
    "identity",
    "load_state_dict",
    "named_chain",
    "paths",
    "reconcile",
    "scale",
    "scale_by_adam",
    "scale_by_learning_rate",
    "scale_by_schedule",
    "schedules",
    "set_to_zero",
    "sgd",
    "state_dict",
    "trace",
]
