"""The registry of every public transformation and optimizer, for the contract suite.

Each `Entry` (`registry.entry`) builds its transformation from one scalar (`make(scalar)`, the
learning rate or the transformation's main hyperparameter), so tests can build it from a traced
value inside a jitted step or under `jax.vmap`. The entries live in one module per algorithm
family, next to this one; `REGISTRY` is all of them. A new transformation ships only by adding
an entry to its family's module; `test_contract.py` fails when a public name of
`gradtx.__all__` has none.
"""

from __future__ import annotations

from registry import (
    adam_family,
    clipping,
    combinators,
    contrib_adam_family,
    contrib_lr_free,
    contrib_orthogonal,
    contrib_private,
    contrib_sam,
    contrib_second_order,
    gradient_edits,
    lbfgs,
    momentum,
    monitor,
    optimistic,
    per_leaf,
    polyak,
    rmsprop_family,
    scaling,
    schedule_free,
    sign,
    wrappers,
)
from registry.entry import LR_SWEEP, Entry, _f, is_w, optax_w_mask

__all__ = [
    "BY_ID",
    "CONTRIB",
    "LR_SWEEP",
    "NON_TRANSFORMATIONS",
    "PER_NAME",
    "REGISTRY",
    "Entry",
    "_f",
    "covered_names",
    "is_w",
    "optax_w_mask",
]

# Names of `gradtx.__all__` that are not transformations or optimizers.
NON_TRANSFORMATIONS = frozenset(
    {
        "paths",
        "schedules",
        "state_dict",
        "load_state_dict",
        "from_optax",
        "reconcile",
        "apply_updates",
        "Transformation",
        "LoadReport",
        "StateMismatchError",
        "global_norm",
        "scale_gradient",
        "tree",
        "pack",
        "Packed",
        "contrib",
        "explain",
        "hyperparams",
        "set_hyperparams",
        "reset",
        # A reading of the state, not a transformation (tests/state/test_eval_params.py).
        "eval_params",
        # Readings of the state and files (tests/state/test_stats.py, test_checkpoint.py).
        "stats",
        "save",
        "restore",
        "RestoreReport",
        # Layouts of the state over devices (tests/sharding/).
        "state_shardings",
        "slot_layouts",
        "SlotLayout",
        # A layout, not an algorithm: test_contract checks bucketed(entry) against every entry.
        "bucketed",
        # Functions of trees: tests/core/test_target_updates_stateless_and_map_params.py,
        # tests/projections/test_projections.py.
        "has_updated",
        "skip_not_finite",
        "skip_large_updates",
        "incremental_update",
        "periodic_update",
        "tree_map_params",
        "projections",
        # Reads a line search's value and gradient from the state (tests/transforms/test_lbfgs.py).
        "value_and_grad_from_state",
        # Rebuilds a transformation without its statistics (tests/state/test_without_statistics.py).
        "without_statistics",
        # AGC's helpers on arrays (tests/transforms/test_catalogue_transforms.py).
        "unitwise_norm",
        "unitwise_clip",
    }
)

# Every entry, family by family.
REGISTRY: tuple[Entry, ...] = (
    *scaling.ENTRIES,
    *momentum.ENTRIES,
    *adam_family.ENTRIES,
    *rmsprop_family.ENTRIES,
    *sign.ENTRIES,
    *polyak.ENTRIES,
    *optimistic.ENTRIES,
    *gradient_edits.ENTRIES,
    *monitor.ENTRIES,
    *clipping.ENTRIES,
    *per_leaf.ENTRIES,
    *combinators.ENTRIES,
    *wrappers.ENTRIES,
    *schedule_free.ENTRIES,
    *lbfgs.ENTRIES,
    *contrib_adam_family.ENTRIES,
    *contrib_lr_free.ENTRIES,
    *contrib_second_order.ENTRIES,
    *contrib_orthogonal.ENTRIES,
    *contrib_sam.ENTRIES,
    *contrib_private.ENTRIES,
)

# The entries of `gradtx.contrib` (names `contrib.<name>`), whatever their family.
CONTRIB: tuple[Entry, ...] = tuple(e for e in REGISTRY if e.name.startswith("contrib."))

BY_ID = {e.id: e for e in REGISTRY}


def _first_of_each_name(entries: tuple[Entry, ...]) -> tuple[Entry, ...]:
    seen: set[str] = set()
    return tuple(e for e in entries if not (e.name in seen or seen.add(e.name)))


# One entry per public name (the first registered), for the checks of the machinery every
# transformation shares: jit, vmap, scan and donation, files, devices. Every entry, options
# included, still runs the numeric checks (references, optax, bf16, `None` leaves, layouts),
# which are where an option changes what a transformation computes or keeps.
PER_NAME = _first_of_each_name(REGISTRY)


def covered_names() -> set[str]:
    """The public names that have at least one registry entry (`contrib.muon` counts for the
    subpackage `contrib`; tests/contrib/test_contrib.py checks its own names)."""
    return {e.name.split(".")[0] for e in REGISTRY}
