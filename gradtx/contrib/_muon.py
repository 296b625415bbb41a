"""Muon: momentum orthogonalised by Newton-Schulz iterations for matrices, Adam elsewhere."""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from gradtx._core.lift import compute_dtype, dtype_or_none, init_slots, update_slots, zeros_for
from gradtx._core.module import (
    as_float,
    as_floats,
    decay_rate,
    field,
    hyperparam,
    non_negative,
    static,
)
from gradtx._core.per_array import (
    Float16Check,
    PerArrayTransform,
    hyperparam_at,
    traced_once,
    warn_float16_statistics,
)
from gradtx._core.protocol import Params, Updates
from gradtx._core.update_sharding import whole
from gradtx._layouts.complex import is_complex
from gradtx._layouts.packed import reject_packed
from gradtx._layouts.step_counts import next_count
from gradtx._paths.paths import flatten
from gradtx._paths.selectors import as_selector, select
from gradtx._paths.subset import present_paths
from gradtx._transforms.adam import ScaleByAdam, first_moment_hat, moving_average
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.weight_decay import optional_selector
from gradtx.contrib._reductions import needs_params_error

DEFAULT_NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_COEFFS_PRESETS = {
    "standard": DEFAULT_NS_COEFFS,
    "dion": (
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ),
}
_HIGHEST = jax.lax.Precision.HIGHEST
# A matrix's own axes: rows are the reduction (input) axis, columns the output axis.
Axes = tuple[tuple[int, ...], tuple[int, ...]]
MATRIX: Axes = ((0,), (1,))


def _coeff_leaves(value: Any, name: str = "ns_coeffs") -> Any:
    """The coefficients (a preset's name, a triple or a tuple of triples) as float32 leaves.

    JAX arrays stay arrays. Given as numbers, they become NumPy scalars in tuples, so that
    Flax NNX can hold the transformation as static structure.
    """
    if isinstance(value, str):
        if value not in NS_COEFFS_PRESETS:
            raise ValueError(
                f"`ns_coeffs`: unknown preset {value!r}; the presets are "
                f"{sorted(NS_COEFFS_PRESETS)}, or pass (a, b, c) or a tuple of such triples."
            )
        value = NS_COEFFS_PRESETS[value]
    shape = np.shape(value)
    if len(shape) not in (1, 2) or shape[-1] != 3:
        raise ValueError(
            f"`ns_coeffs` must be a triple (a, b, c) or a tuple of triples, got shape {shape}"
        )
    if isinstance(value, (jax.Array, Tracer)):
        return as_float(value, name)
    rows = np.asarray(value)
    if rows.ndim == 2:
        return tuple(as_floats(row, f"{name}[{i}]") for i, row in enumerate(rows))
    return as_floats(value, name)


def orthogonalize_via_newton_schulz(
    x: jax.Array, ns_coeffs: Any = DEFAULT_NS_COEFFS, ns_steps: int = 5, eps: float = 1e-8
) -> jax.Array:
    r"""Approximately orthogonalise a matrix: $U V^\top$ for $X = U S V^\top$, roughly.

    $X$ is first divided by $\lVert X\rVert_F + \epsilon$ (so its singular values are at most
    1), transposed if it has more rows than columns, then iterated with the quintic

    $$X \leftarrow a X + \left(b\, A + c\, A^2\right) X,\qquad A = X X^\top$$

    `ns_steps` times with one triple $(a, b, c)$, or once per row of a tuple of triples. The
    default coefficients push small singular values up fast and leave all of them roughly in
    $[0.7, 1.2]$ rather than exactly 1, which does not hurt training. Runs in at least
    float32, matrix products at full precision.

    Args:
        x: a matrix (2-D).
        ns_coeffs: a triple $(a, b, c)$ or a tuple of triples (one per iteration).
        ns_steps: the number of iterations with a single triple.
        eps: added to the Frobenius norm.

    Examples:
        >>> o = orthogonalize_via_newton_schulz(jnp.array([[3.0, 0.0], [0.0, 0.5]]))
        >>> bool(jnp.all(jnp.abs(jnp.diag(o) - 1) < 0.3)), float(o[0, 1])
        (True, 0.0)
    """
    if x.ndim != 2:
        raise ValueError(f"Newton-Schulz orthogonalisation needs a matrix, got shape {x.shape}")
    dtype = compute_dtype(x)
    coeffs = jnp.asarray(ns_coeffs, jnp.float32).astype(dtype)
    rows = [coeffs[i] for i in range(coeffs.shape[0])] if coeffs.ndim == 2 else [coeffs] * ns_steps
    y = whole(x).astype(dtype)  # products over both dims: all of the matrix on each device
    transposed = y.shape[0] > y.shape[1]
    if transposed:
        y = y.T
    y = y / (jnp.sqrt(jnp.sum(y * y)) + jnp.asarray(eps, jnp.float32).astype(dtype))
    for a, b, c in rows:
        gram = jnp.matmul(y, y.T, precision=_HIGHEST)
        poly = b * gram + c * jnp.matmul(gram, gram, precision=_HIGHEST)
        y = a * y + jnp.matmul(poly, y, precision=_HIGHEST)
    return y.T if transposed else y


