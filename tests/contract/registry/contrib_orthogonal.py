"""Registry entries of gradtx.contrib's methods that act on matrices through orthogonal
factors: Muon and GaLore.

Where optax works on the whole tree only (its `scale_by_muon` orthogonalises every leaf), the
oracle restricts it to the 2-D leaves with `optax.partition`. GaLore's entries keep the
default projector gap (200): the contract's 20 steps then use one SVD, and the update does not
depend on the signs of its singular vectors, which NumPy and JAX may choose differently.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
import optax.contrib
import references as ref
import references.contrib_orthogonal as ror

from gradtx import contrib, schedules
from registry.entry import LR_SWEEP, Entry, _f, is_w, optax_w_mask


class _OnMatrices:
    """An optax transformation run on the 2-D leaves only (as a flat dict), the others
    unchanged: the scope of gradtx's `scale_by_muon`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @staticmethod
    def _matrices(tree: Any) -> dict:
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        return {jax.tree_util.keystr(kp): x for kp, x in leaves if x.ndim == 2}

    def init(self, params: Any) -> Any:
        return self.inner.init(self._matrices(params))

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        out, state = self.inner.update(self._matrices(updates), state)  # dims: see oracle

        def pick(kp: Any, u: Any) -> Any:
            return out.get(jax.tree_util.keystr(kp), u)

        return jax.tree_util.tree_map_with_path(pick, updates), state


def _dims(updates: dict) -> dict:
    # optax's scale_by_muon needs explicit dimension numbers on a dict of matrices: its
    # default (None) fails in jax.tree.map for any tree with more than one leaf.
    return {k: optax.contrib.MuonDimensionNumbers() for k in updates}


def _optax_on_matrices(tx: Any) -> Any:
    return _OnMatrices(tx)


def _without_none(tree: Any) -> Any:
    """`tree` with its `None` entries of dicts dropped."""
    if isinstance(tree, dict):
        return {k: _without_none(v) for k, v in tree.items() if v is not None}
    if isinstance(tree, list):
        return [_without_none(v) for v in tree]
    return tree


def _with_none(tree: Any, like: Any) -> Any:
    """`tree` with the `None` entries of `like` put back."""
    if like is None:
        return None
    if isinstance(like, dict):
        return {k: _with_none(tree.get(k), v) for k, v in like.items()}
    if isinstance(like, list):
        return [_with_none(t, v) for t, v in zip(tree, like)]
    return tree


