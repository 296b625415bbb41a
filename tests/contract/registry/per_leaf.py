"""Registry entries of the transformations whose math needs each leaf's own shape: trust
ratios (LARS, LAMB, Fromage), block RMS and block norms, factored moments (Adafactor), SM3,
NovoGrad and layer-wise DoG, with their optimizers. Their options are checked further in
tests/transforms/.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
import references as ref
import references.per_leaf as rpl

import gradtx
from gradtx import schedules
from registry.entry import LR_SWEEP, Entry, _f, is_w, optax_w_mask


def _as_vectors(tree: Any) -> Any:
    return jax.tree.map(lambda x: jnp.reshape(x, (1,)) if jnp.ndim(x) == 0 else x, tree)


class ScalarsAsVectors:
    """An optax oracle that fails on 0-d leaves (SM3 keeps one accumulator per axis, none for
    a scalar; L-DoG's sums have shape (1,)) sees each scalar as a vector of one element, which
    is what gradtx does with a scalar; its updates come back in the gradients' shapes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def init(self, params: Any) -> Any:
        return self.inner.init(_as_vectors(params))

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        with jax.numpy_rank_promotion("allow"):  # optax's L-DoG multiplies (1,) by the array
            new, state = self.inner.update(_as_vectors(updates), state, _as_vectors(params))
        return jax.tree.map(lambda u, g: jnp.reshape(u, jnp.shape(g)), new, updates), state


ENTRIES: tuple[Entry, ...] = (
    Entry(
        id="scale_by_novograd",
        name="scale_by_novograd",
        make=lambda b1: gradtx.scale_by_novograd(b1=b1),
        reference=lambda b1: rpl.scale_by_novograd(b1=b1),
        oracle=lambda b1: optax.scale_by_novograd(b1=_f(b1), b2=_f(0.25), eps=_f(1e-8)),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        packed=False,
    ),
    Entry(
        id="scale_by_novograd-weight_decay",
        name="scale_by_novograd",
        make=lambda wd: gradtx.scale_by_novograd(b2=0.5, eps=1e-6, weight_decay=wd),
        reference=lambda wd: rpl.scale_by_novograd(b2=0.5, eps=1e-6, weight_decay=wd),
        oracle=lambda wd: optax.scale_by_novograd(
            b1=_f(0.9), b2=_f(0.5), eps=_f(1e-6), weight_decay=_f(wd)
        ),
        scalar=0.1,
        sweep=(0.01, 0.1, 0.5),
        converges=False,
        needs_params=True,
        packed=False,
    ),
    Entry(
        id="novograd",
        name="novograd",
        make=lambda lr: gradtx.novograd(lr),
        reference=lambda lr: rpl.novograd(lr),
        oracle=lambda lr: optax.novograd(_f(lr), b1=_f(0.9), b2=_f(0.25), eps=_f(1e-6)),
        scalar=0.01,
        sweep=(0.005, 0.01, 0.02),
        converges=True,
        packed=False,
    ),
    Entry(
        id="fromage",
        name="fromage",
        make=lambda lr: gradtx.fromage(lr),
        reference=lambda lr: rpl.fromage(lr),
        # a Python float: optax then computes 1/sqrt(1 + lr^2) - 1 in double precision
        oracle=lambda lr: optax.fromage(float(_f(lr))),
        scalar=0.01,
        sweep=(0.005, 0.01, 0.02),
        converges=True,
        needs_params=True,
    ),
    Entry(
        id="fromage-schedule",
        name="fromage",
        make=lambda lr: gradtx.fromage(schedules.linear(lr, 0.5 * lr, 10)),
        reference=lambda lr: rpl.fromage(ref.linear_schedule(lr, 0.5 * ref.f32(lr), 10)),
        oracle=None,  # optax's schedule branch is the same chain; the float one is checked
        scalar=0.01,
        sweep=(0.005, 0.01, 0.02),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="scale_by_trust_ratio",
        name="scale_by_trust_ratio",
        make=lambda c: gradtx.scale_by_trust_ratio(trust_coefficient=c),
        reference=lambda c: rpl.scale_by_trust_ratio(trust_coefficient=c),
        oracle=lambda c: optax.scale_by_trust_ratio(trust_coefficient=_f(c)),
        scalar=0.5,
        sweep=(0.1, 0.5, 2.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        # min_norm 1 clamps the norms of the small leaves; the mask leaves other paths alone.
        id="scale_by_trust_ratio-min_norm-eps-mask",
        name="scale_by_trust_ratio",
        make=lambda n: gradtx.scale_by_trust_ratio(min_norm=n, eps=0.1, mask="**/w"),
        reference=lambda n: rpl.scale_by_trust_ratio(min_norm=n, eps=0.1, mask=is_w),
        oracle=lambda n: optax.masked(
            optax.scale_by_trust_ratio(min_norm=_f(n), eps=_f(0.1)), optax_w_mask
        ),
        scalar=1.0,
        sweep=(0.5, 1.0, 3.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="scale_by_param_block_rms",
        name="scale_by_param_block_rms",
        make=lambda s: gradtx.scale_by_param_block_rms(s),
        reference=lambda s: rpl.scale_by_param_block_rms(s),
        oracle=lambda s: optax.scale_by_param_block_rms(_f(s)),
        scalar=0.8,
        sweep=(1e-3, 0.8, 2.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        # The contract's leaves are small: with the default size limit nothing is factored.
        id="scale_by_factored_rms",
        name="scale_by_factored_rms",
        make=lambda c: gradtx.scale_by_factored_rms(decay_rate=c),
        reference=lambda c: rpl.scale_by_factored_rms(c),
        oracle=lambda c: optax.scale_by_factored_rms(decay_rate=_f(c), epsilon=_f(1e-30)),
        scalar=0.8,
        sweep=(0.5, 0.8, 1.0),
        converges=False,
        packed=False,
    ),
    Entry(
        # Factored: enc/w (3, 4) and layers/0/w (2, 3); full v: the vectors and the scalar.
        id="scale_by_factored_rms-factored",
        name="scale_by_factored_rms",
        make=lambda c: gradtx.scale_by_factored_rms(decay_rate=c, min_dim_size_to_factor=2),
        reference=lambda c: rpl.scale_by_factored_rms(c, min_dim_size_to_factor=2),
        oracle=lambda c: optax.scale_by_factored_rms(
            decay_rate=_f(c), min_dim_size_to_factor=2, epsilon=_f(1e-30)
        ),
        scalar=0.8,
        sweep=(0.5, 0.8, 1.0),
        converges=False,
        packed=False,
    ),
    # --- optimizers ---
    Entry(
        id="lamb-mask",
        name="lamb",
        make=lambda lr: gradtx.lamb(lr, weight_decay=0.1, mask="**/w"),
        reference=lambda lr: rpl.lamb(lr, weight_decay=0.1, mask=is_w),
        oracle=lambda lr: optax.lamb(
            _f(lr), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-6), weight_decay=_f(0.1), mask=optax_w_mask
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: gradtx.lamb(
            lr, weight_decay=0.1, mask="**/w", mu_dtype=dt, nu_dtype=dt
        ),
    ),
    Entry(
        id="lamb-schedule",
        name="lamb",
        make=lambda lr: gradtx.lamb(schedules.cosine_decay(lr, 200, alpha=0.0)),
        reference=lambda lr: rpl.lamb(ref.cosine_decay_schedule(lr, 200, 0.0)),
        oracle=lambda lr: optax.lamb(
            optax.cosine_decay_schedule(_f(lr), 200, alpha=_f(0.0)),
            b1=_f(0.9),
            b2=_f(0.999),
            eps=_f(1e-6),
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
    ),
    Entry(
        id="lars-masks",
        name="lars",
        make=lambda lr: gradtx.lars(
            lr,
            weight_decay=0.1,
            weight_decay_mask="**/w",
            trust_coefficient=0.5,
            trust_ratio_mask="**/w",
        ),
        reference=lambda lr: rpl.lars(
            lr,
            weight_decay=0.1,
            weight_decay_mask=is_w,
            trust_coefficient=0.5,
            trust_ratio_mask=is_w,
        ),
        oracle=lambda lr: optax.lars(
            _f(lr),
            weight_decay=_f(0.1),
            weight_decay_mask=optax_w_mask,
            trust_coefficient=_f(0.5),
            eps=_f(0.0),
            trust_ratio_mask=optax_w_mask,
            momentum=_f(0.9),
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: gradtx.lars(
            lr,
            weight_decay=0.1,
            weight_decay_mask="**/w",
            trust_coefficient=0.5,
            trust_ratio_mask="**/w",
            accumulator_dtype=dt,
        ),
    ),
    Entry(
        id="lars-nesterov",
        name="lars",
        make=lambda lr: gradtx.lars(lr, trust_coefficient=0.1, eps=1e-3, nesterov=True),
        reference=lambda lr: rpl.lars(lr, trust_coefficient=0.1, eps=1e-3, nesterov=True),
        oracle=lambda lr: optax.lars(
            _f(lr), trust_coefficient=_f(0.1), eps=_f(1e-3), momentum=_f(0.9), nesterov=True
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
    ),
    Entry(
        id="adafactor",
        name="adafactor",
        make=lambda lr: gradtx.adafactor(lr, min_dim_size_to_factor=2),
        reference=lambda lr: rpl.adafactor(lr, min_dim_size_to_factor=2),
        oracle=lambda lr: optax.adafactor(
            _f(lr),
            min_dim_size_to_factor=2,
            decay_rate=_f(0.8),
            clipping_threshold=_f(1.0),
            eps=_f(1e-30),
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
        packed=False,
    ),
    Entry(
        id="adafactor-momentum-decay",
        name="adafactor",
        make=lambda lr: gradtx.adafactor(
            lr,
            min_dim_size_to_factor=2,
            momentum=0.9,
            dtype_momentum=None,
            weight_decay_rate=0.01,
            weight_decay_mask="**/w",
        ),
        reference=lambda lr: rpl.adafactor(
            lr,
            min_dim_size_to_factor=2,
            momentum=0.9,
            weight_decay_rate=0.01,
            weight_decay_mask=is_w,
        ),
        oracle=lambda lr: optax.adafactor(
            _f(lr),
            min_dim_size_to_factor=2,
            decay_rate=_f(0.8),
            clipping_threshold=_f(1.0),
            momentum=_f(0.9),
            dtype_momentum=None,
            weight_decay_rate=_f(0.01),
            eps=_f(1e-30),
            weight_decay_mask=optax_w_mask,
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
        packed=False,
    ),
    Entry(
        # b2 < 1: exponential averages of the cover sets' maxima (the sum is `sm3`'s entry).
        id="scale_by_sm3-b2",
        name="scale_by_sm3",
        make=lambda b1: gradtx.scale_by_sm3(b1=b1, b2=0.99),
        reference=lambda b1: rpl.scale_by_sm3(b1=b1, b2=0.99),
        oracle=lambda b1: ScalarsAsVectors(optax.scale_by_sm3(_f(b1), _f(0.99), _f(1e-8))),
        scalar=0.9,
        sweep=(0.0, 0.5, 0.9),
        converges=False,
        packed=False,
    ),
    Entry(
        id="sm3",
        name="sm3",
        make=lambda lr: gradtx.sm3(lr),
        reference=lambda lr: rpl.sm3(lr),
        oracle=lambda lr: ScalarsAsVectors(optax.sm3(_f(lr))),
        scalar=0.2,
        sweep=(0.1, 0.2, 0.4),
        converges=True,
        packed=False,
    ),
    Entry(
        id="scale_by_param_block_norm",
        name="scale_by_param_block_norm",
        make=lambda s: gradtx.scale_by_param_block_norm(s),
        reference=lambda s: rpl.scale_by_param_block_norm(s),
        oracle=lambda s: optax.scale_by_param_block_norm(_f(s)),
        scalar=1.0,
        sweep=(1e-3, 1.0, 3.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        # global_scale -1: the DoG step itself descends.
        id="scale_by_distance_over_gradients",
        name="scale_by_distance_over_gradients",
        make=lambda s: gradtx.scale_by_distance_over_gradients(1e-2, global_scale=s),
        reference=lambda s: rpl.scale_by_distance_over_gradients(1e-2, global_scale=s),
        oracle=lambda s: ScalarsAsVectors(
            optax.scale_by_distance_over_gradients(_f(1e-2), _f(1e-8), global_scale=_f(s))
        ),
        scalar=-1.0,
        sweep=(-2.0, -1.0, -0.5),
        converges=True,
        needs_params=True,
        packed=False,
    ),
)