def _axis_list(value: Any) -> tuple[int, ...] | None:
    """An axis or a sequence of axes as a tuple of ints, or None if it is neither."""
    axes = value if isinstance(value, (tuple, list)) else (value,)
    if axes and all(isinstance(a, (int, np.integer)) and not isinstance(a, bool) for a in axes):
        return tuple(int(a) for a in axes)
    return None


def _as_pair(value: Any) -> Axes | None:
    """`(reduction axes, output axes)` from a pair or a `MuonDimensionNumbers`, else None."""
    if hasattr(value, "reduction_axis") and hasattr(value, "output_axis"):
        parts: Any = (value.reduction_axis, value.output_axis)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        parts = value
    else:
        return None
    reduction, output = _axis_list(parts[0]), _axis_list(parts[1])
    return None if reduction is None or output is None else (reduction, output)


def _dimension_numbers(value: Any, name: str) -> Any:
    """None, one `(reduction, output)` pair, or `((selector, pair), ...)` from a mapping."""
    short = name.rsplit(".", 1)[-1]
    if value is None:
        return None
    pair = _as_pair(value)
    if pair is not None:
        return pair
    if isinstance(value, Mapping):
        out = []
        for selector, dims in value.items():
            pair = _as_pair(dims)
            if pair is None:
                raise TypeError(
                    f"`{short}`: the selector {selector!r} maps to {dims!r}; give a pair "
                    "(reduction_axis, output_axis), each an axis or a tuple of axes "
                    "(optax.contrib.MuonDimensionNumbers is one)."
                )
            out.append((as_selector(selector, short), pair))
        return tuple(out) or None
    raise TypeError(
        f"`{short}` must be None, a pair (reduction_axis, output_axis) for every selected "
        f"leaf of more than 2 dimensions, or a dict {{selector: pair}}, got {value!r}"
    )


def _checked_axes(pair: Axes, shape: tuple[int, ...], path: str, owner: str, argument: str) -> Axes:
    """The pair's axes made non-negative, after checking them against the leaf's shape."""
    ndim = len(shape)
    for axis in pair[0] + pair[1]:
        if not -ndim <= axis < ndim:
            raise ValueError(
                f"{owner}: `{argument}` gives the parameter at {path!r} (shape {shape}) the "
                f"axes {pair}, but it has no axis {axis}."
            )
    reduction = tuple(a % ndim for a in pair[0])
    output = tuple(a % ndim for a in pair[1])
    named = reduction + output
    if len(set(named)) != len(named):
        raise ValueError(
            f"{owner}: `{argument}` gives the parameter at {path!r} (shape {shape}) the "
            f"reduction axes {reduction} and the output axes {output}, which repeat an axis."
        )
    return reduction, output


