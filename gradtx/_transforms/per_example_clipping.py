"""Per-example clipping (DP-SGD): each example's gradient clipped, globally or per leaf, summed."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import compute_dtype
from gradtx._core.module import hyperparam, positive, static
from gradtx._core.protocol import Params, State, Transformation, Updates
from gradtx._core.statistics import KeepsStatistics, statistics
from gradtx._layouts.complex import reject_complex
from gradtx._layouts.packed import reject_packed
from gradtx._paths.paths import flatten
from gradtx._paths.subset import present_paths

_BATCH_AXIS = "takes per-example gradients with a leading batch axis"


class _PerExampleClip(Transformation, KeepsStatistics):
    """Per-example gradients, each example clipped, summed over the batch (the two below)."""

    gradients_like_params: ClassVar[bool] = False  # a batch of them per parameter
    per_leaf: ClassVar[bool]  # each leaf clipped on its own, `num_clipped` kept per path

    def state_keys(self) -> tuple[str, ...]:
        """The statistic `num_clipped` (none without statistics)."""
        return ("num_clipped",) if self.keep_statistics else ()

    def init_state(self, params: Params) -> dict:
        """`num_clipped`: int32 counts of the examples the last update clipped (per path)."""
        reject_packed(params, self.name, _BATCH_AXIS)
        if not self.keep_statistics:
            return {}
        if not self.per_leaf:
            return statistics(num_clipped=jnp.zeros((), jnp.int32))
        # A buffer per path: a donated step donates each (see gradtx/_core/statistics.py).
        counts = {p: jnp.zeros((), jnp.int32) for p in present_paths(params)}
        return statistics(num_clipped=statistics(counts))

    def step(self, updates: Updates, state: State, params: Params = None, **extra: Any) -> tuple:
        """Sum over the leading batch axis of the per-example gradients, each clipped."""
        recorded = isinstance(state, dict) and "num_clipped" in state
        if recorded and self.per_leaf:
            recorded = isinstance(state["num_clipped"], dict)
        if self.keep_statistics and not recorded:
            what = "per-path entries" if self.per_leaf else "key"
            raise KeyError(
                f"{self.name}: expected the state made by its init, with {what} 'num_clipped'."
            )
        paths, treedef, present, _ = per_example_leaves(updates, self.name)
        if self.keep_statistics and self.per_leaf:
            unknown = [p for p, _ in present if p not in state["num_clipped"]]
            if unknown:
                raise KeyError(
                    f"{self.name}: the state has no entry for path {unknown[0]!r}; the params "
                    "changed since init (call `gradtx.reconcile(tx, state, params)`)."
                )
        if not present:
            return updates, state
        sums, num_clipped = self.clipped_sums(present)
        summed = treedef.unflatten([sums.get(p) for p in paths])
        if not self.keep_statistics:
            return summed, {}
        if self.per_leaf:
            num_clipped = statistics({**state["num_clipped"], **num_clipped})
        return summed, statistics({**state, "num_clipped": num_clipped})

    if TYPE_CHECKING:  # each subclass says how it clips

        def clipped_sums(self, present: list[tuple[str, Any]]) -> tuple[dict[str, Any], Any]:
            """Each present path's clipped sum, and the counts of the examples clipped."""
            ...


def clipped_sums(
    present: list[tuple[str, Any]], clip: Any, share: float = 1.0
) -> tuple[dict[str, Any], Any]:
    """The leaves of `present` summed over the batch, each example clipped to their joint norm.

    An example whose gradient has global norm (over `present`) above `clip * share` is scaled
    down to it. Returns each path's sum, in its leaf's dtype, and how many examples were
    clipped (int32).
    """
    dtype = compute_dtype(*(g for _, g in present))
    norms = jnp.sqrt(sum(_example_squares(g, dtype) for _, g in present))
    bound = clip.astype(dtype) * jnp.asarray(share, dtype)
    over = norms > bound
    factors = jnp.where(over, bound / jnp.where(over, norms, 1), 1)  # 1 for a zero norm
    sums = {p: jnp.tensordot(factors, g.astype(dtype), 1).astype(g.dtype) for p, g in present}
    return sums, jnp.sum(over, dtype=jnp.int32)


def _example_squares(g: Any, dtype: Any) -> Any:
    """Each example's sum of squares: `g` summed over every axis but the leading batch axis."""
    y = g.astype(dtype)
    return jnp.sum(y * y, axis=tuple(range(1, y.ndim)))


def per_example_leaves(updates: Updates, owner: str) -> tuple[tuple[str, ...], Any, list, int]:
    """Per-example gradients: paths, treedef, the `(path, leaf)` pairs present, batch size.

    Packed and complex updates are refused; every present leaf needs the same leading batch
    axis (the batch size is 0 when no leaf is present).
    """
    reject_packed(updates, owner, _BATCH_AXIS)
    reject_complex(updates, owner, "needs a leading batch axis on every leaf")
    paths, leaves, treedef = flatten(updates)
    present = [(p, g) for p, g in zip(paths, leaves) if g is not None]
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
    return paths, treedef, present, next(iter(sizes), 0)


class PerExampleGlobalNormClip(_PerExampleClip):
    """Clip each example's gradient, sum over the batch (see `per_example_global_norm_clip`)."""

    name: ClassVar[str] = "per_example_global_norm_clip"
    per_leaf: ClassVar[bool] = False
    l2_norm_clip: Any = hyperparam(check=positive)
    keep_statistics: bool = static(True)

    def clipped_sums(self, present: list[tuple[str, Any]]) -> tuple[dict[str, Any], Any]:
        """Every leaf clipped together: one norm per example, one count."""
        return clipped_sums(present, self.l2_norm_clip)


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


class PerExampleLayerNormClip(_PerExampleClip):
    """Clip each example's leaves, sum over the batch (see `per_example_layer_norm_clip`)."""

    name: ClassVar[str] = "per_example_layer_norm_clip"
    per_leaf: ClassVar[bool] = True
    global_l2_norm_clip: Any = hyperparam(check=positive)
    uniform: bool = static(True)
    keep_statistics: bool = static(True)

    def clipped_sums(self, present: list[tuple[str, Any]]) -> tuple[dict[str, Any], Any]:
        """Each leaf clipped on its own, to its share of the bound: a sum and a count per path."""
        sums, counts = {}, {}
        for (path, g), share in zip(present, _layer_shares(present, self.uniform)):
            one, counts[path] = clipped_sums([(path, g)], self.global_l2_norm_clip, share)
            sums.update(one)
        return sums, counts


def _layer_shares(present: list[tuple[str, Any]], uniform: bool) -> list[float]:
    """Each present layer's share of the global clip norm: `sqrt(1 / K)` or `sqrt(D_i / D)`."""
    if uniform:
        return [math.sqrt(1.0 / len(present))] * len(present)
    sizes = [math.prod(np.shape(g)[1:]) for _, g in present]
    total = sum(sizes)
    return [math.sqrt(n / total) if total else 0.0 for n in sizes]


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
