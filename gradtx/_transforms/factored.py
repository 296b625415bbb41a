"""Adafactor's factored second moments (Shazeer & Stern, 2018): `scale_by_factored_rms`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, cast

import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import as_stored, compute_dtype, dtype_or_none, zeros_for
from gradtx._core.module import as_int, field, hyperparam, non_negative, static
from gradtx._core.per_array import Float16Check
from gradtx._core.stacked import StackedTransform, as_stacked
from gradtx._layouts.step_counts import next_count
from gradtx._paths.paths import flatten, virtual


def factored_dims(
    shape: tuple[int, ...], factored: bool, min_dim_size_to_factor: int
) -> tuple[int, int] | None:
    """`(d1, d0)`: the axes of the second largest and the largest dimension, or `None`.

    An array is factored when `factored` is set, it has at least two dimensions and its
    second largest dimension has at least `min_dim_size_to_factor` elements. Ties go to the
    earlier axis being "smaller" (a stable sort), so a square matrix gives `(0, 1)`.
    """
    if not factored or len(shape) < 2:
        return None
    order = np.argsort(np.asarray(shape), kind="stable")
    if shape[order[-2]] < min_dim_size_to_factor:
        return None
    return int(order[-2]), int(order[-1])


def _without(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return shape[:axis] + shape[axis + 1 :]


class ScaleByFactoredRms(StackedTransform):
    """Scale by Adafactor's (factored) second-moment estimate (see `scale_by_factored_rms`)."""

    name: ClassVar[str] = "scale_by_factored_rms"
    unpackable: ClassVar[str] = "keeps factored moments whose shapes differ from the params'"
    float16_check: ClassVar[Float16Check] = Float16Check(
        ("v_row", "v_col", "v"), "the second moments", "v_dtype"
    )
    factored: bool = static(True)
    decay_rate: Any = hyperparam(0.8)
    step_offset: Any = field(default=0, converter=as_int)
    min_dim_size_to_factor: int = static(128)
    epsilon: Any = hyperparam(1e-30, check=non_negative)
    decay_rate_fn: Any = static(None)
    stacked: Any = static((), converter=as_stacked)
    v_dtype: Any = static(None, converter=dtype_or_none)

    def state_keys(self) -> tuple[str, ...]:
        """`v_row`, `v_col` (factored paths), `v` (the others) and every path's `count`."""
        return ("v_row", "v_col", "v", "count")

    def _dims(self, shape: tuple[int, ...]) -> tuple[int, int] | None:
        return factored_dims(shape, self.factored, self.min_dim_size_to_factor)

    def slot_groups(self, tree: Any, depth: dict[str, int]) -> tuple:
        """Factored paths keep `v_row`, `v_col`; the others `v`; all keep `count`."""
        paths, leaves, _ = flatten(virtual(tree))
        split: dict[bool, set[str]] = {True: set(), False: set()}
        for path, leaf in zip(paths, leaves):
            if leaf is not None:
                shape = tuple(np.shape(leaf))[depth.get(path, 0) :]
                split[self._dims(shape) is not None].add(path)
        return (("v_row", "v_col", "count"), split[True]), (("v", "count"), split[False])

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Zeros in `v_dtype`: `v` like the param, or the reduced `v_row`, `v_col`."""
        count = jnp.zeros((), jnp.int32)
        shape = tuple(param.shape)
        dims = self._dims(shape)
        if dims is None:
            return {"v": zeros_for(param, self.v_dtype), "count": count}
        d1, d0 = dims
        dtype = param.dtype if self.v_dtype is None else self.v_dtype
        return {
            "v_row": jnp.zeros(_without(shape, d0), dtype),
            "v_col": jnp.zeros(_without(shape, d1), dtype),
            "count": count,
        }

    def _decay(self, new_count: Any, dtype: Any) -> Any:
        """The decay of the step whose count after it is `new_count` (see `next_count`)."""
        step = new_count - 1 - self.step_offset
        if self.decay_rate_fn is not None:
            return jnp.asarray(self.decay_rate_fn(step, self.decay_rate)).astype(dtype)
        t = (step + 1).astype(dtype)
        return 1 - t ** (-self.decay_rate.astype(dtype))

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Divide by the root of the full second moment, or of its rank-one estimate."""
        dtype = compute_dtype(g, *(v for k, v in slots.items() if k != "count"))
        count = next_count(slots["count"])
        beta = self._decay(count, dtype)
        grad = g.astype(dtype)
        g2 = grad * grad + self.epsilon.astype(dtype)
        if "v" in slots:
            v = as_stored(beta * slots["v"].astype(dtype) + (1 - beta) * g2, slots["v"])
            return grad / jnp.sqrt(v), {"v": v, "count": count}
        d1, d0 = cast("tuple[int, int]", self._dims(tuple(g.shape)))  # it keeps v_row, v_col
        old_row, old_col = slots["v_row"], slots["v_col"]
        row = beta * old_row.astype(dtype) + (1 - beta) * jnp.mean(g2, axis=d0)
        col = beta * old_col.astype(dtype) + (1 - beta) * jnp.mean(g2, axis=d1)
        row, col = as_stored(row, old_row), as_stored(col, old_col)
        # v_row lost axis d0: axis d1 of the array is axis d1 or d1 - 1 of v_row.
        row_mean = jnp.mean(row, axis=d1 - 1 if d1 > d0 else d1, keepdims=True)
        row_factor = jnp.expand_dims(1 / jnp.sqrt(row / row_mean), d0)
        col_factor = jnp.expand_dims(1 / jnp.sqrt(col), d1)
        return grad * row_factor * col_factor, {"v_row": row, "v_col": col, "count": count}


