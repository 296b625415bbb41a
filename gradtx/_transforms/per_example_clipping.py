"""Per-example clipping (DP-SGD): each example's gradient clipped, globally or per leaf, summed."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import compute_dtype
from gradtx._core.module import hyperparam, positive, static
from gradtx._core.protocol import Transformation
from gradtx._core.statistics import KeepsStatistics, statistics
from gradtx._layouts.complex import reject_complex
from gradtx._layouts.packed import reject_packed
from gradtx._paths.paths import flatten

__all__ = ["per_example_global_norm_clip", "per_example_layer_norm_clip"]

_BATCH_AXIS = "takes per-example gradients with a leading batch axis"


class PerExampleGlobalNormClip(Transformation, KeepsStatistics):
    """Clip each example's gradient, sum over the batch (see `per_example_global_norm_clip`)."""

    name: ClassVar[str] = "per_example_global_norm_clip"
    gradients_like_params: ClassVar[bool] = False  # a batch of them per parameter
    l2_norm_clip: Any = hyperparam(check=positive)
    keep_statistics: bool = static(True)

    def state_keys(self) -> tuple[str, ...]:
        """The statistic `num_clipped` (none without statistics)."""
        return ("num_clipped",) if self.keep_statistics else ()

    def init(self, params: Any) -> dict:
        """The statistic `num_clipped` (int32: how many examples the last update clipped)."""
        reject_packed(params, self.name, _BATCH_AXIS)
        if not self.keep_statistics:
            return {}
        return statistics(num_clipped=jnp.zeros((), jnp.int32))

    def update(self, updates: Any, state: dict, params: Any = None, **extra: Any) -> tuple:
        """Sum over the leading batch axis of the per-example gradients, each clipped."""
        if self.keep_statistics and (not isinstance(state, dict) or "num_clipped" not in state):
            raise KeyError(
                f"{self.name}: expected the state made by its init, with key 'num_clipped'."
            )
        paths, leaves, treedef, present = _per_example_leaves(updates, self.name)
        batch = _batch_size(present, self.name)
        if not present:
            return updates, state
        summed, num_clipped = _globally_clipped_sum(present, leaves, batch, self.l2_norm_clip)
        if not self.keep_statistics:
            return treedef.unflatten(summed), {}
        return treedef.unflatten(summed), statistics({**state, "num_clipped": num_clipped})


def _globally_clipped_sum(
    present: list[tuple[str, Any]], leaves: list, batch: int, l2_norm_clip: Any
) -> tuple[list, Any]:
    """The per-example sums of `leaves`, each example clipped to a global norm.

    Returns each leaf's sum over the batch (`None` where `leaves` has none) and how many
    examples were clipped (int32).
    """
    dtype = compute_dtype(*(g for _, g in present))
    total = jnp.zeros((batch,), dtype)
    for _, g in present:
        total = total + _example_squares(g, dtype)
    factors, over = _clip_factors(jnp.sqrt(total), l2_norm_clip.astype(dtype))
    summed = [None if g is None else _clipped_sum(factors, g, dtype) for g in leaves]
    return summed, jnp.sum(over, dtype=jnp.int32)


def _example_squares(g: Any, dtype: Any) -> Any:
    """Each example's sum of squares: `g` summed over every axis but the leading batch axis."""
    y = g.astype(dtype)
    return jnp.sum(y * y, axis=tuple(range(1, y.ndim)))


def _clip_factors(norms: Any, clip: Any) -> tuple[Any, Any]:
    """Each example's factor `min(1, clip / norm)` (1 for a zero norm), and which are < 1."""
    over = norms > clip
    return jnp.where(over, clip / jnp.where(over, norms, 1), 1), over


def _clipped_sum(factors: Any, g: Any, dtype: Any) -> Any:
    """`sum_i factors[i] * g[i]` over the leading batch axis, in `g`'s dtype."""
    return jnp.tensordot(factors, g.astype(dtype), 1).astype(g.dtype)


def _per_example_leaves(updates: Any, owner: str) -> tuple[list, list, Any, list]:
    """Paths, leaves, treedef and the `(path, leaf)` pairs present, packed and complex refused."""
    reject_packed(updates, owner, _BATCH_AXIS)
    reject_complex(updates, owner, "needs a leading batch axis on every leaf")
    paths, leaves, treedef = flatten(updates)
    return paths, leaves, treedef, [(p, g) for p, g in zip(paths, leaves) if g is not None]


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
        `num_clipped`: an int32 statistic, the number of examples the last update clipped
        (reported by `gradtx.stats`, left out by `gradtx.without_statistics`).

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


