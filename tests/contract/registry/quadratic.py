"""The contract's quadratic as a loss, for the methods that read one.

The contract suite calls `update` with gradients only. Methods that need the loss (Polyak
steps, MoMo, reduce_on_plateau) or the objective (Sophia's Hessian estimate) are wrapped so
that each step gets the contract's quadratic at the params (`WithLoss`, `WithObjective`); the
optax oracles get the same (`OptaxWithLoss`, `OptaxWithObjective`) and the references the same
quadratic in float64 (`reference_loss`, `contract_hessian_diagonal`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import gradtx


def _curvature(n: int) -> np.ndarray:
    return np.linspace(0.5, 2.0, max(n, 1))


def _target(path: str) -> float:
    return 0.3 if path.endswith("b") else 1.0


def contract_loss(params: Any) -> jax.Array:
    """The contract suite's quadratic, `sum 0.5 * a * (p - c)^2`, in float32."""
    if isinstance(params, gradtx.Packed):
        params = params.unpack()
    total = jnp.zeros((), jnp.float32)
    for kp, p in jax.tree_util.tree_flatten_with_path(params)[0]:
        path = jax.tree_util.keystr(kp, simple=True, separator="/")
        a = jnp.asarray(_curvature(p.size), jnp.float32).reshape(p.shape)
        total = total + jnp.sum(0.5 * a * (p.astype(jnp.float32) - _target(path)) ** 2)
    return total


def reference_loss(params: dict[str, np.ndarray]) -> float:
    """The same quadratic over flat float64 params."""
    total = 0.0
    for path, p in params.items():
        a = _curvature(np.size(p)).reshape(np.shape(p))
        total += float(np.sum(0.5 * a * (np.asarray(p, np.float64) - _target(path)) ** 2))
    return total


class WithLoss(gradtx.Transformation):
    """Runs `inner` with `value=contract_loss(params)`: the contract calls `update` without a
    loss, and a Polyak step needs one."""

    name: ClassVar[str] = "with_loss"
    inner: Any = None

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        if params is None:
            raise ValueError("scale_by_polyak in the contract needs the params (for the loss).")
        extra = {**extra, "value": contract_loss(params)}
        return self.inner.update(updates, state, params, **extra)


class OptaxWithLoss:
    """The optax oracle, given the same loss as `value`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        return self.inner.update(updates, state, params, value=contract_loss(params))


def contract_hessian_diagonal(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The diagonal of the contract quadratic's Hessian: the curvatures, as float32 numbers
    (the quadratic is computed in float32)."""
    out = {}
    for path, p in params.items():
        a = np.asarray(_curvature(np.size(p)), np.float32).astype(np.float64)
        out[path] = a.reshape(np.shape(p))
    return out


def contract_loss_of_real_view(params: Any) -> jax.Array:
    """The contract quadratic of the params with each complex leaf as its real view
    `stack([re, im])` (tests/layouts/test_complex.py: a real objective of complex params)."""

    def real(x: Any) -> Any:
        return jnp.stack([x.real, x.imag]) if jnp.iscomplexobj(x) else x

    return contract_loss(jax.tree.map(real, params))


class WithObjective(gradtx.Transformation):
    """Runs `inner` with `obj_fn=objective` (the contract's quadratic): the contract calls
    `update` without the objective, which Sophia's Hessian estimate needs."""

    name: ClassVar[str] = "with_objective"
    inner: Any = None
    objective: Any = contract_loss  # a function: static structure

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        return self.inner.update(updates, state, params, **{**extra, "obj_fn": self.objective})


class OptaxWithObjective:
    """The optax oracle, given the same objective."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        return self.inner.update(updates, state, params, obj_fn=contract_loss)