def _muon_leaves(tx: Any, tree: Any, strict: bool) -> dict[str, Axes]:
    """`{path: (reduction axes, output axes)}` of the leaves that take Muon steps.

    The mask (`tx.mask_argument`) selects the candidates (default: every leaf). A 2-D
    candidate is a matrix of its own axes unless the dimension numbers (`tx.dims_argument`)
    say otherwise; a candidate of more than 2 dimensions needs its axes from them (without
    them it is left to Adam when there is no mask, and an error when the mask selected it).
    A complex leaf is its real view, so never a matrix.
    """
    mask_argument, dims_argument, owner = tx.mask_argument, tx.dims_argument, tx.name
    mask, dims = getattr(tx, mask_argument), getattr(tx, dims_argument)
    paths, leaves, _ = flatten(tree)
    real = {
        p: tuple(np.shape(x)) for p, x in zip(paths, leaves) if x is not None and not is_complex(x)
    }
    if mask is None:
        candidates = set(real)
    else:
        candidates = set(select(tree, mask, strict=strict, argument=mask_argument)) & set(real)
    given: dict[str, Axes] = {}
    if dims is not None and isinstance(dims[0][0], int):  # one pair for every leaf of 3+ dims
        given = {p: dims for p in candidates if len(real[p]) > 2}
    elif dims is not None:
        for selector, pair in dims:
            for p in select(tree, selector, strict=strict, argument=dims_argument):
                if p in given:
                    raise ValueError(
                        f"{owner}: `{dims_argument}` gives the path {p!r} two entries; each "
                        "path may match one selector at most."
                    )
                if p not in real or len(real[p]) < 2:
                    shape = real.get(p, "complex")
                    raise ValueError(
                        f"{owner}: `{dims_argument}` gives axes to the parameter at {p!r} "
                        f"({shape}), but Muon orthogonalises real arrays of at least 2 "
                        "dimensions; leave it out."
                    )
                if p not in candidates:
                    raise ValueError(
                        f"{owner}: `{dims_argument}` gives axes to the parameter at {p!r}, "
                        f"which `{mask_argument}` does not select; select it or leave it out."
                    )
                given[p] = pair
    out: dict[str, Axes] = {}
    for p in paths:
        if p not in candidates:
            continue
        shape = real[p]
        if p in given:
            out[p] = _checked_axes(given[p], shape, p, owner, dims_argument)
        elif len(shape) == 2:
            out[p] = MATRIX
        elif len(shape) > 2 and mask is not None:
            raise ValueError(
                f"{owner}: `{mask_argument}` selects the parameter at {p!r} of shape {shape}, "
                f"which is not a matrix. Say which axes form its matrix with "
                f"`{dims_argument}={{{p!r}: (reduction_axis, output_axis)}}` (for a "
                "convolution kernel in JAX's HWIO layout, `((0, 1, 2), 3)`; the other axes "
                f"are batch axes, each slice orthogonalised alone), or leave it out of "
                f"`{mask_argument}`."
            )
    return out


def _grouped(by_path: dict[str, Any]) -> dict[Any, set[str]]:
    """The paths of `by_path` grouped by their value."""
    grouped: dict[Any, set[str]] = {}
    for path, value in by_path.items():
        grouped.setdefault(value, set()).add(path)
    return grouped


def _orthogonalize_along(x: Any, axes: Axes, ns_coeffs: Any, ns_steps: int, eps: Any) -> Any:
    """`x` orthogonalised as matrices: rows the reduction axes, columns the output axes.

    The other axes are batch axes: each of their slices is orthogonalised alone.
    """
    reduction, output = axes
    if x.ndim == 2 and axes == MATRIX:
        return orthogonalize_via_newton_schulz(x, ns_coeffs, ns_steps, eps)
    batch = tuple(a for a in range(x.ndim) if a not in reduction + output)
    order = batch + reduction + output
    size = [math.prod(x.shape[a] for a in part) for part in (batch, reduction, output)]
    matrices = jnp.transpose(whole(x), order).reshape(size)
    done = jax.vmap(lambda m: orthogonalize_via_newton_schulz(m, ns_coeffs, ns_steps, eps))(
        matrices
    )
    return jnp.transpose(done.reshape([x.shape[a] for a in order]), tuple(np.argsort(order)))


class _MuonMath:
    """The Muon direction of one matrix: orthogonalised momentum (shared by both APIs)."""

    # The arguments that select the matrices and give their axes (Muon's start with `muon_`).
    mask_argument: ClassVar[str] = "mask"
    dims_argument: ClassVar[str] = "weight_dimension_numbers"

    def init_leaf(self: Any, param: Any) -> dict[str, Any]:
        """A zero momentum (in `mu_dtype`, default the param's dtype) and count 0."""
        return {"mu": zeros_for(param, self.mu_dtype), "count": jnp.zeros((), jnp.int32)}

    def muon_direction(
        self: Any, g: Any, slots: dict, param: Any = None, axes: Axes = MATRIX
    ) -> tuple[Any, dict]:
        """Bias-corrected (Nesterov) momentum in at least float32, orthogonalised along `axes`."""
        dtype = compute_dtype(g, slots["mu"])
        grad, b = g.astype(dtype), self.beta.astype(dtype)
        mu = moving_average(b, slots["mu"], grad, dtype)
        count = next_count(slots["count"])
        mu_hat = first_moment_hat(mu, grad, b, count.astype(dtype), self.nesterov)
        u = _orthogonalize_along(mu_hat, axes, self.ns_coeffs, self.ns_steps, self.eps)
        if self.adaptive:
            u = jnp.sum(mu_hat * u) * u
        return u, {"mu": mu, "count": count}


