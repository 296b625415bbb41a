"""Registry entries of the optimizer catalogue (see `registry.Entry`): transformations whose
math needs each leaf's own shape (trust ratios, block RMS, factored moments, unit-wise and
per-example clipping) and their optimizers."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
import references as ref
import references_per_leaf as rpl
from registry import Entry, _f, is_w, optax_w_mask

import gradtx
from gradtx import schedules

LR_SWEEP = (0.02, 0.05, 0.1)

# --- per-example gradients: the contract passes one gradient, the wrapper makes a batch of it --

# Example i's gradient is EXAMPLE_SCALES[i] * g: norms |g|, |g| / 2, 3 |g| and a zero example
# (no negative scale: a sum that cancels would lose the precision the oracle check asks for).
EXAMPLE_SCALES = (1.0, 0.5, 3.0, 0.0)


def as_examples(grads: Any) -> Any:
    """A batch of per-example gradients (leading axis) made from one gradient tree."""

    def stack(g: Any) -> Any:
        return jnp.stack([(s * g.astype(jnp.float32)).astype(g.dtype) for s in EXAMPLE_SCALES])

    return jax.tree.map(stack, grads)


class FromOneGradient(gradtx.Transformation):
    """Runs `inner` (which takes per-example gradients) on `as_examples(updates)`."""

    name: ClassVar[str] = "from_one_gradient"
    inner: Any = None

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        return self.inner.update(as_examples(updates), state, params, **extra)


class OptaxPerExampleClip:
    """The oracle: optax's `per_example_global_norm_clip` function on the same batch."""

    def __init__(self, l2_norm_clip: Any) -> None:
        self.l2_norm_clip = l2_norm_clip

    def init(self, params: Any) -> Any:
        return optax.EmptyState()

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        summed, _ = optax.per_example_global_norm_clip(as_examples(updates), self.l2_norm_clip)
        return summed, state


def per_example_reference(l2_norm_clip: float) -> ref.Reference:
    inner = rpl.per_example_global_norm_clip(l2_norm_clip)

    def update(grads: dict, state: dict, params: dict) -> tuple[dict, dict]:
        examples = {
            p: np.stack([s * np.asarray(g) for s in EXAMPLE_SCALES]) for p, g in grads.items()
        }
        return inner.update(examples, state, params)

    return ref.Reference(inner.init, update)


# --- entries ------------------------------------------------------------------------------------


PER_LEAF: tuple[Entry, ...] = (
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
        id="clip_by_block_rms",
        name="clip_by_block_rms",
        make=lambda t: gradtx.clip_by_block_rms(t),
        reference=lambda t: rpl.clip_by_block_rms(t),
        oracle=lambda t: optax.clip_by_block_rms(_f(t)),
        scalar=0.8,
        sweep=(0.5, 0.8, 2.0),
        converges=False,
    ),
    Entry(
        id="adaptive_grad_clip",
        name="adaptive_grad_clip",
        make=lambda c: gradtx.adaptive_grad_clip(c),
        reference=lambda c: rpl.adaptive_grad_clip(c),
        oracle=lambda c: optax.adaptive_grad_clip(_f(c), _f(1e-3)),
        scalar=0.5,
        sweep=(0.1, 0.5, 2.0),
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
    Entry(
        id="per_example_global_norm_clip",
        name="per_example_global_norm_clip",
        make=lambda c: FromOneGradient(gradtx.per_example_global_norm_clip(c)),
        reference=per_example_reference,
        oracle=lambda c: OptaxPerExampleClip(_f(c)),
        scalar=2.0,
        sweep=(1.0, 4.0, 100.0),
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
)
