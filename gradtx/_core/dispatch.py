"""Eager calls run one cached compiled program instead of thousands of small operations.

Called outside `jit` (in a notebook, while debugging), a transformation's `update` would
dispatch every per-leaf operation separately: for a model with 2000 leaves that is tens of
thousands of tiny dispatches. Instead, an eager call is routed through a `jax.jit` of the same
method, which compiles once per structure (the transformation's static part, the trees'
structures, shapes and dtypes) and afterwards costs one dispatch. Hyperparameters are leaves
of the transformation, so a new learning rate reuses the compiled program. Inside `jit`,
`vmap`, `grad` or under `jax.disable_jit()` the method runs as written.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from gradtx._core.boundary import partial_allowed

__all__ = ["eager_dispatch"]


def _is_array_like(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, complex, bool))


def _dispatchable(trees: tuple) -> bool:
    """True for concrete array inputs; False inside a trace or with non-array leaves."""
    # Tree by tree, stopping at the first traced leaf: inside `jit` the updates are traced,
    # so the state and params behind them are not flattened, which dominated this check's
    # cost on trees of many leaves (benchmarks/host_overhead.py).
    for tree in trees:
        for leaf in jax.tree_util.tree_leaves(tree):
            if isinstance(leaf, jax.core.Tracer) or not _is_array_like(leaf):
                return False
    return not jax.config.jax_disable_jit


@functools.partial(jax.jit, static_argnums=(0, 1))
def _run(method: Callable, partial: bool, *args: Any, **kwargs: Any) -> Any:
    # `partial` (whether the running update was declared partial, see gradtx/_core/boundary.py)
    # is part of the cache key: the completeness check runs while tracing.
    return method(*args, **kwargs)


def eager_dispatch(method: Callable) -> Callable:
    """Decorate a pure method so eager calls go through one cached `jax.jit` program.

    The instance and every argument are pytrees passed to the compiled program; the method
    itself is the static cache key. Calls with traced or non-array arguments run directly.
    """

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _dispatchable((*args, kwargs)):
            return _run(method, partial_allowed(), *args, **kwargs)
        return method(*args, **kwargs)

    wrapper.__wrapped_eager__ = method  # type: ignore[attr-defined]
    return wrapper
