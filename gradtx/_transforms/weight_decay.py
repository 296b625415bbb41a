"""Decoupled weight decay: add `weight_decay * param` to the update."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import cast, compute_dtype
from gradtx._core.module import hyperparam, static
from gradtx._core.per_array import PerArrayTransform
from gradtx._core.protocol import Params, Transformation, Updates
from gradtx._paths.selectors import as_selector, select


def optional_selector(mask: Any, name: str = "mask") -> Any:
    return None if mask is None else as_selector(mask, name)


class SelectsByMask:
    """A per-array transformation acting on the paths its `mask` selects (all without one)."""

    __slots__ = ()
    name: ClassVar[str]
    mask: Any  # each class's own static field, converted by `optional_selector`

    def check_mask(self, params: Params) -> None:
        """Raise when the `mask` matches no path of `params` (it is almost always a typo)."""
        if self.mask is not None:
            select(params, self.mask, argument=f"{self.name}(mask=...)")

    def selected_paths(self, updates: Updates, params: Params) -> set[str] | None:
        """The paths the mask selects among those present (all of them without a mask)."""
        if self.mask is None:
            return None
        tree = updates if params is None else params
        return set(select(tree, self.mask, strict=False, argument="mask"))


class AddDecayedWeights(SelectsByMask, PerArrayTransform):
    """`u = g + weight_decay * param` on the selected paths (see `add_decayed_weights`)."""

    name: ClassVar[str] = "add_decayed_weights"
    needs_params: ClassVar[bool] = True
    weight_decay: Any = hyperparam(0.0)
    mask: Any = static(None, converter=optional_selector)

    def init_state(self, params: Params) -> dict:
        """No state; a `mask` that matches nothing fails here."""
        self.check_mask(params)
        return {}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = g + weight_decay * param`."""
        return self._decayed(g, param, None), {}

    def masked_update_leaf(self, g: Any, slots: dict, param: Any, selected: Any) -> tuple:
        """`update_leaf` where `selected`, `g` unchanged elsewhere, reading `g` once.

        It adds `where(selected, weight_decay, 1) * where(selected, param, -0.0)`: adding
        -0.0 leaves every value as it was, bit for bit (-0.0 and NaN included), so this
        equals selecting between `g + weight_decay * param` and `g` (subnormal values of `g`
        excepted: XLA's CPU arithmetic flushes them to zero). The product feeds the sum
        directly, as in `update_leaf`: with a select between them, a processor with fused
        multiply-adds rounded the product on its own here and not in `update_leaf`, one ulp
        apart (a packed buffer against the per-leaf layout). Selecting reads
        `g` twice, and XLA then writes `g` to memory before this kernel when `g` is costly
        math of its own (Adam's direction in `adamw`), which slows the masked AdamW step
        (benchmarks/lab/host_overhead.py).
        """
        return self._decayed(g, param, selected), {}

    def _decayed(self, g: Any, param: Any, selected: Any) -> Any:
        dtype = compute_dtype(g, param)
        rate, param = cast(self.weight_decay, dtype), cast(param, dtype)
        if selected is not None:
            # 1 * -0.0 where unselected; no select between product and sum (docstring above).
            rate = jnp.where(selected, rate, jnp.asarray(1.0, dtype))
            param = jnp.where(selected, param, jnp.asarray(-0.0, dtype))
        return cast(cast(g, dtype) + rate * param, g.dtype)


def add_decayed_weights(weight_decay: float = 0.0, mask: Any = None) -> AddDecayedWeights:
    r"""Add decoupled weight decay to the updates: $u = g + \lambda\,\theta$.

    Args:
        weight_decay: the decay rate $\lambda$ (a float32 leaf).
        mask: a selector of the paths to decay (globs, regex, bool tree or function; see
            `gradtx.paths`); default: every path. A mask that matches nothing raises at `init`.

    Examples:
        >>> tx = gradtx.add_decayed_weights(0.1, mask="!**/bias")
        >>> params = {"w": jnp.ones(2), "bias": jnp.ones(2)}
        >>> u, _ = tx.update({"w": jnp.zeros(2), "bias": jnp.zeros(2)}, tx.init(params), params)
        >>> u["w"], u["bias"]
        (Array([0.1, 0.1], dtype=float32), Array([0., 0.], dtype=float32))
    """
    return AddDecayedWeights(weight_decay, mask)


def is_literal_zero(value: Any) -> bool:
    """A plain Python zero (not an array, which may be traced or swept)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def decay_unless_zero(weight_decay: Any, mask: Any) -> list[Transformation]:
    """`[add_decayed_weights(...)]`, or nothing for a literal zero decay without a mask."""
    if is_literal_zero(weight_decay) and mask is None:
        return []
    return [add_decayed_weights(weight_decay, mask)]
