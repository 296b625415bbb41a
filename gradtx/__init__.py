"""gradtx: functional gradient transformations for JAX, where a parameter's identity is its path."""

from gradtx import contrib, paths, projections, schedules, tree
from gradtx._combinators.accumulate import accumulate, has_updated, multi_steps
from gradtx._combinators.bucketed import bucketed
from gradtx._combinators.chain import chain, named_chain
from gradtx._combinators.conditional import conditionally_mask, conditionally_transform
from gradtx._combinators.ema_params import ema_params
from gradtx._combinators.finite import apply_if_finite
from gradtx._combinators.freeze import freeze, selective_transform, trainable
from gradtx._combinators.inject import inject_hyperparams
from gradtx._combinators.lookahead import lookahead
from gradtx._combinators.masked import masked
from gradtx._combinators.partition import multi_transform, partition
from gradtx._combinators.schedule_free import schedule_free
from gradtx._combinators.skip_predicates import skip_large_updates, skip_not_finite
from gradtx._combinators.without_statistics import without_statistics
from gradtx._core.apply import apply_updates
from gradtx._core.protocol import Transformation
from gradtx._layouts.packed import Packed, pack
from gradtx._optimizers.adagrad import adadelta, adagrad
from gradtx._optimizers.adam import adam, adamw, nadam, nadamw
from gradtx._optimizers.adam_variants import adabelief, adamax, adamaxw, adan, amsgrad, radam, yogi
from gradtx._optimizers.factored import adafactor
from gradtx._optimizers.lbfgs import lbfgs
from gradtx._optimizers.lion import lion
from gradtx._optimizers.momentum import nesterov, sgd
from gradtx._optimizers.noise import noisy_sgd
from gradtx._optimizers.novograd import novograd
from gradtx._optimizers.optimistic import optimistic_adam, optimistic_gradient_descent
from gradtx._optimizers.polyak import polyak_sgd
from gradtx._optimizers.rms import rmsprop
from gradtx._optimizers.schedule_free import schedule_free_adamw, schedule_free_sgd
from gradtx._optimizers.sign import rprop, sign_sgd, signum
from gradtx._optimizers.sm3 import sm3
from gradtx._optimizers.trust_ratio import fromage, lamb, lars
from gradtx._state.checkpoint import RestoreReport, restore, save
from gradtx._state.eval_params import eval_params
from gradtx._state.explain import explain
from gradtx._state.from_optax import from_optax
from gradtx._state.hyperparams import hyperparams, reset, set_hyperparams
from gradtx._state.map_params import tree_map_params
from gradtx._state.shardings import SlotLayout, slot_layouts, state_shardings
from gradtx._state.state_dict import (
    LoadReport,
    StateMismatchError,
    load_state_dict,
    reconcile,
    state_dict,
)
from gradtx._state.stats import stats
from gradtx._transforms.adagrad import scale_by_adadelta, scale_by_rss
from gradtx._transforms.adam import scale_by_adam
from gradtx._transforms.adam_variants import (
    scale_by_adamax,
    scale_by_adan,
    scale_by_amsgrad,
    scale_by_belief,
    scale_by_radam,
    scale_by_yogi,
)
from gradtx._transforms.adaptive_clipping import adaptive_grad_clip, unitwise_clip, unitwise_norm
from gradtx._transforms.apply_every import apply_every
from gradtx._transforms.averaging import ema
from gradtx._transforms.backtracking_linesearch import scale_by_backtracking_linesearch
from gradtx._transforms.block_rms import (
    clip_by_block_rms,
    scale_by_param_block_norm,
    scale_by_param_block_rms,
)
from gradtx._transforms.centering import centralize
from gradtx._transforms.clipping import clip, clip_by_global_norm, global_norm
from gradtx._transforms.distance_over_gradients import scale_by_distance_over_gradients
from gradtx._transforms.factored import scale_by_factored_rms
from gradtx._transforms.guards import keep_params_nonnegative, zero_nans
from gradtx._transforms.lbfgs import scale_by_lbfgs
from gradtx._transforms.linesearch import value_and_grad_from_state
from gradtx._transforms.lion import scale_by_lion
from gradtx._transforms.momentum import trace
from gradtx._transforms.monitor import monitor
from gradtx._transforms.noise import add_noise
from gradtx._transforms.normalizing import normalize_by_update_norm
from gradtx._transforms.novograd import scale_by_novograd
from gradtx._transforms.optimistic import scale_by_optimistic_gradient
from gradtx._transforms.per_example_clipping import (
    per_example_global_norm_clip,
    per_example_layer_norm_clip,
)
from gradtx._transforms.polyak import scale_by_polyak
from gradtx._transforms.rms import scale_by_rms, scale_by_stddev
from gradtx._transforms.scale import (
    identity,
    scale,
    scale_by_learning_rate,
    scale_by_schedule,
    scale_gradient,
    set_to_zero,
)
from gradtx._transforms.sign import scale_by_rprop, scale_by_sign
from gradtx._transforms.sm3 import scale_by_sm3
from gradtx._transforms.stateless import stateless, stateless_with_tree_map
from gradtx._transforms.target_updates import incremental_update, periodic_update
from gradtx._transforms.trust_ratio import scale_by_trust_ratio
from gradtx._transforms.weight_decay import add_decayed_weights
from gradtx._transforms.zoom_linesearch import scale_by_zoom_linesearch

