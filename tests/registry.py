"""The registry of every public transformation and optimizer, for the contract suite.

Each `Entry` builds its transformation from one scalar (`make(scalar)`, the learning rate or
the transformation's main hyperparameter), so tests can build it from a traced value inside a
jitted step or under `jax.vmap`. A new transformation ships only by adding an entry here;
`test_contract.py` fails when a public name of `gradtx.__all__` has none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
import references as ref

import gradtx
from gradtx import schedules

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
        # Layouts of the state over devices (tests/test_sharding_*.py).
        "state_shardings",
        "slot_layouts",
        "SlotLayout",
        # A layout, not an algorithm: test_contract checks bucketed(entry) against every entry.
        "bucketed",
        # Functions of trees: tests/core/test_functional_helpers.py, tests/test_projections.py.
        "has_updated",
        "skip_not_finite",
        "skip_large_updates",
        "incremental_update",
        "periodic_update",
        "tree_map_params",
        "projections",
        # Reads a line search's value and gradient from the state (transforms/test_lbfgs.py).
        "value_and_grad_from_state",
        # Rebuilds a transformation without its statistics (tests/state/test_without_statistics.py).
        "without_statistics",
        # AGC's helpers on arrays (tests/transforms/test_catalogue_round_two.py).
        "unitwise_norm",
        "unitwise_clip",
    }
)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One registered transformation.

    Attributes:
        id: readable test id.
        name: the public gradtx name the entry covers.
        make: `scalar -> transformation`; the scalar may be a traced value.
        reference: `scalar -> references.Reference`, the independent NumPy version.
        oracle: `scalar -> optax transformation` with the same algorithm, or None.
        scalar: the default scalar (a learning rate that converges where `converges`).
        sweep: three scalar values for hyperparameter sweeps.
        converges: a descent method: minimises a quadratic when the updates are applied.
        needs_params: `update` needs the params.
        uses_scalar: the scalar changes the transformation (False for identity, set_to_zero).
        with_state_dtype: `(scalar, dtype) -> transformation` with its state in `dtype`
            (mu_dtype/nu_dtype/accumulator_dtype), or None if there is no such option.
        packed: works on packed params (`gradtx.pack`); False where the transformation keeps
            per-array state a packed buffer cannot hold and refuses them with a clear error.
        reference_rtol, oracle_rtol, scan_rtol: tolerances of the NumPy reference, optax and
            `lax.scan` checks (defaults 1e-5, 1e-6, 1e-6).
    """

    id: str
    name: str
    make: Callable[[Any], Any]
    reference: Callable[[float], ref.Reference]
    oracle: Callable[[Any], Any] | None
    scalar: float
    sweep: tuple[float, float, float]
    converges: bool
    needs_params: bool = False
    uses_scalar: bool = True
    with_state_dtype: Callable[[Any, Any], Any] | None = None
    packed: bool = True
    # Float32 tolerances of the numeric checks (reference, optax, jit-vs-scan); an entry that
    # loosens one says why next to it (e.g. Newton-Schulz iterations amplify rounding).
    reference_rtol: float = 1e-5
    oracle_rtol: float = 1e-6
    scan_rtol: float = 1e-6

    def __str__(self) -> str:
        return self.id


def _f(x: float) -> np.float32:
    """optax is fed float32 hyperparameters, like gradtx stores them."""
    return np.float32(x)


def is_w(path: str) -> bool:
    """The reference's mask: paths whose last segment is `w` (what the glob `**/w` selects)."""
    return path.rsplit("/", 1)[-1] == "w"


def optax_w_mask(params: Any) -> Any:
    """The optax oracle's mask: a bool tree, True at leaves whose last key is `w`."""

    def leaf(kp: tuple, _: Any) -> bool:
        return getattr(kp[-1], "key", None) == "w"

    return jax.tree_util.tree_map_with_path(leaf, params)


LR_SWEEP = (0.02, 0.05, 0.1)


