"""Layer-wise trust ratios: updates scaled to their parameter's norm (LARS, LAMB, Fromage)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import compute_dtype
from gradtx._core.module import hyperparam, is_schedule, non_negative, static
from gradtx._core.per_array import PerArrayTransform
from gradtx._core.protocol import Params
from gradtx._core.stacked import StackedTransform, as_stacked
from gradtx._transforms.block_rms import block_norm
from gradtx._transforms.scale import scheduled_value
from gradtx._transforms.weight_decay import SelectsByMask, optional_selector


class ScaleByTrustRatio(SelectsByMask, StackedTransform):
    """`u = g * c * ||param|| / (||g|| + eps)` per leaf (see `scale_by_trust_ratio`)."""

    name: ClassVar[str] = "scale_by_trust_ratio"
    needs_params: ClassVar[bool] = True
    min_norm: Any = hyperparam(0.0)
    trust_coefficient: Any = hyperparam(1.0)
    eps: Any = hyperparam(0.0, check=non_negative)
    mask: Any = static(None, converter=optional_selector)
    stacked: Any = static((), converter=as_stacked)

    def init_state(self, params: Params) -> dict:
        """No state; a `mask` or `stacked` selector that matches nothing fails here."""
        self.check_mask(params)
        return super().init_state(params)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Scale one array by its trust ratio (1 where either clamped norm is zero)."""
        dtype = compute_dtype(g, param)
        lo = self.min_norm.astype(dtype)
        p_norm = jnp.maximum(block_norm(param, dtype), lo)
        g_norm = jnp.maximum(block_norm(g, dtype), lo)
        zero = (p_norm == 0) | (g_norm == 0)
        tc, eps = self.trust_coefficient.astype(dtype), self.eps.astype(dtype)
        denominator = jnp.where(zero, jnp.ones_like(g_norm), g_norm + eps)
        ratio = jnp.where(zero, jnp.ones_like(p_norm), tc * p_norm / denominator)
        return (g.astype(dtype) * ratio).astype(g.dtype), {}


def scale_by_trust_ratio(
    min_norm: float = 0.0,
    trust_coefficient: float = 1.0,
    eps: float = 0.0,
    *,
    mask: Any = None,
    stacked: Any = None,
) -> ScaleByTrustRatio:
    r"""Scale each array's update by its trust ratio, the ratio of parameter to update norm.

    Per leaf (the norms are L2 norms of the whole array), with $n$ = `min_norm`:

    $$u = g\cdot \frac{c\,\max(\lVert\theta\rVert, n)}{\max(\lVert g\rVert, n) + \epsilon}$$

    and $u = g$ where either clamped norm is zero (a zero-initialised parameter still moves).
    $c$ is `trust_coefficient`. Packed params run leaf by leaf.

    Args:
        min_norm: the smallest norm used for a parameter or update array.
        trust_coefficient: the multiplier $c$ of the ratio.
        eps: added to the update norm in the denominator.
        mask: a selector of the paths to scale; others pass unchanged (default: all).
        stacked: `{selector: n}`: selected leaves are stacks of independent arrays along their
            first `n` axes, each scaled by its own trust ratio, exactly as separate leaves.

    State:
        None (`{}`); the update needs the params.

    Examples:
        >>> tx = gradtx.scale_by_trust_ratio()
        >>> params = {"w": jnp.array([3.0, 4.0])}
        >>> u, _ = tx.update({"w": jnp.array([0.0, 0.5])}, tx.init(params), params)
        >>> u["w"]
        Array([0., 5.], dtype=float32)

        Stacked layers: each of the two rows is its own leaf.

        >>> tx = gradtx.scale_by_trust_ratio(stacked={"layers": 1})
        >>> params = {"layers": jnp.array([[3.0, 4.0], [0.0, 1.0]])}
        >>> u, _ = tx.update({"layers": jnp.array([[1.0, 0.0], [2.0, 0.0]])}, {}, params)
        >>> u["layers"]
        Array([[5., 0.], [1., 0.]], dtype=float32)

    References:
        You et al., "Large Batch Training of Convolutional Networks", 2017.
    """
    return ScaleByTrustRatio(min_norm, trust_coefficient, eps, mask, stacked)


class FromageStep(PerArrayTransform):
    """`u = -(lr g + (1 - sqrt(1 + lr^2)) param) / sqrt(1 + lr^2)`, lr a number or schedule."""

    name: ClassVar[str] = "fromage_step"
    needs_params: ClassVar[bool] = True
    learning_rate: Any = hyperparam(required=True)

    def state_keys(self) -> tuple[str, ...]:
        """`schedule_count` when the learning rate is a schedule, else nothing."""
        return ("schedule_count",) if is_schedule(self.learning_rate) else ()

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A zero step count when the learning rate is a schedule."""
        return {"schedule_count": jnp.zeros((), jnp.int32)} if self.state_keys() else {}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """The Fromage step relative to the parameter, shrunk by `1 / sqrt(1 + lr^2)`."""
        dtype = compute_dtype(g, param)
        lr, changed = scheduled_value(self.learning_rate, slots)
        lr = lr.astype(dtype)
        root = jnp.sqrt(1 + lr * lr)
        # 1 / root - 1 without cancellation (it is about -lr^2 / 2 for small lr)
        shrink = -(lr * lr) / (root * (1 + root))
        u = -(lr / root) * g.astype(dtype) + shrink * param.astype(dtype)
        return u, changed