class PerExampleLayerNormClip(Transformation, KeepsStatistics):
    """Clip each example's leaves, sum over the batch (see `per_example_layer_norm_clip`)."""

    name: ClassVar[str] = "per_example_layer_norm_clip"
    gradients_like_params: ClassVar[bool] = False  # a batch of them per parameter
    global_l2_norm_clip: Any = hyperparam(check=positive)
    uniform: bool = static(True)
    keep_statistics: bool = static(True)

    def state_keys(self) -> tuple[str, ...]:
        """The per-path statistic `num_clipped` (none without statistics)."""
        return ("num_clipped",) if self.keep_statistics else ()

    def init(self, params: Any) -> dict:
        """`num_clipped/<path>`: int32 zeros for every non-`None` leaf of `params`."""
        reject_packed(params, self.name, _BATCH_AXIS)
        if not self.keep_statistics:
            return {}
        paths, leaves, _ = flatten(params)
        # A buffer per path: a donated step donates each (see gradtx/_core/statistics.py).
        present = (p for p, x in zip(paths, leaves) if x is not None)
        counts = statistics({p: jnp.zeros((), jnp.int32) for p in present})
        return statistics({"num_clipped": counts})

    def update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> tuple:
        """Sum over the leading batch axis of the per-example gradients, each layer clipped."""
        recorded = isinstance(state, dict) and isinstance(state.get("num_clipped"), dict)
        if self.keep_statistics and not recorded:
            raise KeyError(
                f"{self.name}: expected the state made by its init, with per-path entries "
                "'num_clipped'."
            )
        paths, leaves, treedef, present = _per_example_leaves(updates, self.name)
        _batch_size(present, self.name)
        counts = dict(state["num_clipped"]) if self.keep_statistics else {}
        unknown = [p for p, _ in present if self.keep_statistics and p not in counts]
        if unknown:
            raise KeyError(
                f"{self.name}: the state has no entry for path {unknown[0]!r}; the params "
                "changed since init (call `gradtx.reconcile(tx, state, params)`)."
            )
        clips = _layer_clips(present, self.uniform)
        out = {}
        for path, g in present:
            dtype = compute_dtype(g)
            clip = self.global_l2_norm_clip.astype(dtype) * jnp.asarray(clips[path], dtype)
            factors, over = _clip_factors(jnp.sqrt(_example_squares(g, dtype)), clip)
            out[path] = _clipped_sum(factors, g, dtype)
            counts[path] = jnp.sum(over, dtype=jnp.int32)
        new = treedef.unflatten([out.get(p) for p in paths])
        if not self.keep_statistics:
            return new, {}
        return new, statistics({**state, "num_clipped": statistics(counts)})


def _layer_clips(present: list[tuple[str, Any]], uniform: bool) -> dict[str, float]:
    """Each present layer's share of the global clip norm: `sqrt(1 / K)` or `sqrt(D_i / D)`."""
    if uniform:
        return {path: math.sqrt(1.0 / len(present)) for path, _ in present}
    sizes = {path: math.prod(np.shape(g)[1:]) for path, g in present}
    total = sum(sizes.values())
    return {path: math.sqrt(n / total) if total else 0.0 for path, n in sizes.items()}


def per_example_layer_norm_clip(
    global_l2_norm_clip: float, uniform: bool = True
) -> PerExampleLayerNormClip:
    r"""Clip each example's gradient layer by layer, then sum them (per-layer DP-SGD clipping).

    Like `per_example_global_norm_clip`, the update takes **per-example gradients** (every leaf
    has a leading batch axis of size $B$) and returns their sum over the batch, shaped like the
    params; but each leaf ("layer") $l$ of example $i$ is clipped on its own, to a share
    $C_l$ of the global bound $C$ = `global_l2_norm_clip`:

    $$u_l = \sum_{i=1}^{B} g_{i,l} \cdot \min\!\left(1, \frac{C_l}{\lVert g_{i,l}\rVert}\right),
      \qquad C_l = \begin{cases} C / \sqrt{K} & \text{uniform} \\
      C \sqrt{D_l / D} & \text{otherwise}\end{cases}$$

    with $K$ the number of leaves present, $D_l$ the size of one example's gradient of leaf
    $l$ and $D$ their sum. Either way $\sum_l C_l^2 = C^2$, so one example's whole gradient
    stays within norm $C$. An example whose leaf has zero gradient is left as it is. A
    `None` gradient leaf is no layer here: the shares are split among the leaves present. It
    is optax's `per_example_layer_norm_clip` function as a transformation; packed and complex
    params are refused (they hold no batch axis first).

    Args:
        global_l2_norm_clip: the global bound $C$ on one example's gradient norm.
        uniform: split $C$ equally among the leaves (`True`) or in proportion to their sizes.

    State:
        `num_clipped/<path>`: int32 statistics, the number of examples whose gradient of that
        leaf the last update clipped.

    Examples:
        >>> tx = gradtx.per_example_layer_norm_clip(1.25 * 2**0.5)
        >>> grads = {  # two examples; each leaf is clipped to norm 1.25
        ...     "w": jnp.array([[0.0, 3.0, 4.0], [0.0, 0.0, 1.0]]),
        ...     "b": jnp.array([[1.0], [0.0]]),
        ... }
        >>> u, state = tx.update(grads, tx.init({"w": jnp.zeros(3), "b": jnp.zeros(1)}))
        >>> u["w"], u["b"]
        (Array([0.  , 0.75, 2.  ], dtype=float32), Array([1.], dtype=float32))
        >>> gradtx.state_dict(state)
        {'num_clipped/b': Array(0, dtype=int32), 'num_clipped/w': Array(1, dtype=int32)}

    References:
        McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR 2018.
    """
    return PerExampleLayerNormClip(global_l2_norm_clip, uniform)