def scale_by_factored_rms(
    factored: bool = True,
    decay_rate: float = 0.8,
    step_offset: int = 0,
    min_dim_size_to_factor: int = 128,
    epsilon: float = 1e-30,
    decay_rate_fn: Callable[[Any, Any], Any] | None = None,
    *,
    stacked: Any = None,
    v_dtype: Any = None,
) -> ScaleByFactoredRms:
    r"""Scale updates by Adafactor's factored estimate of the gradients' root mean square.

    Per path, at its step $t = k - k_0 + 1$ ($k$ the path's earlier updates, $k_0$ =
    `step_offset`), with decay $\hat\beta_t = 1 - t^{-c}$ ($c$ = `decay_rate`; $\hat\beta_1 =
    0$) and $G = g^2 + \epsilon_1$:

    - an array whose two largest dimensions $d_0$ (largest) and $d_1$ (second) both have at
      least `min_dim_size_to_factor` elements keeps only their means,
      $R_t = \hat\beta_t R_{t-1} + (1-\hat\beta_t)\operatorname{mean}_{d_0} G$ and
      $C_t = \hat\beta_t C_{t-1} + (1-\hat\beta_t)\operatorname{mean}_{d_1} G$, and divides by
      the rank-one estimate $\hat V = R_t\, C_t / \operatorname{mean}_{d_1} R_t$:
      $u = g / \sqrt{\hat V}$;
    - any other array keeps the full $V_t = \hat\beta_t V_{t-1} + (1-\hat\beta_t) G$ and
      $u = g / \sqrt{V_t}$.

    Memory for an $n\times m$ matrix is $n + m$ instead of $nm$. The moments have per-leaf
    shapes unlike the params', so packed params are refused.

    Args:
        factored: factor the moments of arrays that qualify (else every array keeps a full
            `v`).
        decay_rate: the exponent $c$ of the decay schedule.
        step_offset: the step $k_0$ at which the schedule starts (for fine-tuning).
        min_dim_size_to_factor: factor only if the second largest dimension is this large.
        epsilon: $\epsilon_1$, added to the squared gradients.
        decay_rate_fn: a function `(step, decay_rate) -> decay` replacing $1 - t^{-c}$
            (`step` = $k - k_0$, an int32 array); kept as static structure.
        stacked: `{selector: n}`: selected leaves are stacks of independent arrays along their
            first `n` axes; each slice is factored (or not) by its own shape, exactly as
            separate leaves, and its moments are stacked the same way.
        v_dtype: dtype of `v_row`, `v_col` and `v` (default: the parameter's dtype; float16
            params need float32 here, since squared gradients underflow in float16).

    State:
        `v_row/<path>` and `v_col/<path>` (the array's shape without axis $d_0$, resp. $d_1$)
        for factored paths, `v/<path>` (the param's shape) for the others, all in `v_dtype`;
        `count/<path>` an int32 scalar.

    Examples:
        >>> tx = gradtx.scale_by_factored_rms(min_dim_size_to_factor=2)
        >>> params = {"w": jnp.zeros((3, 4)), "b": jnp.zeros(4)}
        >>> {k: v.shape for k, v in gradtx.state_dict(tx.init(params)).items()}
        {'count/b': (), 'count/w': (), 'v/b': (4,), 'v_col/w': (4,), 'v_row/w': (3,)}
        >>> u, _ = tx.update({"w": jnp.ones((3, 4)), "b": -jnp.ones(4)}, tx.init(params))
        >>> u["b"]  # the first step divides by |g|
        Array([-1., -1., -1., -1.], dtype=float32)

    References:
        Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", 2018.
        Zhai et al., "Scaling Vision Transformers", 2021 (bounded decay schedules).
    """
    return ScaleByFactoredRms(
        factored,
        decay_rate,
        step_offset,
        min_dim_size_to_factor,
        epsilon,
        decay_rate_fn,
        stacked,
        v_dtype,
    )