class ScaleByMuon(_MuonMath, PerArrayTransform):
    """Orthogonalised momentum for the selected matrices (see `scale_by_muon`)."""

    name: ClassVar[str] = "scale_by_muon"
    per_leaf_structure: ClassVar[bool] = True
    ns_coeffs: Any = field(default=DEFAULT_NS_COEFFS, converter=_coeff_leaves)
    ns_steps: int = static(5)
    beta: Any = hyperparam(0.95)
    eps: Any = hyperparam(1e-8, check=non_negative)
    mu_dtype: Any = static(None, converter=dtype_or_none)
    nesterov: bool = static(True)
    adaptive: bool = static(False)
    mask: Any = static(None, converter=optional_selector)
    weight_dimension_numbers: Any = static(None, converter=_dimension_numbers)

    def state_keys(self) -> tuple[str, ...]:
        """The momentum `mu` and the step `count` of each selected matrix."""
        return ("mu", "count")

    def init_state(self, params: Params) -> dict:
        """Slots for the selected matrices only (packed params are refused)."""
        reject_packed(params, self.name, "orthogonalises each matrix on its own")
        where = set(_muon_leaves(self, params, strict=True))
        return init_slots(params, self.init_leaf, self.state_keys(), where=where)

    def selected_paths(self, updates: Updates, params: Params) -> set[str] | None:
        """The selected matrices among the present paths; others pass through unchanged."""
        tree = updates if params is None else params
        return set(_muon_leaves(self, tree, strict=False))

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Momentum, bias correction, then Newton-Schulz orthogonalisation of a matrix."""
        return self.muon_direction(g, slots)

    def transform_slots(self, updates: Updates, slots: dict, params: Params) -> tuple[Any, dict]:
        """The Muon step of every selected path, along its matrix axes."""
        tree = updates if params is None else params
        for axes, paths in _grouped(_muon_leaves(self, tree, strict=False)).items():
            # Plain matrices take `update_leaf`, traced once per leaf signature.
            leaf = traced_once(self) if axes == MATRIX else partial(self.muon_direction, axes=axes)
            updates, slots = update_slots(
                leaf, updates, slots, params, owner=self.name, where=paths, per_leaf=True
            )
        return updates, slots


def scale_by_muon(
    ns_coeffs: Any = DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: float = 0.95,
    eps: float = 1e-8,
    mu_dtype: Any = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    mask: Any = None,
    weight_dimension_numbers: Any = None,
) -> ScaleByMuon:
    r"""Replace the update of each selected matrix by its orthogonalised momentum.

    Per selected path, with step $t$ counted per path:

    $$m_t = \beta m_{t-1} + (1-\beta) g_t,\qquad
      \hat m_t = \frac{\beta\, m_t}{1-\beta^{t+1}} + \frac{(1-\beta)\, g_t}{1-\beta^t}
      \ \text{(Nesterov) or}\ \frac{m_t}{1-\beta^t}$$

    $$u_t = \operatorname{NS}(\hat m_t)\quad\text{or, with `adaptive`,}\quad
      u_t = \langle \hat m_t, \operatorname{NS}(\hat m_t)\rangle\, \operatorname{NS}(\hat m_t)$$

    where NS is `orthogonalize_via_newton_schulz` (Frobenius pre-scaling; optax's other
    `preconditioning` options are not implemented). The orthogonalisation needs each whole
    matrix, so packed params are refused. Paths the mask does not select pass through
    unchanged and keep no state; `muon` sends them to Adam instead.

    A leaf of more than 2 dimensions (a convolution kernel) is orthogonalised as matrices
    once `weight_dimension_numbers` names its axes, as optax's `MuonDimensionNumbers` do: a
    pair `(reduction_axis, output_axis)`, each an axis or a tuple of axes. The reduction axes
    form the rows and the output axes the columns of each matrix; every other axis is a batch
    axis, whose slices are orthogonalised one by one. JAX's convolution kernels are HWIO, so
    `((0, 1, 2), 3)` orthogonalises each kernel as one `(H*W*I, O)` matrix, and `(2, 3)` each
    spatial tap's `(I, O)` matrix.

    Args:
        ns_coeffs: the Newton-Schulz coefficients $(a, b, c)$, a tuple of triples (one per
            iteration), or a preset name (`"standard"`, `"dion"`).
        ns_steps: the number of iterations with a single triple.
        beta: decay of the momentum.
        eps: added to the Frobenius norm before the iterations.
        mu_dtype: dtype of `mu` (default: the parameter's dtype).
        nesterov: use Nesterov momentum.
        adaptive: scale by the dual norm $\langle \hat m, \operatorname{NS}(\hat m)\rangle$.
        mask: selector of the paths to orthogonalise: the 2-D leaves among them, and those
            of more than 2 dimensions that `weight_dimension_numbers` gives axes (default:
            every 2-D leaf). Selecting a leaf of more than 2 dimensions without axes is an
            error.
        weight_dimension_numbers: the matrix axes of leaves of more than 2 dimensions: one
            pair `(reduction_axis, output_axis)` (or `optax.contrib.MuonDimensionNumbers`)
            for all of them, or `{selector: pair}` by path (a 2-D leaf may be given one
            too); default none.

    State:
        `mu/<path>` shaped like the matrix and `count/<path>` (int32), for selected paths.

    Examples:
        >>> tx = gradtx.contrib.scale_by_muon()
        >>> params = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}
        >>> sorted(gradtx.state_dict(tx.init(params)))
        ['count/w', 'mu/w']
        >>> u, _ = tx.update({"w": jnp.eye(2, 3), "b": jnp.ones(3)}, tx.init(params))
        >>> u["b"]  # not a matrix: unchanged
        Array([1., 1., 1.], dtype=float32)

    References:
        Jordan et al., "Muon: An optimizer for hidden layers in neural networks", 2024
        (github.com/KellerJordan/modded-nanogpt); Bernstein & Newhouse, "Old Optimizer, New
        Norm: An Anthology", 2024.
    """
    return ScaleByMuon(
        ns_coeffs,
        int(ns_steps),
        beta,
        eps,
        mu_dtype,
        nesterov,
        adaptive,
        mask,
        weight_dimension_numbers,
    )


class Muon(_MuonMath, PerArrayTransform):
    """Muon for the selected matrices, AdamW for the other paths (see `muon`)."""

    name: ClassVar[str] = "muon"
    mask_argument: ClassVar[str] = "muon_mask"
    dims_argument: ClassVar[str] = "muon_weight_dimension_numbers"
    # Adam's second moment of the other paths follows the parameter's dtype.
    float16_check: ClassVar[Float16Check] = Float16Check(("nu",), "Adam's second moment", None)
    needs_params: ClassVar[bool] = True
    per_leaf_structure: ClassVar[bool] = True
    learning_rate: Any = hyperparam(required=True)
    ns_coeffs: Any = field(default=DEFAULT_NS_COEFFS, converter=_coeff_leaves)
    ns_steps: int = static(5)
    beta: Any = hyperparam(0.95)
    eps: Any = hyperparam(1e-8, check=non_negative)
    weight_decay: Any = hyperparam(0.0)
    weight_decay_mask: Any = static(None, converter=optional_selector)
    mu_dtype: Any = static(None, converter=dtype_or_none)
    nesterov: bool = static(True)
    adaptive: bool = static(False)
    adam_b1: Any = hyperparam(0.9, check=decay_rate)
    adam_b2: Any = hyperparam(0.999, check=decay_rate)
    adam_eps_root: Any = hyperparam(0.0, check=non_negative)
    adam_weight_decay: Any = hyperparam(0.0)
    adam_learning_rate: Any = hyperparam(None)
    muon_mask: Any = static(None, converter=optional_selector)
    consistent_rms: Any = hyperparam(None)
    muon_weight_dimension_numbers: Any = static(None, converter=_dimension_numbers)

    def state_keys(self) -> tuple[str, ...]:
        """`mu` and `count` for every path, `nu` for the Adam paths."""
        return ("mu", "nu", "count")

    def _adam(self) -> ScaleByAdam:
        return ScaleByAdam(
            self.adam_b1,
            self.adam_b2,
            self.eps,
            self.adam_eps_root,
            self.mu_dtype,
            None,
            self.nesterov,
        )

    def _groups(self, tree: Any, strict: bool) -> tuple[dict[str, Axes], set, set]:
        """(matrix axes of the Muon paths, decayed Muon paths, Adam paths) among the present."""
        present = set(present_paths(tree))
        matrices = _muon_leaves(self, tree, strict)
        if self.weight_decay_mask is None:
            decayed = set(matrices)
        else:
            chosen = select(
                tree, self.weight_decay_mask, strict=strict, argument="weight_decay_mask"
            )
            decayed = set(matrices) & set(chosen)
        return matrices, decayed, present - set(matrices)

    def init_state(self, params: Params) -> dict:
        """`mu`/`count` for every path and `nu` for the Adam paths (packed params refused)."""
        reject_packed(params, self.name, "splits the params into matrices and other leaves")
        matrices, _, adam = self._groups(params, strict=True)
        warn_float16_statistics(self, params, adam)
        muon_slots = init_slots(params, self.init_leaf, ("mu", "count"), where=set(matrices))
        others = init_slots(params, self._adam().init_leaf, self.state_keys(), where=adam)
        return {name: {**muon_slots.get(name, {}), **others[name]} for name in self.state_keys()}

    def _shape_factor(self, shape: tuple[int, ...], axes: Axes, dtype: Any) -> Any:
        fan_in, fan_out = (math.prod(shape[a] for a in part) for part in axes)
        if self.consistent_rms is None:
            return jnp.asarray(np.sqrt(max(1.0, fan_out / fan_in)), dtype)
        return jnp.asarray(np.sqrt(max(fan_in, fan_out)), dtype) * self.consistent_rms.astype(dtype)

    def _matrix_step(
        self, decay: bool, axes: Axes, g: Any, slots: dict, param: Any
    ) -> tuple[Any, dict]:
        """The Muon step of one matrix, scaled for its shape, decayed if `decay`."""
        u, new = self.muon_direction(g, slots, axes=axes)
        u = u * self._shape_factor(g.shape, axes, u.dtype)
        if decay:
            u = u + self.weight_decay.astype(u.dtype) * param.astype(u.dtype)
        lr = hyperparam_at(self.learning_rate, slots["count"]).astype(u.dtype)
        return -lr * u, new

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Muon steps for the matrices, AdamW steps for the rest, each at its learning rate."""
        self.check_state(state)
        if params is None:
            raise needs_params_error(self.name)
        matrices, decayed, adam = self._groups(params, strict=False)
        adam_lr = self.learning_rate if self.adam_learning_rate is None else self.adam_learning_rate

        def adam_step(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            u, new = self._adam().update_leaf(g, slots, param)
            dtype = compute_dtype(g, param)
            u = u.astype(dtype) + self.adam_weight_decay.astype(dtype) * param.astype(dtype)
            lr = hyperparam_at(adam_lr, slots["count"]).astype(dtype)
            return -lr * u, new

        lift = partial(update_slots, params=params, owner=self.name, per_leaf=True)
        out, slots = updates, {"mu": state["mu"], "count": state["count"]}
        groups = _grouped({p: (axes, p in decayed) for p, axes in matrices.items()})
        for (axes, decay), where in groups.items():
            out, slots = lift(partial(self._matrix_step, decay, axes), out, slots, where=where)
        slots = {"mu": slots["mu"], "nu": state["nu"], "count": slots["count"]}
        if adam:
            out, slots = lift(adam_step, out, slots, where=adam)
        return out, slots


def muon(
    learning_rate: ScalarOrSchedule,
    ns_coeffs: Any = DEFAULT_NS_COEFFS,
    ns_steps: int = 5,
    beta: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    mu_dtype: Any = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    adam_eps_root: float = 0.0,
    adam_weight_decay: float = 0.0,
    adam_learning_rate: ScalarOrSchedule | None = None,
    muon_mask: Any = None,
    consistent_rms: float | None = None,
    muon_weight_dimension_numbers: Any = None,
) -> Muon:
    r"""Muon: orthogonalised momentum for matrices, AdamW for every other parameter.

    For each 2-D leaf that the selector `muon_mask` picks (default: all of them), with the
    direction $O_t$ of `scale_by_muon` and $W \in \mathbb{R}^{n_{in} \times n_{out}}$:

    $$\theta_t = \theta_{t-1} - \eta_t \left(s\, O_t + \lambda\, \theta_{t-1}\right),\qquad
      s = \sqrt{\max(1,\ n_{out}/n_{in})}\ \text{ or }\ \rho\sqrt{\max(n_{in}, n_{out})}$$

    (the second with `consistent_rms` $= \rho$; the decay $\lambda$ only on the paths
    `weight_decay_mask` selects). Every other path takes an AdamW step,
    $\theta_t = \theta_{t-1} - \eta^{adam}_t (\mathrm{adam}_t + \lambda_{adam}\theta_{t-1})$,
    with `adam_b1`, `adam_b2`, `eps`, `adam_eps_root`, Nesterov as `nesterov`, and the learning
    rate `adam_learning_rate` (default: `learning_rate`). Learning-rate schedules are
    evaluated at each path's step count. Packed params are refused (the split and the
    orthogonalisation are per matrix).

    Leaves of more than 2 dimensions take Adam steps unless `muon_weight_dimension_numbers`
    gives their matrix axes (as optax's; see `scale_by_muon`): a convolution kernel in JAX's
    HWIO layout with `((0, 1, 2), 3)` is one matrix of $n_{in} = H W I$ rows and
    $n_{out} = O$ columns, which also give the scale $s$. `muon_mask` selecting such a
    leaf without its axes is an error.

    Args:
        learning_rate: the learning rate of the matrices (a number or a schedule).
        ns_coeffs: the Newton-Schulz coefficients, a tuple of triples, or a preset name.
        ns_steps: the number of Newton-Schulz iterations with a single triple.
        beta: decay of the momentum of the matrices.
        eps: added to the Frobenius norm before the iterations, and Adam's epsilon.
        weight_decay: decoupled decay of the matrices (multiplied by the learning rate).
        weight_decay_mask: selector of the matrices to decay (default: all of them).
        mu_dtype: dtype of the momenta (default: the parameter's dtype).
        nesterov: use Nesterov momentum (both for Muon and for Adam).
        adaptive: scale the matrices' updates by the dual norm (see `scale_by_muon`).
        adam_b1: decay of Adam's first moment.
        adam_b2: decay of Adam's second moment.
        adam_eps_root: added inside Adam's square root.
        adam_weight_decay: decoupled decay of the Adam paths.
        adam_learning_rate: the learning rate of the Adam paths (default: `learning_rate`).
        muon_mask: selector of the paths for Muon; the 2-D leaves among them and those given
            axes by `muon_weight_dimension_numbers` take Muon steps (default: every 2-D leaf),
            all other leaves take Adam steps.
        consistent_rms: $\rho$ for shape-independent update sizes (0.2 matches AdamW's), or
            `None` for the width scaling $\sqrt{\max(1, n_{out}/n_{in})}$.
        muon_weight_dimension_numbers: the matrix axes of leaves of more than 2 dimensions
            (a pair `(reduction_axis, output_axis)` for all of them, or `{selector: pair}`),
            which then take Muon steps (see `scale_by_muon`).

    State:
        `mu/<path>` and `count/<path>` for every path; `nu/<path>` for the Adam paths.

    Examples:
        >>> tx = gradtx.contrib.muon(0.02)
        >>> params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
        >>> sorted(gradtx.state_dict(tx.init(params)))
        ['count/b', 'count/w', 'mu/b', 'mu/w', 'nu/b']
        >>> tx = gradtx.contrib.muon(0.02, muon_mask="!head/**")  # the head's matrix: Adam
        >>> conv = {"conv": jnp.ones((3, 3, 4, 8)), "b": jnp.zeros(8)}  # an HWIO kernel
        >>> tx = gradtx.contrib.muon(0.02, muon_weight_dimension_numbers={"conv": ((0, 1, 2), 3)})
        >>> sorted(gradtx.state_dict(tx.init(conv)))
        ['count/b', 'count/conv', 'mu/b', 'mu/conv', 'nu/b']

    References:
        Jordan et al., "Muon: An optimizer for hidden layers in neural networks", 2024
        (github.com/KellerJordan/modded-nanogpt); Liu et al., "Muon is Scalable for LLM
        Training", 2025.
    """
    return Muon(
        learning_rate,
        ns_coeffs,
        int(ns_steps),
        beta,
        eps,
        weight_decay,
        weight_decay_mask,
        mu_dtype,
        nesterov,
        adaptive,
        adam_b1,
        adam_b2,
        adam_eps_root,
        adam_weight_decay,
        adam_learning_rate,
        muon_mask,
        consistent_rms,
        muon_weight_dimension_numbers,
    )
