"""The registry's `Entry`: one registered transformation, built from one scalar.

Also the masks and hyperparameter conventions the entries share (`_f`, `is_w`,
`optax_w_mask`, `LR_SWEEP`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import references as ref


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
