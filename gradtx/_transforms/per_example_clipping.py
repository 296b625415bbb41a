"""Per-example clipping (DP-SGD): each example's gradient clipped to a global norm, then summed."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import compute_dtype
from gradtx._core.module import hyperparam
from gradtx._core.protocol import Transformation
from gradtx._layouts.complex import reject_complex
from gradtx._layouts.packed import reject_packed
from gradtx._paths.paths import flatten

__all__ = ["per_example_global_norm_clip"]


class PerExampleGlobalNormClip(Transformation):
    """Clip each example's gradient, sum over the batch (see `per_example_global_norm_clip`)."""

    name: ClassVar[str] = "per_example_global_norm_clip"
    l2_norm_clip: Any = hyperparam()

    def state_keys(self) -> tuple[str, ...]:
        """The statistic `num_clipped`."""
        return ("num_clipped",)

    def init(self, params: Any) -> dict:
        """The statistic `num_clipped` (int32: how many examples the last update clipped)."""
        reject_packed(params, self.name, "takes per-example gradients with a leading batch axis")
        return {"num_clipped": jnp.zeros((), jnp.int32)}

    def update(self, updates: Any, state: dict, params: Any = None, **extra: Any) -> tuple:
        """Sum over the leading batch axis of the per-example gradients, each clipped."""
        if not isinstance(state, dict) or "num_clipped" not in state:
            raise KeyError(
                f"{self.name}: expected the state made by its init, with key 'num_clipped'."
            )
        reject_packed(updates, self.name, "takes per-example gradients with a leading batch axis")
        reject_complex(updates, self.name, "needs a leading batch axis on every leaf")
        paths, leaves, treedef = flatten(updates)
        present = [(p, g) for p, g in zip(paths, leaves) if g is not None]
        batch = _batch_size(present, self.name)
        if not present:
            return updates, state
        dtype = compute_dtype(*(g for _, g in present))
        total = jnp.zeros((batch,), dtype)
        for _, g in present:
            y = g.astype(dtype)
            total = total + jnp.sum(y * y, axis=tuple(range(1, y.ndim)))
        norms = jnp.sqrt(total)
        clip = self.l2_norm_clip.astype(dtype)
        over = norms > clip
        # Each example is scaled by min(1, clip / norm); a zero-norm example keeps factor 1.
        factors = jnp.where(over, clip / jnp.where(over, norms, 1), 1)
        out = []
        for g in leaves:
            u = None if g is None else jnp.tensordot(factors, g.astype(dtype), 1).astype(g.dtype)
            out.append(u)
        return treedef.unflatten(out), {**state, "num_clipped": jnp.sum(over, dtype=jnp.int32)}


def _batch_size(present: list[tuple[str, Any]], owner: str) -> int:
    sizes = {}
    for path, g in present:
        if np.ndim(g) == 0:
            raise ValueError(
                f"{owner}: the per-example gradient at {path!r} is a scalar; every leaf needs "
                "a leading batch axis (one gradient per example)."
            )
        sizes.setdefault(int(np.shape(g)[0]), path)
    if len(sizes) > 1:
        shown = ", ".join(f"{p!r}: {n}" for n, p in sizes.items())
        raise ValueError(
            f"{owner}: the per-example gradients disagree on the batch size (leading axis) "
            f"({shown})."
        )
    return next(iter(sizes), 0)


def per_example_global_norm_clip(l2_norm_clip: float) -> PerExampleGlobalNormClip:
    r"""Clip each example's gradient to a global L2 norm, then sum them (DP-SGD's clipping).

    The update takes **per-example gradients**: every leaf has a leading batch axis of size
    $B$ (for instance from `jax.vmap(jax.grad(loss), (None, 0))(params, batch)`), and returns
    the sum over the batch, shaped like the params:

    $$u = \sum_{i=1}^{B} g_i \cdot \min\!\left(1, \frac{C}{\lVert g_i\rVert}\right)$$

    with $\lVert g_i\rVert$ the global norm of example $i$'s gradient over every leaf and $C$ =
    `l2_norm_clip` (an example with zero gradient is left as it is). This bounds each
    example's contribution, as differentially private SGD needs; add noise and divide by the
    batch size after it (optax's `dpsgd`). It is optax's `per_example_global_norm_clip`
    function as a transformation. Packed params are refused (they hold no batch axis).

    Args:
        l2_norm_clip: the largest global norm $C$ of one example's gradient.

    State:
        `num_clipped`: an int32 statistic, the number of examples the last update clipped.

    Examples:
        >>> tx = gradtx.per_example_global_norm_clip(1.25)
        >>> grads = {"w": jnp.array([[0.0, 0.0, 0.0], [0.0, 3.0, 4.0], [4.0, 0.0, 3.0]])}
        >>> u, state = tx.update(grads, tx.init({"w": jnp.zeros(3)}))
        >>> u["w"], state["num_clipped"]
        (Array([1. , 0.75, 1.75], dtype=float32), Array(2, dtype=int32))

    References:
        Abadi et al., "Deep Learning with Differential Privacy", 2016.
    """
    return PerExampleGlobalNormClip(l2_norm_clip)
