"""Normalising each update by its own norm."""

from __future__ import annotations

from typing import Any, ClassVar

from gradtx._core.lift import map_updates
from gradtx._core.module import hyperparam, non_negative
from gradtx._core.per_array import PerArrayTransform
from gradtx._core.protocol import Params, Updates
from gradtx._transforms.clipping import global_norm
from gradtx._transforms.scale import scaled


class NormalizeByUpdateNorm(PerArrayTransform):
    """Divide all updates by their global norm (see `normalize_by_update_norm`)."""

    name: ClassVar[str] = "normalize_by_update_norm"
    scale_factor: Any = hyperparam(1.0)
    eps: Any = hyperparam(1e-6, check=non_negative)

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """`u = scale_factor * g / (||g|| + eps)`, the norm over every present leaf."""
        self.check_state(state)
        factor = self.scale_factor / (global_norm(updates) + self.eps)
        return map_updates(lambda g, _: scaled(g, factor), updates, owner=self.name), state


def normalize_by_update_norm(scale_factor: float = 1.0, eps: float = 1e-6) -> NormalizeByUpdateNorm:
    r"""Scale the updates to a global norm of about `scale_factor`.

    $$u = \frac{s\, g}{\lVert g\rVert_2 + \epsilon}$$

    with the norm taken over every present leaf together.

    Args:
        scale_factor: the norm $s$ of the result.
        eps: added to the norm, so a zero gradient stays zero.

    Examples:
        >>> tx = gradtx.normalize_by_update_norm(eps=0.0)
        >>> tx.update({"w": jnp.array([3.0, 4.0])}, {})[0]["w"]
        Array([0.6, 0.8], dtype=float32)
    """
    return NormalizeByUpdateNorm(scale_factor, eps)
