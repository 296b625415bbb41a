"""Registry entries of `gradtx.contrib` (see `registry.Entry`); names read `contrib.<name>`.

Oracles use optax.contrib with the same float32 hyperparameters. Where an optax function
works on the whole tree only (optax's `scale_by_muon` orthogonalises every leaf), the oracle
restricts it to the 2-D leaves with `optax.partition`.
"""

from __future__ import annotations

from typing import Any

import jax
import optax
import optax.contrib
import references as ref
import references_contrib as rc
from optax.contrib import _dog as optax_dog
from registry import Entry, _f, is_w, optax_w_mask

import gradtx
from gradtx import contrib, schedules

LR_SWEEP = (0.02, 0.05, 0.1)


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


def _optax_sam(outer: Any, rho: float, sync_period: int = 2, reset_state: bool = True) -> Any:
    adversary = optax.chain(optax.normalize_by_update_norm(_f(1.0), _f(1e-6)), optax.sgd(_f(rho)))
    return optax.contrib.sam(outer, adversary, sync_period=sync_period, reset_state=reset_state)


def _sam(outer: Any, rho: Any, sync_period: int = 2, reset_state: bool = True) -> Any:
    adversary = gradtx.chain(gradtx.normalize_by_update_norm(), gradtx.sgd(rho))
    return contrib.sam(outer, adversary, sync_period=sync_period, reset_state=reset_state)


