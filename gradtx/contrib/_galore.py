"""GaLore: optimizer state for low-rank projections of matrix gradients (Zhao et al.)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gradtx._core.lift import check_state_keys, compute_dtype, init_slots, zeros_for
from gradtx._core.module import as_int, field, hyperparam, static
from gradtx._core.protocol import (
    Params,
    Transformation,
    Updates,
    merge_descriptions,
    own_hyperparams,
)
from gradtx._core.update_sharding import whole
from gradtx._core.widening import promoted
from gradtx._layouts.complex import is_complex
from gradtx._layouts.packed import reject_packed
from gradtx._layouts.step_counts import StepCounts
from gradtx._optax.wrapped import as_transformation
from gradtx._optimizers.descent import descent
from gradtx._paths.paths import flatten
from gradtx._paths.selectors import as_selector, select
from gradtx._paths.subset import present_paths
from gradtx._transforms.adam import scale_by_adam
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.weight_decay import add_decayed_weights
from gradtx.contrib._reductions import positive_int

# Products of a projection at full precision (the default may use bfloat16 or TF32 passes).
_matmul = partial(jnp.matmul, precision=lax.Precision.HIGHEST)


class GaLoreDimensionNumbers(NamedTuple):
    """Which axes of a parameter form the rows and the columns of the matrix GaLore projects.

    The parameter is transposed to put the `reduction_axis` axes first and the `output_axis`
    axes last, then reshaped to a matrix (rows: the product of the reduction axes' sizes);
    together they must name every axis once.

    Attributes:
        reduction_axis: the axis or axes of the input (rows).
        output_axis: the axis or axes of the output (columns).

    Examples:
        >>> dims = gradtx.contrib.GaLoreDimensionNumbers(reduction_axis=0, output_axis=(1, 2))
        >>> tx = gradtx.contrib.scale_by_galore(rank=4, weight_dimension_numbers={"attn": dims})
    """

    reduction_axis: int | tuple[int, ...] = 0
    output_axis: int | tuple[int, ...] = 1


def _axes(value: int | tuple[int, ...], ndim: int) -> tuple[int, ...]:
    values = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    return tuple(int(a) % ndim for a in values)


def _matrix_layout(shape: tuple[int, ...], dims: GaLoreDimensionNumbers, path: str) -> tuple:
    """`(transpose, (rows, columns))`: how a parameter of `shape` becomes its matrix."""
    ndim = len(shape)
    if ndim < 2:
        raise ValueError(
            f"scale_by_galore: the parameter at {path!r} has shape {shape}; GaLore projects "
            "arrays of at least 2 dimensions (leave it out of `weight_dimension_numbers`)."
        )
    rows, columns = _axes(dims.reduction_axis, ndim), _axes(dims.output_axis, ndim)
    if set(rows) & set(columns) or sorted(rows + columns) != list(range(ndim)):
        raise ValueError(
            f"scale_by_galore: at {path!r} (shape {shape}) the reduction axes {rows} and the "
            f"output axes {columns} must name every axis exactly once."
        )
    size = (math.prod(shape[a] for a in rows), math.prod(shape[a] for a in columns))
    return rows + columns, size


def _as_matrix(x: Any, transpose: tuple[int, ...], size: tuple[int, int]) -> Any:
    return jnp.transpose(x, transpose).reshape(size)


def _from_matrix(y: Any, transpose: tuple[int, ...], shape: tuple[int, ...]) -> Any:
    moved = tuple(shape[a] for a in transpose)
    return jnp.transpose(y.reshape(moved), tuple(np.argsort(transpose)))


def _dimension_numbers(value: Any, name: str = "weight_dimension_numbers") -> Any:
    """None, one `GaLoreDimensionNumbers`, or `((selector, dims), ...)` from a mapping."""
    if value is None or isinstance(value, GaLoreDimensionNumbers):
        return value
    pairs = value.items() if isinstance(value, Mapping) else value
    try:
        out = tuple((as_selector(sel, "weight_dimension_numbers"), dims) for sel, dims in pairs)
    except (TypeError, ValueError) as e:
        raise TypeError(
            "`weight_dimension_numbers` must be None, a GaLoreDimensionNumbers, or a dict "
            f"{{selector: GaLoreDimensionNumbers}}, got {value!r}"
        ) from e
    for _, dims in out:
        if not isinstance(dims, GaLoreDimensionNumbers):
            raise TypeError(
                "`weight_dimension_numbers`: each selector maps to a GaLoreDimensionNumbers, "
                f"got {dims!r}"
            )
    return out


class ScaleByGalore(Transformation):
    """An inner optimizer on low-rank projections of matrix gradients (see `scale_by_galore`)."""

    name: ClassVar[str] = "scale_by_galore"
    rank: int = static(128, converter=positive_int("scale_by_galore"))
    update_proj_gap: Any = field(default=200, converter=as_int)
    scale: Any = hyperparam(1.0)
    base_optimizer: Any = field(default_factory=scale_by_adam, converter=as_transformation)
    weight_dimension_numbers: Any = static(None, converter=_dimension_numbers)

    def __check__(self) -> None:
        gap = self.update_proj_gap
        if isinstance(gap, (np.generic, np.ndarray)) and int(gap) < 1:
            raise ValueError(f"{self.name}: `update_proj_gap` must be at least 1, got {int(gap)}.")

    def state_keys(self) -> tuple[str, ...]:
        """The projected paths' `count` and `projector`, and the inner `base_optimizer` state."""
        return ("count", "projector", "base_optimizer")

    def _layouts(self, tree: Any, strict: bool) -> dict[str, tuple]:
        """`{path: (transpose, (rows, columns))}` for the projected leaves of `tree`."""
        paths, leaves, _ = flatten(tree)
        real = {p: x for p, x in zip(paths, leaves) if x is not None and not is_complex(x)}
        spec = self.weight_dimension_numbers
        if spec is None:
            chosen = {p: GaLoreDimensionNumbers() for p, x in real.items() if np.ndim(x) == 2}
        elif isinstance(spec, GaLoreDimensionNumbers):
            chosen = {p: spec for p, x in real.items() if np.ndim(x) >= 2}
        else:
            chosen = {}
            for selector, dims in spec:
                for p in select(tree, selector, strict=strict, argument="weight_dimension_numbers"):
                    if p in chosen:
                        raise ValueError(
                            f"{self.name}: `weight_dimension_numbers` gives the path {p!r} "
                            "two entries; each path may match one selector at most."
                        )
                    if p not in real:
                        raise TypeError(
                            f"{self.name}: `weight_dimension_numbers` selects the complex "
                            f"parameter at {p!r}; GaLore projects real matrices only."
                        )
                    chosen[p] = dims
        return {p: _matrix_layout(tuple(np.shape(real[p])), d, p) for p, d in chosen.items()}

    def _low_rank(self, size: tuple[int, int]) -> tuple[bool, tuple, tuple]:
        """`(left, projector shape, low-rank shape)` of a matrix of `size`."""
        m, n = size
        r = min(self.rank, m, n)
        left = m >= n
        return left, ((m, r) if left else (n, r)), ((r, n) if left else (m, r))

    def init_state(self, params: Params) -> dict:
        """Zero projectors and counts for the projected paths; the inner state (low-rank)."""
        reject_packed(params, self.name, "projects each matrix on its own")
        layouts = self._layouts(params, strict=True)
        paths, leaves, treedef = flatten(params)
        projector, proxies = {}, []
        for path, x in zip(paths, leaves):
            if path not in layouts:
                proxies.append(x)
                continue
            _, p_shape, low_shape = self._low_rank(layouts[path][1])
            projector[path] = zeros_for(jax.ShapeDtypeStruct(p_shape, x.dtype))
            proxies.append(jax.ShapeDtypeStruct(low_shape, x.dtype))
        zero = {"count": jnp.zeros((), jnp.int32)}
        counts = init_slots(params, lambda p: zero, ("count",), set(layouts), ("count",))
        return {
            "count": counts["count"],
            "projector": projector,
            "base_optimizer": self.base_optimizer.init_state(treedef.unflatten(proxies)),
        }

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """This step (on every present path), then the inner optimizer's."""
        entry = (self.name, own_hyperparams(self, step))
        mine = {path: [entry] for path in present_paths(params)}
        return merge_descriptions(mine, self.base_optimizer.describe(params, step))

    def _project(self, g: Any, old: Any, count: Any, layout: tuple) -> tuple[Any, Any]:
        """The gradient's low-rank projection and the projector, recomputed when due."""
        transpose, size = layout
        left, _, _ = self._low_rank(size)
        r = old.shape[1]
        matrix = _as_matrix(g, transpose, size)

        def fresh() -> Any:
            # An SVD needs the whole matrix on each device (under explicit axes, say so).
            whole_matrix = whole(matrix)
            u, _, vh = jnp.linalg.svd(
                whole_matrix.astype(compute_dtype(whole_matrix)), full_matrices=False
            )
            return (u[:, :r] if left else vh[:r, :].T).astype(old.dtype)

        due = count % jnp.asarray(self.update_proj_gap, jnp.int32) == 0
        projector = lax.cond(due, fresh, lambda: old)
        dtype = compute_dtype(g, projector)
        p, mat = projector.astype(dtype), matrix.astype(dtype)
        low = _matmul(p.T, mat) if left else _matmul(mat, p)
        return low.astype(promoted(g.dtype, projector.dtype)), projector

    def _back(self, u: Any, projector: Any, g: Any, layout: tuple) -> Any:
        """The inner update of the projection, back in the parameter's shape and scaled."""
        transpose, size = layout
        left, _, _ = self._low_rank(size)
        dtype = compute_dtype(u, projector)
        p, low = projector.astype(dtype), u.astype(dtype)
        full = _matmul(p, low) if left else _matmul(low, p.T)
        full = _from_matrix(full, transpose, tuple(np.shape(g))) * self.scale.astype(dtype)
        return full.astype(promoted(g.dtype, u.dtype, projector.dtype))

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Project, run the inner optimizer on the projections, project its updates back."""
        check_state_keys(self.name, state, self.state_keys())
        layouts = self._layouts(updates if params is None else params, strict=False)
        paths, leaves, treedef = flatten(updates)
        projectors, counts = dict(state["projector"]), state["count"]
        low, moved = [], set()
        for path, g in zip(paths, leaves):
            if g is None or path not in layouts:
                low.append(g)
                continue
            if path not in projectors or path not in counts:
                raise KeyError(
                    f"{self.name}: the state has no projector for path {path!r}; the params "
                    "changed since init (call `gradtx.reconcile(tx, state, params)`)."
                )
            projected, projectors[path] = self._project(
                g, projectors[path], counts[path], layouts[path]
            )
            low.append(projected)
            moved.add(path)
        inner_updates, inner = self.base_optimizer.step(
            treedef.unflatten(low), state["base_optimizer"], None
        )
        inner_leaves = treedef.flatten_up_to(inner_updates)
        out = [
            self._back(u, projectors[p], g, layouts[p]) if p in moved else u
            for p, g, u in zip(paths, leaves, inner_leaves)
        ]
        new_counts = counts.advanced(moved) if isinstance(counts, StepCounts) else counts
        return treedef.unflatten(out), {
            "count": new_counts,
            "projector": projectors,
            "base_optimizer": inner,
        }


def scale_by_galore(
    rank: int = 128,
    update_proj_gap: int = 200,
    scale: float = 1.0,
    base_optimizer: Any = None,
    weight_dimension_numbers: Any = None,
) -> ScaleByGalore:
    r"""Run an optimizer on low-rank projections of matrix gradients (GaLore).

    For each projected parameter, seen as a matrix $G \in \mathbb{R}^{m \times n}$ and with
    $r = \min(\text{rank}, m, n)$: every `update_proj_gap` steps of the path (its steps
    $1, 1 + T, \ldots$) the projector $P$ is recomputed from the gradient's SVD
    $G = U S V^\top$, and at every step

    $$R = P^\top G,\ P = U_{:, :r}\ \ (m \ge n)\qquad\text{or}\qquad R = G P,\
      P = V_{:, :r}\ \ (m < n)$$

    $$u = \alpha\, P\, \mathrm{opt}(R)\qquad\text{or}\qquad u = \alpha\, \mathrm{opt}(R)\,
      P^\top$$

    with opt the `base_optimizer` (default `scale_by_adam()`) and $\alpha$ = `scale`. The
    inner optimizer's state has the shape of $R$ ($r \times n$ or $m \times r$) instead of
    $m \times n$: that is the memory saving. Paths not projected go to the inner optimizer
    unchanged (and are not scaled). The SVD runs in at least float32; the projector is kept in
    the parameter's dtype. An SVD's singular vectors are defined up to sign; the update does
    not depend on those signs between two recomputations (for an inner optimizer that is odd
    in the gradient, such as Adam or SGD), but a recomputed projector may flip them against
    the moments kept from before, as in the paper and optax.

    `base_optimizer` must be a gradient-only transformation (`scale_by_adam`, `scale_by_lion`,
    `scale_by_rms`, `sgd(1.0)`, ...): it is called without params, on the low-rank shapes.
    Decay weights with `galore`'s `weight_decay`, in the full parameter space.

    Args:
        rank: the largest rank $r$ of the projection.
        update_proj_gap: the number of steps $T$ between two SVDs (an int32 leaf).
        scale: the factor $\alpha$ on the projected parameters' updates.
        base_optimizer: the optimizer run on the projections (default `scale_by_adam()`).
        weight_dimension_numbers: which parameters to project and how: `None` for every real
            2-D leaf as it is; one `GaLoreDimensionNumbers` for every real leaf of at least 2
            dimensions, its axes grouped as it says; or a dict
            `{selector: GaLoreDimensionNumbers}` for the leaves each selector picks (others
            are not projected).

    State:
        `count/<path>` (int32) and `projector/<path>` ($m \times r$ or $n \times r$) for the
        projected paths; `base_optimizer`, the inner optimizer's state on the low-rank shapes
        (`base_optimizer/mu/<path>`, ...). Packed params are refused.

    Examples:
        >>> tx = gradtx.contrib.scale_by_galore(rank=2)
        >>> params = {"w": jnp.ones((6, 4)), "b": jnp.zeros(4)}
        >>> state = tx.init(params)
        >>> state["projector"]["w"].shape, state["base_optimizer"]["mu"]["w"].shape
        ((6, 2), (2, 4))
        >>> u, state = tx.update({"w": jnp.ones((6, 4)), "b": jnp.ones(4)}, state)
        >>> u["w"].shape, u["b"]  # the vector is Adam's alone
        ((6, 4), Array([1., 1., 1., 1.], dtype=float32))

    References:
        Zhao et al., "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
        Projection", ICML 2024.
    """
    if base_optimizer is None:
        base_optimizer = scale_by_adam()
    return ScaleByGalore(rank, update_proj_gap, scale, base_optimizer, weight_dimension_numbers)


def galore(
    learning_rate: ScalarOrSchedule,
    rank: int = 128,
    update_proj_gap: int = 200,
    scale: float = 1.0,
    base_optimizer: Any = None,
    weight_decay: float = 0.0,
    mask: Any = None,
    weight_dimension_numbers: Any = None,
) -> Any:
    r"""GaLore: an optimizer with its state on low-rank projections of matrix gradients.

    `chain(scale_by_galore(rank, update_proj_gap, scale, base_optimizer,
    weight_dimension_numbers), add_decayed_weights(weight_decay, mask),
    scale_by_learning_rate(learning_rate))`:

    $$\theta_t = \theta_{t-1} - \eta\left(\alpha P\, \mathrm{opt}(P^\top G_t) +
      \lambda\, \theta_{t-1}\right)$$

    for a projected matrix (with $P$ from the gradient's SVD every `update_proj_gap` steps;
    see `scale_by_galore`), and the plain base optimizer for the other paths. With Adam, the
    moments of an $m \times n$ matrix take $2 r \max(m, n)$ numbers instead of $2 m n$, plus
    the projector; learning still changes all of the matrix, one subspace at a time.

    Args:
        learning_rate: a number or a schedule (1.0 if `base_optimizer` has its own).
        rank: the largest rank $r$ of the projection.
        update_proj_gap: the number of steps between two SVDs.
        scale: the factor $\alpha$ on the projected parameters' updates.
        base_optimizer: the gradient-only optimizer run on the projections (default
            `scale_by_adam()`); not one that decays weights (`adamw`): use `weight_decay`.
        weight_decay: the decoupled decay rate $\lambda$ (multiplied by the learning rate).
        mask: selector of the paths to decay; default: all.
        weight_dimension_numbers: which parameters to project (see `scale_by_galore`).

    State:
        `count/<path>`, `projector/<path>` for the projected paths, `base_optimizer/...`;
        `schedule_count/<path>` with a learning-rate schedule.

    Examples:
        >>> tx = gradtx.contrib.galore(0.01, rank=2)
        >>> params = {"w": jnp.ones((6, 4)), "b": jnp.zeros(4)}
        >>> sorted(gradtx.state_dict(tx.init(params)))[:3]
        ['base_optimizer/count/b', 'base_optimizer/count/w', 'base_optimizer/mu/b']

    References:
        Zhao et al., "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
        Projection", ICML 2024.
    """
    projected = scale_by_galore(
        rank, update_proj_gap, scale, base_optimizer, weight_dimension_numbers
    )
    return descent("galore", learning_rate, projected, add_decayed_weights(weight_decay, mask))
