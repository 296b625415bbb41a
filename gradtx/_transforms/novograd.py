"""NovoGrad: Adam-like momentum normalised by a per-array second moment (Ginsburg et al.)."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import as_stored, compute_dtype, dtype_or_none, zeros_for
from gradtx._core.module import decay_rate, hyperparam, non_negative, static
from gradtx._core.per_array import Float16Check, PerArrayTransform
from gradtx._layouts.step_counts import next_count
from gradtx._transforms.shared_args import with_shared_args
from gradtx._transforms.weight_decay import is_literal_zero
from gradtx._tree.reductions import sum_of_squares


class ScaleByNovograd(PerArrayTransform):
    """NovoGrad's layer-wise normalised momentum (see `scale_by_novograd`)."""

    name: ClassVar[str] = "scale_by_novograd"
    unpackable: ClassVar[str] = "keeps a scalar second moment per array"
    per_leaf_structure: ClassVar[bool] = True
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.25, check=decay_rate)
    eps: Any = hyperparam(1e-8, check=non_negative)
    eps_root: Any = hyperparam(0.0, check=non_negative)
    weight_decay: Any = hyperparam(None)
    mu_dtype: Any = static(None, converter=dtype_or_none)

    @property
    def needs_params(self) -> bool:  # type: ignore[override]
        """The params are needed only with weight decay."""
        return self.weight_decay is not None

    float16_check: ClassVar[Float16Check] = Float16Check(("nu",), "the second moment", None)

    def state_keys(self) -> tuple[str, ...]:
        """The momentum `mu`, the per-array second moment `nu` and the path's `count`."""
        return ("mu", "nu", "count")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A zero `mu` (in `mu_dtype`), a zero scalar `nu` (the param's dtype), count 0."""
        return {
            "mu": zeros_for(param, self.mu_dtype),
            "nu": jnp.zeros((), param.dtype),
            "count": jnp.zeros((), jnp.int32),
        }

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One NovoGrad step for one array; `nu` starts at the first `||g||^2`."""
        dtype = compute_dtype(g, slots["mu"], slots["nu"])
        b1, b2 = self.b1.astype(dtype), self.b2.astype(dtype)
        grad = g.astype(dtype)
        norm2 = sum_of_squares(g).astype(dtype)
        count = next_count(slots["count"])
        first = count == 1
        nu = jnp.where(first, norm2, b2 * slots["nu"].astype(dtype) + (1 - b2) * norm2)
        nu = as_stored(nu, slots["nu"])
        eps, eps_root = self.eps.astype(dtype), self.eps_root.astype(dtype)
        step = grad / (jnp.sqrt(nu + eps_root) + eps)
        if self.weight_decay is not None:
            step = step + self.weight_decay.astype(dtype) * param.astype(dtype)
        mu = as_stored(b1 * slots["mu"].astype(dtype) + step, slots["mu"])
        return mu, {"mu": mu, "nu": nu, "count": count}


@with_shared_args
def scale_by_novograd(
    b1: float = 0.9,
    b2: float = 0.25,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    weight_decay: float = 0.0,
    mu_dtype: Any = None,
) -> ScaleByNovograd:
    r"""Rescale updates by NovoGrad's momentum of layer-wise normalised gradients.

    Per path (one array, one "layer"), with a scalar second moment $v$:

    $$v_1 = \lVert g_1\rVert_2^2,\qquad
      v_t = \beta_2 v_{t-1} + (1-\beta_2)\lVert g_t\rVert_2^2$$

    $$m_t = \beta_1 m_{t-1} + \frac{g_t}{\sqrt{v_t + \epsilon_{root}} + \epsilon}
      + \lambda\,\theta_t,\qquad u_t = m_t$$

    with $m_0 = 0$. The norm needs the whole array, not one element at a time. The step is
    counted per path.

    Args:
        b1: decay of the momentum.
        weight_decay: the decay $\lambda$ added inside the momentum. A literal `0` (the
            default) needs no params; any other value makes `update` need them.

    State:
        `mu/<path>` shaped like the parameter; `nu/<path>` a scalar in the parameter's dtype;
        `count/<path>` (int32). Packed params (`gradtx.pack`) are refused: a packed buffer
        cannot hold one `nu` per array.

    Examples:
        >>> tx = gradtx.scale_by_novograd()
        >>> u, state = tx.update({"w": jnp.array([3.0, 4.0])}, tx.init({"w": jnp.zeros(2)}))
        >>> u["w"], state["nu"]["w"]
        (Array([0.6, 0.8], dtype=float32), Array(25., dtype=float32))

    References:
        Ginsburg et al., "Stochastic Gradient Methods with Layer-wise Adaptive Moments for
        Training of Deep Networks", 2019.
    """
    decay = None if is_literal_zero(weight_decay) else weight_decay
    return ScaleByNovograd(b1, b2, eps, eps_root, decay, mu_dtype)