class OptaxWithoutNone:
    """An optax transformation that fails on `None` leaves (optax's GaLore maps over the
    params with `None` as a leaf) run on the tree without them."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def init(self, params: Any) -> Any:
        return self.inner.init(_without_none(params))

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        out, state = self.inner.update(_without_none(updates), state, _without_none(params))
        return _with_none(out, updates), state


def _optax_adam() -> Any:
    """optax's `scale_by_adam` with float32 hyperparameters (its Python-float defaults make
    `1 - b2` and the bias correction `1 - b2**t` round differently: 7e-6 on the first step)."""
    return optax.scale_by_adam(b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8))


ENTRIES: tuple[Entry, ...] = (
    # --- Muon (packed params refused: the math is per matrix) ---
    Entry(
        id="contrib.scale_by_muon",
        name="contrib.scale_by_muon",
        make=lambda beta: contrib.scale_by_muon(beta=beta),
        reference=lambda beta: ror.scale_by_muon(beta=beta),
        oracle=lambda beta: _optax_on_matrices(
            optax.contrib.scale_by_muon(beta=_f(beta), eps=_f(1e-8), weight_dimension_numbers=_dims)
        ),
        scalar=0.95,
        sweep=(0.5, 0.9, 0.95),
        converges=False,
        with_state_dtype=lambda beta, dt: contrib.scale_by_muon(beta=beta, mu_dtype=dt),
        packed=False,
        # Five Newton-Schulz iterations amplify rounding of the momentum by up to ~100x in
        # the directions of small singular values: optax (another order of operations) and
        # XLA's fusion inside lax.scan differ by a few 1e-6.
        oracle_rtol=1e-5,
        scan_rtol=1e-5,
    ),
    Entry(
        id="contrib.scale_by_muon-adaptive-no_nesterov",
        name="contrib.scale_by_muon",
        make=lambda beta: contrib.scale_by_muon(beta=beta, nesterov=False, adaptive=True),
        reference=lambda beta: ror.scale_by_muon(beta=beta, nesterov=False, adaptive=True),
        oracle=lambda beta: _optax_on_matrices(
            optax.contrib.scale_by_muon(
                beta=_f(beta),
                eps=_f(1e-8),
                nesterov=False,
                adaptive=True,
                weight_dimension_numbers=_dims,
            )
        ),
        scalar=0.9,
        sweep=(0.5, 0.9, 0.95),
        converges=False,
        packed=False,
        # Five Newton-Schulz iterations amplify rounding of the momentum by up to ~100x in
        # the directions of small singular values: optax (another order of operations) and
        # XLA's fusion inside lax.scan differ by a few 1e-6.
        oracle_rtol=1e-5,
        scan_rtol=1e-5,
    ),
    Entry(
        id="contrib.muon",
        name="contrib.muon",
        make=lambda lr: contrib.muon(lr),
        reference=lambda lr: ror.muon(lr),
        oracle=lambda lr: optax.contrib.muon(
            _f(lr), beta=_f(0.95), eps=_f(1e-8), adam_b1=_f(0.9), adam_b2=_f(0.999)
        ),
        scalar=0.05,
        sweep=(0.02, 0.05, 0.1),
        converges=True,
        needs_params=True,
        packed=False,
        # Five Newton-Schulz iterations amplify rounding of the momentum by up to ~100x in
        # the directions of small singular values: optax (another order of operations) and
        # XLA's fusion inside lax.scan differ by a few 1e-6.
        oracle_rtol=1e-5,
        scan_rtol=1e-5,
    ),
    Entry(
        id="contrib.muon-weight_decay-adam_schedule",
        name="contrib.muon",
        make=lambda wd: contrib.muon(
            0.02,
            weight_decay=wd,
            adam_weight_decay=0.05,
            adam_learning_rate=schedules.linear(0.05, 0.01, 10),
        ),
        reference=lambda wd: ror.muon(
            0.02,
            weight_decay=wd,
            adam_weight_decay=0.05,
            adam_learning_rate=ref.linear_schedule(0.05, 0.01, 10),
        ),
        oracle=lambda wd: optax.contrib.muon(
            _f(0.02),
            beta=_f(0.95),
            eps=_f(1e-8),
            weight_decay=_f(wd),
            adam_b1=_f(0.9),
            adam_b2=_f(0.999),
            adam_weight_decay=_f(0.05),
            adam_learning_rate=optax.linear_schedule(_f(0.05), _f(0.01), 10),
        ),
        scalar=0.1,
        sweep=(0.01, 0.1, 0.5),
        converges=False,
        needs_params=True,
        packed=False,
        # Five Newton-Schulz iterations amplify rounding of the momentum by up to ~100x in
        # the directions of small singular values: optax (another order of operations) and
        # XLA's fusion inside lax.scan differ by a few 1e-6.
        oracle_rtol=1e-5,
        scan_rtol=1e-5,
    ),
    # --- GaLore (packed params refused: the projection is per matrix) ---
    Entry(
        id="contrib.scale_by_galore",
        name="contrib.scale_by_galore",
        make=lambda s: contrib.scale_by_galore(rank=2, scale=s),
        reference=lambda s: ror.scale_by_galore(rank=2, scale=s),
        oracle=lambda s: OptaxWithoutNone(
            optax.contrib.scale_by_galore(rank=2, scale=_f(s), base_optimizer=_optax_adam())
        ),
        scalar=0.5,
        sweep=(0.25, 0.5, 2.0),
        converges=False,
        packed=False,
    ),
    Entry(
        id="contrib.galore-weight_decay-mask",
        name="contrib.galore",
        make=lambda lr: contrib.galore(lr, rank=2, weight_decay=0.01, mask="**/w"),
        reference=lambda lr: ror.galore(lr, weight_decay=0.01, mask=is_w, rank=2),
        oracle=lambda lr: OptaxWithoutNone(
            optax.contrib.galore(
                _f(lr),
                rank=2,
                base_optimizer=_optax_adam(),
                weight_decay=_f(0.01),
                mask=optax_w_mask,
            )
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=False,
        needs_params=True,
        packed=False,
    ),
)
