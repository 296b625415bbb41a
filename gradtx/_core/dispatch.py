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
from jax.core import Tracer


def _is_array_like(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, complex, bool))


def dispatchable(trees: tuple) -> bool:
    """True for concrete array inputs; False inside a trace or with non-array leaves."""
    # Tree by tree, stopping at the first traced leaf: inside `jit` the updates are traced,
    # so the state and params behind them are not flattened (benchmarks/lab/host_overhead.py).
    for tree in trees:
        for leaf in jax.tree_util.tree_leaves(tree):
            if isinstance(leaf, Tracer) or not _is_array_like(leaf):
                return False
    # The flag is set on the config at runtime, where the checker cannot see it.
    return not jax.config.jax_disable_jit  # pyright: ignore[reportAttributeAccessIssue]


def eager_dispatch(function: Callable) -> Callable:
    """Decorate a pure function so eager calls go through one cached `jax.jit` program.

    Every argument is a pytree passed to the compiled program. Calls with traced or
    non-array arguments run directly.
    """
    compiled = jax.jit(function)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if dispatchable((*args, kwargs)):
            return compiled(*args, **kwargs)
        return function(*args, **kwargs)

    return wrapper