REGISTRY: tuple[Entry, ...] = (
    Entry(
        id="identity",
        name="identity",
        make=lambda s: gradtx.identity(),
        reference=lambda s: ref.identity(),
        oracle=lambda s: optax.identity(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        uses_scalar=False,
    ),
    Entry(
        id="set_to_zero",
        name="set_to_zero",
        make=lambda s: gradtx.set_to_zero(),
        reference=lambda s: ref.set_to_zero(),
        oracle=lambda s: optax.set_to_zero(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        uses_scalar=False,
    ),
    Entry(
        id="scale",
        name="scale",
        make=lambda s: gradtx.scale(s),
        reference=lambda s: ref.scale(s),
        oracle=lambda s: optax.scale(_f(s)),
        scalar=0.5,
        sweep=(0.25, 0.5, 2.0),
        converges=False,
    ),
    Entry(
        id="scale_by_learning_rate",
        name="scale_by_learning_rate",
        make=lambda lr: gradtx.scale_by_learning_rate(lr),
        reference=lambda lr: ref.scale_by_learning_rate(lr),
        oracle=lambda lr: optax.scale_by_learning_rate(_f(lr)),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
    ),
    Entry(
        id="scale_by_learning_rate-schedule",
        name="scale_by_learning_rate",
        make=lambda lr: gradtx.scale_by_learning_rate(schedules.linear(lr, 0.5 * lr, 10)),
        reference=lambda lr: ref.scale_by_learning_rate(
            ref.linear_schedule(lr, 0.5 * ref.f32(lr), 10)
        ),
        oracle=lambda lr: optax.scale_by_learning_rate(
            optax.linear_schedule(_f(lr), _f(0.5 * ref.f32(lr)), 10)
        ),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
    ),
    Entry(
        id="scale_by_schedule-cosine",
        name="scale_by_schedule",
        make=lambda s: gradtx.scale_by_schedule(schedules.cosine_decay(s, 10, alpha=0.1)),
        reference=lambda s: ref.scale_by_schedule(ref.cosine_decay_schedule(s, 10, 0.1)),
        oracle=lambda s: optax.scale_by_schedule(
            optax.cosine_decay_schedule(_f(s), 10, alpha=_f(0.1))
        ),
        scalar=0.5,
        sweep=(0.25, 0.5, 2.0),
        converges=False,
    ),
    Entry(
        id="scale_by_adam",
        name="scale_by_adam",
        make=lambda b1: gradtx.scale_by_adam(b1=b1),
        reference=lambda b1: ref.scale_by_adam(b1=b1),
        oracle=lambda b1: optax.scale_by_adam(b1=_f(b1), b2=_f(0.999), eps=_f(1e-8)),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        with_state_dtype=lambda b1, dt: gradtx.scale_by_adam(b1=b1, mu_dtype=dt, nu_dtype=dt),
    ),
    Entry(
        id="scale_by_adam-nesterov",
        name="scale_by_adam",
        make=lambda b1: gradtx.scale_by_adam(b1=b1, nesterov=True),
        reference=lambda b1: ref.scale_by_adam(b1=b1, nesterov=True),
        oracle=lambda b1: optax.scale_by_adam(b1=_f(b1), b2=_f(0.999), eps=_f(1e-8), nesterov=True),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        with_state_dtype=lambda b1, dt: gradtx.scale_by_adam(
            b1=b1, mu_dtype=dt, nu_dtype=dt, nesterov=True
        ),
    ),
    Entry(
        id="scale_by_adam-eps_root",
        name="scale_by_adam",
        make=lambda eps_root: gradtx.scale_by_adam(b2=0.99, eps=1e-6, eps_root=eps_root),
        reference=lambda eps_root: ref.scale_by_adam(b2=0.99, eps=1e-6, eps_root=eps_root),
        oracle=lambda eps_root: optax.scale_by_adam(
            b1=_f(0.9), b2=_f(0.99), eps=_f(1e-6), eps_root=_f(eps_root)
        ),
        scalar=0.01,
        sweep=(1e-3, 1e-2, 1e-1),
        converges=False,
        with_state_dtype=lambda eps_root, dt: gradtx.scale_by_adam(
            b2=0.99, eps=1e-6, eps_root=eps_root, mu_dtype=dt, nu_dtype=dt
        ),
    ),
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
        id="add_decayed_weights",
        name="add_decayed_weights",
        make=lambda wd: gradtx.add_decayed_weights(wd),
        reference=lambda wd: ref.add_decayed_weights(wd),
        oracle=lambda wd: optax.add_decayed_weights(_f(wd)),
        scalar=0.1,
        sweep=(0.01, 0.1, 0.5),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="add_decayed_weights-mask",
        name="add_decayed_weights",
        make=lambda wd: gradtx.add_decayed_weights(wd, mask="**/w"),
        reference=lambda wd: ref.add_decayed_weights(wd, mask=is_w),
        oracle=lambda wd: optax.add_decayed_weights(_f(wd), mask=optax_w_mask),
        scalar=0.1,
        sweep=(0.01, 0.1, 0.5),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="clip",
        name="clip",
        make=lambda m: gradtx.clip(m),
        reference=lambda m: ref.clip(m),
        oracle=lambda m: optax.clip(_f(m)),
        scalar=0.5,
        sweep=(0.25, 0.5, 1.0),
        converges=False,
    ),
    Entry(
        id="clip_by_global_norm",
        name="clip_by_global_norm",
        make=lambda m: gradtx.clip_by_global_norm(m),
        reference=lambda m: ref.clip_by_global_norm(m),
        oracle=lambda m: optax.clip_by_global_norm(_f(m)),
        scalar=2.0,
        sweep=(1.0, 2.0, 100.0),
        converges=False,
    ),
    Entry(
        id="chain-clip-trace-scale",
        name="chain",
        make=lambda lr: gradtx.chain(
            gradtx.clip_by_global_norm(2.0), gradtx.trace(0.9), gradtx.scale(-lr)
        ),
        reference=lambda lr: ref.chain(
            ref.clip_by_global_norm(2.0), ref.trace(0.9), ref.scale(-ref.f32(lr))
        ),
        oracle=lambda lr: optax.chain(
            optax.clip_by_global_norm(_f(2.0)), optax.trace(_f(0.9)), optax.scale(-_f(lr))
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
    ),
    Entry(
        id="named_chain-clip-adam",
        name="named_chain",
        make=lambda lr: gradtx.named_chain(("clip", gradtx.clip(0.5)), ("opt", gradtx.adam(lr))),
        reference=lambda lr: ref.chain(ref.clip(0.5), ref.adam(lr)),
        oracle=lambda lr: optax.chain(
            optax.clip(_f(0.5)), optax.adam(_f(lr), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8))
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.named_chain(
            ("clip", gradtx.clip(0.5)), ("opt", gradtx.adam(lr, mu_dtype=dt, nu_dtype=dt))
        ),
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
        id="adam",
        name="adam",
        make=lambda lr: gradtx.adam(lr),
        reference=lambda lr: ref.adam(lr),
        oracle=lambda lr: optax.adam(_f(lr), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8)),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.adam(lr, mu_dtype=dt, nu_dtype=dt),
    ),
    Entry(
        id="adam-schedule",
        name="adam",
        make=lambda lr: gradtx.adam(schedules.cosine_decay(lr, 15, alpha=0.5)),
        reference=lambda lr: ref.adam(ref.cosine_decay_schedule(lr, 15, 0.5)),
        oracle=lambda lr: optax.adam(
            optax.cosine_decay_schedule(_f(lr), 15, alpha=_f(0.5)),
            b1=_f(0.9),
            b2=_f(0.999),
            eps=_f(1e-8),
        ),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
    ),
    Entry(
        id="adamw-mask",
        name="adamw",
        make=lambda lr: gradtx.adamw(lr, weight_decay=0.1, mask="**/w"),
        reference=lambda lr: ref.adamw(lr, weight_decay=0.1, mask=is_w),
        oracle=lambda lr: optax.adamw(
            _f(lr),
            b1=_f(0.9),
            b2=_f(0.999),
            eps=_f(1e-8),
            weight_decay=_f(0.1),
            mask=optax_w_mask,
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: gradtx.adamw(
            lr, weight_decay=0.1, mask="**/w", mu_dtype=dt, nu_dtype=dt
        ),
    ),
)

# The optimizer catalogue keeps its entries in files of its own (they import `Entry` from here).
from registry_adaptive import ADAPTIVE  # noqa: E402
from registry_misc import MISC  # noqa: E402
from registry_per_leaf import PER_LEAF  # noqa: E402
from registry_wrappers import WRAPPERS  # noqa: E402

REGISTRY = REGISTRY + ADAPTIVE + MISC
REGISTRY = REGISTRY + PER_LEAF
REGISTRY = REGISTRY + WRAPPERS
from registry_combinators import COMBINATORS  # noqa: E402
from registry_contrib import CONTRIB  # noqa: E402

REGISTRY = REGISTRY + CONTRIB
from registry_contrib_two import CONTRIB_TWO  # noqa: E402

REGISTRY = REGISTRY + CONTRIB_TWO
from registry_contrib_three import CONTRIB_THREE  # noqa: E402

REGISTRY = REGISTRY + CONTRIB_THREE
from registry_schedule_free import SCHEDULE_FREE  # noqa: E402

REGISTRY = REGISTRY + SCHEDULE_FREE
from registry_lbfgs import LBFGS  # noqa: E402

REGISTRY = REGISTRY + LBFGS
from registry_catalogue import CATALOGUE  # noqa: E402

REGISTRY = REGISTRY + CATALOGUE
REGISTRY = REGISTRY + COMBINATORS
from registry_helpers import HELPERS  # noqa: E402

REGISTRY = REGISTRY + HELPERS

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
    subpackage `contrib`; tests/test_contrib.py checks its own names)."""
    return {e.name.split(".")[0] for e in REGISTRY}
