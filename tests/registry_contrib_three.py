"""Registry entries of gradtx.contrib (see `registry.Entry`): Simplified AdEMAMix, Sophia and
Hutchinson's estimator, GaLore, DP-SGD, `normalize` and `split_real_and_imaginary`, one entry
per public name.

Sophia and Hutchinson's estimator get the contract's quadratic as `obj_fn`; its Hessian is
diagonal, so Hutchinson's estimate is exact whatever the random signs, and the references and
optax (which draws other signs) agree with it. The DP entries take one gradient made into a
batch of per-example gradients (`registry_per_leaf.FromOneGradient`); their noise comes from
other random streams than optax's, so they have no oracle: tests/test_contrib_three.py
compares them with optax without noise. GaLore's entries keep the default projector gap
(200): the contract's 20 steps then use one SVD, and the update does not depend on the signs
of its singular vectors, which NumPy and JAX may choose differently.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import references as ref
import references_contrib_three as rc
from registry import Entry, _f, is_w, optax_w_mask
from registry_catalogue import on_examples
from registry_misc import _curvature, contract_loss
from registry_per_leaf import FromOneGradient

import gradtx
from gradtx import contrib, schedules

LR_SWEEP = (0.02, 0.05, 0.1)


def contract_hessian_diagonal(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The diagonal of the contract quadratic's Hessian: the curvatures, as float32 numbers
    (the quadratic is computed in float32)."""
    out = {}
    for path, p in params.items():
        a = np.asarray(_curvature(np.size(p)), np.float32).astype(np.float64)
        out[path] = a.reshape(np.shape(p))
    return out


def contract_loss_of_real_view(params: Any) -> jax.Array:
    """The contract quadratic of the params with each complex leaf as its real view
    `stack([re, im])` (tests/layouts/test_complex.py: a real objective of complex params)."""

    def real(x: Any) -> Any:
        return jnp.stack([x.real, x.imag]) if jnp.iscomplexobj(x) else x

    return contract_loss(jax.tree.map(real, params))


class WithObjective(gradtx.Transformation):
    """Runs `inner` with `obj_fn=objective` (the contract's quadratic): the contract calls
    `update` without the objective, which Sophia's Hessian estimate needs."""

    name: ClassVar[str] = "with_objective"
    inner: Any = None
    objective: Any = contract_loss  # a function: static structure

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        return self.inner.update(updates, state, params, **{**extra, "obj_fn": self.objective})