__version__ = "0.1.0"

__all__ = [
    "LoadReport",
    "Packed",
    "RestoreReport",
    "SlotLayout",
    "StateMismatchError",
    "Transformation",
    "accumulate",
    "adabelief",
    "adadelta",
    "adafactor",
    "adagrad",
    "adam",
    "adamax",
    "adamaxw",
    "adamw",
    "adan",
    "adaptive_grad_clip",
    "add_decayed_weights",
    "add_noise",
    "amsgrad",
    "apply_every",
    "apply_if_finite",
    "apply_updates",
    "bucketed",
    "centralize",
    "chain",
    "contrib",
    "explain",
    "freeze",
    "from_optax",
    "hyperparams",
    "inject_hyperparams",
    "masked",
    "monitor",
    "multi_transform",
    "partition",
    "reset",
    "restore",
    "selective_transform",
    "set_hyperparams",
    "trainable",
    "clip",
    "clip_by_block_rms",
    "clip_by_global_norm",
    "conditionally_mask",
    "conditionally_transform",
    "ema",
    "ema_params",
    "eval_params",
    "fromage",
    "global_norm",
    "has_updated",
    "identity",
    "incremental_update",
    "keep_params_nonnegative",
    "lamb",
    "lars",
    "lbfgs",
    "lion",
    "load_state_dict",
    "lookahead",
    "multi_steps",
    "nadam",
    "nadamw",
    "named_chain",
    "nesterov",
    "noisy_sgd",
    "normalize_by_update_norm",
    "novograd",
    "optimistic_adam",
    "optimistic_gradient_descent",
    "pack",
    "per_example_global_norm_clip",
    "per_example_layer_norm_clip",
    "periodic_update",
    "paths",
    "polyak_sgd",
    "projections",
    "radam",
    "reconcile",
    "rmsprop",
    "rprop",
    "save",
    "scale",
    "scale_by_adadelta",
    "scale_by_adam",
    "scale_by_adamax",
    "scale_by_adan",
    "scale_by_amsgrad",
    "scale_by_backtracking_linesearch",
    "scale_by_belief",
    "scale_by_distance_over_gradients",
    "scale_by_factored_rms",
    "scale_by_lbfgs",
    "scale_by_learning_rate",
    "scale_by_lion",
    "scale_by_novograd",
    "scale_by_optimistic_gradient",
    "scale_by_param_block_norm",
    "scale_by_param_block_rms",
    "scale_by_polyak",
    "scale_by_radam",
    "scale_by_rms",
    "scale_by_rprop",
    "scale_by_rss",
    "scale_by_schedule",
    "scale_by_sign",
    "scale_by_sm3",
    "scale_by_stddev",
    "scale_by_trust_ratio",
    "scale_by_yogi",
    "scale_by_zoom_linesearch",
    "scale_gradient",
    "schedule_free",
    "schedule_free_adamw",
    "schedule_free_sgd",
    "schedules",
    "set_to_zero",
    "sgd",
    "sign_sgd",
    "signum",
    "skip_large_updates",
    "skip_not_finite",
    "slot_layouts",
    "sm3",
    "state_dict",
    "state_shardings",
    "stateless",
    "stateless_with_tree_map",
    "stats",
    "trace",
    "tree",
    "tree_map_params",
    "unitwise_clip",
    "unitwise_norm",
    "value_and_grad_from_state",
    "without_statistics",
    "yogi",
    "zero_nans",
]
