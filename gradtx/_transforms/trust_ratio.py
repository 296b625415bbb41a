"""Layer-wise trust ratios (LARS, LAMB): each array's update scaled to its parameter's norm."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._combinators.chain import Chain
from gradtx._core.lift import compute_dtype
from gradtx._core.module import hyperparam, static
from gradtx._core.stacked import StackedTransform, as_stacked
from gradtx._optimizers.optimizers import optimizer
from gradtx._paths.selectors import select
from gradtx._transforms.adam import scale_by_adam
from gradtx._transforms.clipping import _sum_of_squares
from gradtx._transforms.scale import ScalarOrSchedule, scale_by_learning_rate
from gradtx._transforms.trace import trace
from gradtx._transforms.weight_decay import _optional_selector, add_decayed_weights

__all__ = ["lamb", "lars", "scale_by_trust_ratio"]


def norm_of(x: Any, dtype: Any) -> Any:
    """The L2 norm of a whole array, in `dtype`."""
    return jnp.sqrt(_sum_of_squares(x).astype(dtype))


class ScaleByTrustRatio(StackedTransform):
    """`u = g * c * ||param|| / (||g|| + eps)` per leaf (see `scale_by_trust_ratio`)."""

    name: ClassVar[str] = "scale_by_trust_ratio"
    needs_params: ClassVar[bool] = True
    min_norm: Any = hyperparam(0.0)
    trust_coefficient: Any = hyperparam(1.0)
    eps: Any = hyperparam(0.0)
    mask: Any = static(None, converter=_optional_selector)
    stacked: Any = static((), converter=as_stacked)

    def init(self, params: Any) -> dict:
        """No state; a `mask` or `stacked` selector that matches nothing fails here."""
        if self.mask is not None:
            select(params, self.mask, argument="scale_by_trust_ratio(mask=...)")
        return super().init(params)

    def selected_paths(self, updates: Any, params: Any) -> set[str] | None:
        """The paths the mask selects (all of them without a mask)."""
        if self.mask is None:
            return None
        tree = updates if params is None else params
        return set(select(tree, self.mask, strict=False, argument="mask"))

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """Scale one array by its trust ratio (1 where either clamped norm is zero)."""
        dtype = compute_dtype(g, param)
        lo = self.min_norm.astype(dtype)
        p_norm = jnp.maximum(norm_of(param, dtype), lo)
        g_norm = jnp.maximum(norm_of(g, dtype), lo)
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


def lamb(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    eps_root: float = 0.0,
    weight_decay: float = 0.0,
    *,
    mask: Any = None,
    stacked: Any = None,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> Chain:
    r"""LAMB: Adam's direction with decoupled weight decay, scaled per layer by a trust ratio.

    `chain(scale_by_adam(b1, b2, eps, eps_root), add_decayed_weights(weight_decay, mask),
    scale_by_trust_ratio(), scale_by_learning_rate(learning_rate))`. Per leaf, with
    $r = \hat m_t / (\sqrt{\hat v_t + \epsilon_{root}} + \epsilon) + \lambda\theta$:

    $$\theta_{t} = \theta_{t-1} - \eta\, \frac{\lVert\theta_{t-1}\rVert}{\lVert r\rVert}\, r$$

    Args:
        learning_rate: a number or a schedule.
        b1: decay of the first moment.
        b2: decay of the second moment.
        eps: added to the denominator outside the square root.
        eps_root: added inside the square root.
        weight_decay: the decoupled decay rate $\lambda$.
        mask: a selector of the paths to decay (default: all).
        stacked: `{selector: n}` for stacked layers: the trust ratio is taken per slice of the
            first `n` axes.
        mu_dtype: dtype of the first moment (default: the parameter's dtype).
        nu_dtype: dtype of the second moment (default: the parameter's dtype).

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.lamb(1e-3, weight_decay=0.01, mask="!**/bias")
        >>> params = {"w": jnp.array([3.0, 4.0]), "bias": jnp.zeros(2)}
        >>> u, _ = tx.update({"w": jnp.ones(2), "bias": jnp.ones(2)}, tx.init(params), params)
        >>> round(float(jnp.linalg.norm(u["w"])), 6)  # lr * ||w||
        0.005
        >>> u["bias"]  # a zero parameter: trust ratio 1, so u = -lr * adam direction
        Array([-0.001, -0.001], dtype=float32)

    References:
        You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes",
        2020.
    """
    return optimizer(
        "lamb",
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype),
        add_decayed_weights(weight_decay, mask),
        scale_by_trust_ratio(stacked=stacked),
        scale_by_learning_rate(learning_rate),
    )


def lars(
    learning_rate: ScalarOrSchedule,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    trust_coefficient: float = 0.001,
    eps: float = 0.0,
    trust_ratio_mask: Any = None,
    momentum: float = 0.9,
    nesterov: bool = False,
    *,
    stacked: Any = None,
    accumulator_dtype: Any = None,
) -> Chain:
    r"""LARS: SGD with momentum whose step is scaled per layer by a trust ratio.

    `chain(add_decayed_weights(weight_decay, weight_decay_mask),
    scale_by_trust_ratio(trust_coefficient=..., eps=..., mask=trust_ratio_mask),
    scale_by_learning_rate(learning_rate), trace(momentum, nesterov))`, as in optax. Per leaf,
    with $r = g + \lambda\theta$ and $c$ the trust coefficient:

    $$s_t = -\eta\, \frac{c\,\lVert\theta\rVert}{\lVert r\rVert + \epsilon}\, r,\qquad
      t_k = s_k + \mu\, t_{k-1},\qquad u_k = t_k\ \ (\text{Nesterov: } s_k + \mu\, t_k)$$

    Args:
        learning_rate: a number or a schedule.
        weight_decay: the decay rate $\lambda$.
        weight_decay_mask: a selector of the paths to decay (default: all).
        trust_coefficient: the multiplier $c$ of the trust ratio.
        eps: added to the update norm in the trust ratio's denominator.
        trust_ratio_mask: a selector of the paths whose step is scaled by the trust ratio
            (default: all); a common choice leaves out biases and norms (`"!**/bias"`).
        momentum: the momentum coefficient $\mu$.
        nesterov: use Nesterov momentum.
        stacked: `{selector: n}` for stacked layers: the trust ratio is taken per slice of the
            first `n` axes.
        accumulator_dtype: dtype of the momentum buffer (default: the parameter's dtype).

    State:
        `trace/<path>`; `schedule_count/<path>` with a schedule.

    Examples:
        >>> tx = gradtx.lars(0.1, trust_coefficient=1.0, momentum=0.0)
        >>> params = {"w": jnp.array([3.0, 4.0])}
        >>> u, _ = tx.update({"w": jnp.array([1.0, 1.0])}, tx.init(params), params)
        >>> u["w"].round(4)  # -lr * (||w|| / ||g||) * g
        Array([-0.3536, -0.3536], dtype=float32)

    References:
        You et al., "Large Batch Training of Convolutional Networks", 2017.
    """
    return optimizer(
        "lars",
        add_decayed_weights(weight_decay, weight_decay_mask),
        scale_by_trust_ratio(
            trust_coefficient=trust_coefficient, eps=eps, mask=trust_ratio_mask, stacked=stacked
        ),
        scale_by_learning_rate(learning_rate),
        trace(momentum, nesterov, accumulator_dtype=accumulator_dtype),
    )