class OptaxWithObjective:
    """The optax oracle, given the same objective."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        return self.inner.update(updates, state, params, obj_fn=contract_loss)


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


# A sign-descent start (no Hessian estimate yet: every step is clipped to the learning rate),
# then Newton-like steps once h approaches the curvature (b2 = 0.9, gamma = 1).
SOPHIA = {"b2": 0.9, "gamma": 1.0, "update_interval": 3}


CONTRIB_THREE: tuple[Entry, ...] = (
    # --- Simplified AdEMAMix ---
    Entry(
        id="contrib.scale_by_simplified_ademamix-schedule",
        name="contrib.scale_by_simplified_ademamix",
        make=lambda alpha: contrib.scale_by_simplified_ademamix(
            b1=0.9, alpha=schedules.linear(0.0, alpha, 10), eps_root=1e-8
        ),
        reference=lambda alpha: rc.scale_by_simplified_ademamix(
            b1=0.9, alpha=ref.linear_schedule(0.0, alpha, 10), eps_root=1e-8
        ),
        oracle=lambda alpha: optax.contrib.scale_by_simplified_ademamix(
            b1=_f(0.9),
            b2=_f(0.95),
            alpha=optax.linear_schedule(_f(0.0), _f(alpha), 10),
            eps=_f(1e-8),
            eps_root=_f(1e-8),
        ),
        scalar=2.0,
        sweep=(1.0, 2.0, 5.0),
        converges=False,
        # m is an undamped sum of gradients: where m + alpha g nearly cancels (the scalar
        # leaf at step 15) float32 rounding of the terms is 2e-6 of the result, in optax too.
        oracle_rtol=1e-5,
    ),
    Entry(
        id="contrib.simplified_ademamix-mask",
        name="contrib.simplified_ademamix",
        make=lambda lr: contrib.simplified_ademamix(
            lr, b1=0.9, alpha=1.0, weight_decay=0.01, mask="**/w"
        ),
        reference=lambda lr: rc.simplified_ademamix(
            lr, b1=0.9, alpha=1.0, weight_decay=0.01, mask=is_w
        ),
        oracle=lambda lr: optax.contrib.simplified_ademamix(
            _f(lr),
            b1=_f(0.9),
            b2=_f(0.95),
            alpha=_f(1.0),
            eps=_f(1e-8),
            eps_root=_f(0.0),
            weight_decay=_f(0.01),
            mask=optax_w_mask,
        ),
        scalar=0.005,
        sweep=(0.002, 0.005, 0.01),
        converges=True,
        needs_params=True,
    ),
    # --- Sophia (the contract's quadratic as the objective) ---
    Entry(
        id="contrib.hutchinson_estimator_diag_hessian",
        name="contrib.hutchinson_estimator_diag_hessian",
        make=lambda s: WithObjective(contrib.hutchinson_estimator_diag_hessian(3)),
        reference=lambda s: rc.hessian_diagonal(contract_hessian_diagonal),
        oracle=lambda s: OptaxWithObjective(optax.contrib.hutchinson_estimator_diag_hessian()),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        needs_params=True,
        uses_scalar=False,
        packed=False,
    ),
    Entry(
        id="contrib.scale_by_sophia-no_clipping",
        name="contrib.scale_by_sophia",
        make=lambda b1: WithObjective(
            contrib.scale_by_sophia(b1=b1, clip_threshold=None, eps=1e-3, **SOPHIA)
        ),
        reference=lambda b1: rc.scale_by_sophia(
            contract_hessian_diagonal, b1=b1, clip_threshold=None, eps=1e-3, **SOPHIA
        ),
        oracle=lambda b1: OptaxWithObjective(
            optax.contrib._sophia.scale_by_sophia(
                b1=_f(b1),
                b2=_f(0.9),
                eps=_f(1e-3),
                gamma=_f(1.0),
                clip_threshold=None,
                update_interval=3,
            )
        ),
        scalar=0.9,
        sweep=(0.5, 0.9, 0.965),
        converges=False,
        needs_params=True,
        packed=False,
    ),
    Entry(
        id="contrib.sophia",
        name="contrib.sophia",
        make=lambda lr: WithObjective(contrib.sophia(lr, **SOPHIA)),
        reference=lambda lr: rc.sophia(lr, contract_hessian_diagonal, **SOPHIA),
        oracle=lambda lr: OptaxWithObjective(
            optax.contrib.sophia(
                _f(lr),
                b1=_f(0.965),
                b2=_f(0.9),
                eps=_f(1e-8),
                weight_decay=_f(1e-4),
                gamma=_f(1.0),
                clip_threshold=_f(1.0),
                update_interval=3,
            )
        ),
        scalar=0.5,
        sweep=(0.2, 0.5, 0.8),
        converges=True,
        needs_params=True,
        packed=False,
    ),
    # --- GaLore (packed params refused: the projection is per matrix) ---
    Entry(
        id="contrib.scale_by_galore",
        name="contrib.scale_by_galore",
        make=lambda s: contrib.scale_by_galore(rank=2, scale=s),
        reference=lambda s: rc.scale_by_galore(rank=2, scale=s),
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
        reference=lambda lr: rc.galore(lr, weight_decay=0.01, mask=is_w, rank=2),
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
    # --- DP-SGD (per-example gradients made from one gradient; no oracle: other streams) ---
    Entry(
        id="contrib.differentially_private_aggregate",
        name="contrib.differentially_private_aggregate",
        make=lambda c: FromOneGradient(contrib.differentially_private_aggregate(c, 0.5, key=3)),
        reference=lambda c: on_examples(rc.differentially_private_aggregate(c, 0.5, key=3)),
        oracle=None,
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=False,
        packed=False,
    ),
    Entry(
        id="contrib.dpsgd-momentum",
        name="contrib.dpsgd",
        make=lambda lr: FromOneGradient(contrib.dpsgd(lr, 1.0, 0.1, seed=3, momentum=0.9)),
        reference=lambda lr: on_examples(rc.dpsgd(lr, 1.0, 0.1, seed=3, momentum=0.9)),
        oracle=None,
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        packed=False,
    ),
    # --- normalize, split_real_and_imaginary ---
    Entry(
        id="contrib.normalize",
        name="contrib.normalize",
        make=lambda s: contrib.normalize(),
        reference=lambda s: rc.normalize(),
        oracle=lambda s: optax.contrib.normalize(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        uses_scalar=False,
    ),
    Entry(
        # On real params the split changes nothing: complex params are checked against optax
        # and against gradtx's own pairs of reals in tests/test_contrib_three.py.
        id="contrib.split_real_and_imaginary-adam",
        name="contrib.split_real_and_imaginary",
        make=lambda lr: contrib.split_real_and_imaginary(gradtx.adam(lr)),
        reference=lambda lr: ref.adam(lr),
        oracle=lambda lr: optax.contrib.split_real_and_imaginary(
            optax.adam(_f(lr), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8))
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
    ),
)
