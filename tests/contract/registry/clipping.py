"""Registry entries of the clipping methods: `clip`, `clip_by_global_norm`,
`clip_by_block_rms`, adaptive gradient clipping, and per-example clipping of the global and of
each layer's norm (fed a batch made from one gradient, `registry.per_example`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optax
import references as ref
import references.clipping as rclip
import references.per_leaf as rpl

import gradtx
from registry.entry import Entry, _f
from registry.per_example import EXAMPLE_SCALES, FromOneGradient, as_examples, on_examples


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
    inner = rclip.per_example_global_norm_clip(l2_norm_clip)

    def update(grads: dict, state: dict, params: dict) -> tuple[dict, dict]:
        examples = {
            p: np.stack([s * np.asarray(g) for s in EXAMPLE_SCALES]) for p, g in grads.items()
        }
        return inner.update(examples, state, params)

    return ref.Reference(inner.init, update)


class OptaxPerExampleLayerClip:
    """The oracle: optax's `per_example_layer_norm_clip` function on the same batch."""

    def __init__(self, clip: Any, uniform: bool = True) -> None:
        self.clip, self.uniform = clip, uniform

    def init(self, params: Any) -> Any:
        return optax.EmptyState()

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        summed, _ = optax.per_example_layer_norm_clip(as_examples(updates), self.clip, self.uniform)
        return summed, state


ENTRIES: tuple[Entry, ...] = (
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
    Entry(
        id="per_example_layer_norm_clip",
        name="per_example_layer_norm_clip",
        make=lambda c: FromOneGradient(gradtx.per_example_layer_norm_clip(c)),
        reference=lambda c: on_examples(rclip.per_example_layer_norm_clip(c)),
        oracle=lambda c: OptaxPerExampleLayerClip(_f(c)),
        scalar=2.0,
        sweep=(1.0, 4.0, 100.0),
        converges=False,
        packed=False,
    ),
)