CONTRIB: tuple[Entry, ...] = (
    # --- ADOPT ---
    Entry(
        id="contrib.scale_by_adopt",
        name="contrib.scale_by_adopt",
        make=lambda b1: contrib.scale_by_adopt(b1=b1),
        reference=lambda b1: rc.scale_by_adopt(b1=b1),
        oracle=lambda b1: optax.contrib.scale_by_adopt(b1=_f(b1), b2=_f(0.9999), eps=_f(1e-6)),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
    ),
    Entry(
        id="contrib.scale_by_adopt-nesterov-no_clipping",
        name="contrib.scale_by_adopt",
        make=lambda b2: contrib.scale_by_adopt(b2=b2, nesterov=True, use_clipping=False),
        reference=lambda b2: rc.scale_by_adopt(b2=b2, nesterov=True, use_clipping=False),
        oracle=lambda b2: optax.contrib.scale_by_adopt(
            b1=_f(0.9), b2=_f(b2), eps=_f(1e-6), nesterov=True, use_clipping=False
        ),
        scalar=0.99,
        sweep=(0.9, 0.99, 0.999),
        converges=False,
    ),
    Entry(
        id="contrib.adopt",
        name="contrib.adopt",
        make=lambda lr: contrib.adopt(lr),
        reference=lambda lr: rc.adopt(lr),
        oracle=lambda lr: optax.contrib.adopt(_f(lr), b1=_f(0.9), b2=_f(0.9999), eps=_f(1e-6)),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
    ),
    # --- AdEMAMix ---
    Entry(
        id="contrib.scale_by_ademamix",
        name="contrib.scale_by_ademamix",
        make=lambda alpha: contrib.scale_by_ademamix(b3=0.99, alpha=alpha),
        reference=lambda alpha: rc.scale_by_ademamix(b3=0.99, alpha=alpha),
        oracle=lambda alpha: optax.contrib.scale_by_ademamix(
            b1=_f(0.9), b2=_f(0.999), b3=_f(0.99), alpha=_f(alpha), eps=_f(1e-8)
        ),
        scalar=5.0,
        sweep=(2.0, 5.0, 8.0),
        converges=False,
        with_state_dtype=lambda alpha, dt: contrib.scale_by_ademamix(
            b3=0.99, alpha=alpha, mu_dtype=dt
        ),
    ),
    Entry(
        id="contrib.scale_by_ademamix-schedules",
        name="contrib.scale_by_ademamix",
        make=lambda alpha: contrib.scale_by_ademamix(
            b3=schedules.linear(0.9, 0.99, 10), alpha=schedules.linear(0.0, alpha, 10)
        ),
        reference=lambda alpha: rc.scale_by_ademamix(
            b3=ref.linear_schedule(0.9, 0.99, 10), alpha=ref.linear_schedule(0.0, alpha, 10)
        ),
        oracle=lambda alpha: optax.contrib.scale_by_ademamix(
            b1=_f(0.9),
            b2=_f(0.999),
            b3=optax.linear_schedule(_f(0.9), _f(0.99), 10),
            alpha=optax.linear_schedule(_f(0.0), _f(alpha), 10),
            eps=_f(1e-8),
        ),
        scalar=5.0,
        sweep=(2.0, 5.0, 8.0),
        converges=False,
    ),
    Entry(
        id="contrib.ademamix-mask",
        name="contrib.ademamix",
        make=lambda lr: contrib.ademamix(lr, b3=0.99, weight_decay=0.01, mask="**/w"),
        reference=lambda lr: rc.ademamix(lr, b3=0.99, weight_decay=0.01, mask=is_w),
        oracle=lambda lr: optax.contrib.ademamix(
            _f(lr),
            b1=_f(0.9),
            b2=_f(0.999),
            b3=_f(0.99),
            alpha=_f(5.0),
            eps=_f(1e-8),
            weight_decay=_f(0.01),
            mask=optax_w_mask,
        ),
        scalar=0.02,
        sweep=(0.01, 0.02, 0.05),
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: contrib.ademamix(
            lr, b3=0.99, weight_decay=0.01, mask="**/w", mu_dtype=dt
        ),
    ),
    # --- COCOB ---
    Entry(
        id="contrib.scale_by_cocob",
        name="contrib.scale_by_cocob",
        make=lambda alpha: contrib.scale_by_cocob(alpha),
        reference=lambda alpha: rc.scale_by_cocob(alpha),
        oracle=lambda alpha: optax.contrib.scale_by_cocob(_f(alpha), _f(1e-8)),
        scalar=10.0,
        sweep=(5.0, 10.0, 50.0),
        converges=True,
        needs_params=True,
        # The reward feeds g * (x - x0) back: float32 rounding of the params compounds. At
        # alpha = 100 (tiny first steps) a float32 run drifts 3e-3 from the float64 reference
        # and 9e-5 from optax; alpha = 10 keeps the reference at 1e-5 (test_contrib checks
        # alpha = 100 step by step against the reference fed the same params).
        oracle_rtol=1e-5,
    ),
    Entry(
        id="contrib.cocob-weight_decay",
        name="contrib.cocob",
        make=lambda lr: contrib.cocob(lr, alpha=10.0, weight_decay=0.01),
        reference=lambda lr: rc.cocob(lr, alpha=10.0, weight_decay=0.01),
        oracle=lambda lr: optax.contrib.cocob(_f(lr), _f(10.0), _f(1e-8), _f(0.01)),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
        oracle_rtol=1e-5,  # see scale_by_cocob
    ),
    # --- D-Adaptation, Prodigy (global step-size estimates) ---
    Entry(
        id="contrib.dadapt_adamw",
        name="contrib.dadapt_adamw",
        make=lambda lr: contrib.dadapt_adamw(lr),
        reference=lambda lr: rc.dadapt_adamw(lr),
        oracle=lambda lr: optax.contrib.dadapt_adamw(
            _f(lr), betas=(_f(0.9), _f(0.999)), eps=_f(1e-8), estim_lr0=_f(1e-6)
        ),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
        # optax computes the bias corrections 1 - b**t in float32 directly, which loses digits
        # for b2 = 0.999 at small t (gradtx uses expm1): 3e-5 apart; the reference is at 1e-5.
        oracle_rtol=1e-4,
    ),
    Entry(
        id="contrib.dadapt_adamw-schedule-weight_decay",
        name="contrib.dadapt_adamw",
        make=lambda lr: contrib.dadapt_adamw(
            schedules.linear(lr, 0.5 * lr, 10), estim_lr0=1e-3, weight_decay=0.1
        ),
        reference=lambda lr: rc.dadapt_adamw(
            ref.linear_schedule(lr, 0.5 * ref.f32(lr), 10), estim_lr0=1e-3, weight_decay=0.1
        ),
        oracle=lambda lr: optax.contrib.dadapt_adamw(
            optax.linear_schedule(_f(lr), _f(0.5 * ref.f32(lr)), 10),
            betas=(_f(0.9), _f(0.999)),
            eps=_f(1e-8),
            estim_lr0=_f(1e-3),
            weight_decay=_f(0.1),
        ),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=False,
        needs_params=True,
        oracle_rtol=1e-4,  # see contrib.dadapt_adamw
    ),
    Entry(
        id="contrib.prodigy",
        name="contrib.prodigy",
        # With the default d0 = 1e-6 the first steps move the params by ~1e-6, below float32's
        # resolution of params near 1, so <g, x0 - x> (and with it d) is float32 noise at first
        # and no float32 run follows a float64 reference; d0 = 1e-2 is well conditioned.
        # test_contrib checks the default against optax and step by step against the reference.
        make=lambda lr: contrib.prodigy(lr, estim_lr0=1e-2),
        reference=lambda lr: rc.prodigy(lr, estim_lr0=1e-2),
        oracle=lambda lr: optax.contrib.prodigy(
            _f(lr), betas=(_f(0.9), _f(0.999)), eps=_f(1e-8), estim_lr0=_f(1e-2)
        ),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
        oracle_rtol=1e-4,  # see contrib.dadapt_adamw
        # d = max(d, r / |s|_1) with r a global sum with cancellations: the order XLA adds
        # in (eager vs inside lax.scan) moves d by a few 1e-6.
        scan_rtol=1e-5,
    ),
    Entry(
        id="contrib.prodigy-safeguard-beta3-weight_decay",
        name="contrib.prodigy",
        make=lambda wd: contrib.prodigy(
            schedules.linear(1.0, 0.5, 10),
            beta3=0.9,
            estim_lr0=1e-3,
            estim_lr_coef=2.0,
            weight_decay=wd,
            safeguard_warmup=True,
        ),
        reference=lambda wd: rc.prodigy(
            ref.linear_schedule(1.0, 0.5, 10),
            beta3=0.9,
            estim_lr0=1e-3,
            estim_lr_coef=2.0,
            weight_decay=wd,
            safeguard_warmup=True,
        ),
        oracle=lambda wd: optax.contrib.prodigy(
            optax.linear_schedule(_f(1.0), _f(0.5), 10),
            betas=(_f(0.9), _f(0.999)),
            beta3=_f(0.9),
            eps=_f(1e-8),
            estim_lr0=_f(1e-3),
            estim_lr_coef=_f(2.0),
            weight_decay=_f(wd),
            safeguard_warmup=True,
        ),
        scalar=0.1,
        sweep=(0.01, 0.1, 0.5),
        converges=False,
        needs_params=True,
        oracle_rtol=1e-4,  # see contrib.dadapt_adamw
    ),
    # --- DoG, DoWG ---
    Entry(
        id="contrib.scale_by_dog-heuristic",
        name="contrib.scale_by_dog",
        make=lambda eps: contrib.scale_by_dog(("heuristic", 1e-2), eps),
        reference=lambda eps: rc.scale_by_dog(("heuristic", 1e-2), eps),
        oracle=lambda eps: optax_dog.scale_by_dog(("heuristic", _f(1e-2)), _f(eps)),
        scalar=1e-8,
        sweep=(1e-8, 1.0, 10.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="contrib.scale_by_dog-learning_rate",
        name="contrib.scale_by_dog",
        make=lambda eps: contrib.scale_by_dog(("learning_rate", 0.1), eps),
        reference=lambda eps: rc.scale_by_dog(("learning_rate", 0.1), eps),
        oracle=lambda eps: optax_dog.scale_by_dog(("learning_rate", _f(0.1)), _f(eps)),
        scalar=1e-8,
        sweep=(1e-8, 1.0, 10.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="contrib.dog",
        name="contrib.dog",
        # r_eps = 1e-2 (1 + ||x0||): with the default 1e-6 the distance travelled is below
        # float32's resolution at first (see contrib.prodigy); test_contrib checks the default.
        make=lambda lr: contrib.dog(lr, ("heuristic", 1e-2)),
        reference=lambda lr: rc.dog(lr, ("heuristic", 1e-2)),
        oracle=lambda lr: optax.contrib.dog(_f(lr), ("heuristic", _f(1e-2)), _f(1e-8)),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
    ),
    Entry(
        id="contrib.dog-distance-weight_decay",
        name="contrib.dog",
        make=lambda wd: contrib.dog(1.0, ("distance", 0.1), weight_decay=wd, mask="**/w"),
        reference=lambda wd: ref.chain(
            ref.add_decayed_weights(wd, is_w), rc.dog(1.0, ("distance", 0.1))
        ),
        oracle=lambda wd: optax.contrib.dog(
            _f(1.0), ("distance", _f(0.1)), _f(1e-8), weight_decay=_f(wd), mask=optax_w_mask
        ),
        scalar=0.01,
        sweep=(0.01, 0.1, 0.5),
        converges=True,
        needs_params=True,
    ),
    Entry(
        id="contrib.scale_by_dowg",
        name="contrib.scale_by_dowg",
        make=lambda eps: contrib.scale_by_dowg(0.01, eps),
        reference=lambda eps: rc.scale_by_dowg(0.01, eps),
        oracle=lambda eps: optax_dog.scale_by_dowg(_f(0.01), _f(eps)),
        scalar=1e-4,
        sweep=(1e-4, 1.0, 10.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="contrib.dowg",
        name="contrib.dowg",
        make=lambda lr: contrib.dowg(lr, 1e-2),  # see contrib.dog
        reference=lambda lr: rc.dowg(lr, 1e-2),
        oracle=lambda lr: optax.contrib.dowg(_f(lr), _f(1e-2), _f(1e-4)),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
    ),
    # --- Muon (packed params refused: the math is per matrix) ---
    Entry(
        id="contrib.scale_by_muon",
        name="contrib.scale_by_muon",
        make=lambda beta: contrib.scale_by_muon(beta=beta),
        reference=lambda beta: rc.scale_by_muon(beta=beta),
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
        reference=lambda beta: rc.scale_by_muon(beta=beta, nesterov=False, adaptive=True),
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
        reference=lambda lr: rc.muon(lr),
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
        reference=lambda wd: rc.muon(
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
    # --- SAM ---
    Entry(
        id="contrib.sam-sgd",
        name="contrib.sam",
        make=lambda rho: _sam(gradtx.sgd(0.1), rho),
        reference=lambda rho: rc.sam_sgd(0.1, rho),
        oracle=lambda rho: _optax_sam(optax.sgd(_f(0.1)), rho),
        scalar=0.02,
        sweep=(0.01, 0.02, 0.05),
        converges=True,
        needs_params=True,
    ),
    Entry(
        # Momentum on both sides: the outer trace moves at the end of each cycle only, the
        # adversary's at every ascent step (not reset).
        id="contrib.sam-momentum-sync3-keep_state",
        name="contrib.sam",
        make=lambda lr: contrib.sam(
            gradtx.sgd(lr, momentum=0.9),
            gradtx.chain(gradtx.normalize_by_update_norm(), gradtx.sgd(0.02, momentum=0.5)),
            sync_period=3,
            reset_state=False,
        ),
        reference=lambda lr: rc.sam(
            ref.sgd(lr, momentum=0.9),
            ref.chain(rc.normalize_by_update_norm(1.0, 1e-6), ref.sgd(0.02, momentum=0.5)),
            sync_period=3,
            reset_state=False,
        ),
        oracle=lambda lr: optax.contrib.sam(
            optax.sgd(_f(lr), momentum=_f(0.9)),
            optax.chain(
                optax.normalize_by_update_norm(_f(1.0), _f(1e-6)),
                optax.sgd(_f(0.02), momentum=_f(0.5)),
            ),
            sync_period=3,
            reset_state=False,
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
    ),
)
