"""Normalising the updates to unit global norm (optax.contrib's `normalize`)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import compute_dtype, map_updates
from gradtx._core.per_array import PerArrayTransform
from gradtx._core.protocol import Params, Updates
from gradtx._transforms.clipping import global_norm


class Normalize(PerArrayTransform):
    """Divide all updates by their global norm (see `normalize`)."""

    name: ClassVar[str] = "normalize"

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """`u = g / ||g||`, the norm over every present leaf; a zero gradient stays zero."""
        self.check_state(state)
        norm = global_norm(updates)
        safe = jnp.where(norm > 0, norm, 1)

        def divided(g: Any, _: Any) -> Any:
            dtype = compute_dtype(g)
            return (g.astype(dtype) / safe.astype(dtype)).astype(g.dtype)

        return map_updates(divided, updates, owner=self.name), state


def normalize() -> Normalize:
    r"""Scale the updates to unit global norm.

    $$u = \frac{g}{\lVert g\rVert_2}$$

    with the norm taken over every present leaf together (a complex leaf counts as its pair
    of reals). A zero gradient stays zero, where optax divides 0 by 0 and gives NaN. It is
    `normalize_by_update_norm(scale_factor=1.0, eps=0.0)` but for that zero case; SAM uses it
    for its adversarial step.

    State:
        None (an empty dict).

    Examples:
        >>> tx = gradtx.contrib.normalize()
        >>> grads = {"a": jnp.array([3.0]), "b": jnp.array([4.0])}
        >>> u, _ = tx.update(grads, tx.init(grads))
        >>> u["a"], u["b"]
        (Array([0.6], dtype=float32), Array([0.8], dtype=float32))

    References:
        Foret et al., "Sharpness-Aware Minimization for Efficiently Improving
        Generalization", ICLR 2021 (the ascent step).
    """
    return Normalize()
