"""Every cache that tracing and eager dispatch fill has a bound, so memory stays flat.

`benchmarks/memory.py` measures the result over 10,000 steps (resident memory and live
arrays); these tests pin the mechanism.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import gradtx
from gradtx._core import outermost_call
from gradtx._paths import cache
from gradtx._paths import paths as paths_module
from gradtx._paths.cache import BoundedCache

PACKAGE = Path(gradtx.__file__).parent
# Module-level containers that are not caches, and why.
NOT_CACHES = {
    # widened arrays of the chain that is running, removed when its update ends
    ("gradtx._core.widening", "_SOURCES"),
    # the state dtypes read by each running chain, removed when its update ends
    ("gradtx._core.widening", "_READS"),
    # what runs after the outermost `init`, registered once when the state tools are imported
    ("gradtx._core.outermost_call", "_init_finishers"),
}


def _modules():
    for info in pkgutil.walk_packages(gradtx.__path__, prefix="gradtx."):
        yield importlib.import_module(info.name)


def _empty_container(node: ast.expr | None) -> bool:
    if isinstance(node, (ast.Dict, ast.List, ast.Set)):
        return not getattr(node, "keys", getattr(node, "elts", None))
    return isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("dict", "list", "set")


def test_every_module_level_container_filled_at_run_time_is_a_bounded_cache():
    unbounded = set()
    for module in _modules():
        tree = ast.parse(Path(module.__file__).read_text())
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and _empty_container(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                unbounded.update((module.__name__, t.id) for t in targets)
    assert unbounded == NOT_CACHES, "use BoundedCache for a cache filled while tracing"


def _module_caches():
    """(qualified name, cache) for every BoundedCache and lru_cache at a module's top level."""
    for module in _modules():
        for name, value in vars(module).items():
            if isinstance(value, (BoundedCache, functools._lru_cache_wrapper)):
                yield f"{module.__name__}.{name}", value


def test_every_bounded_cache_and_lru_cache_has_a_limit():
    caches = 0
    for name, value in _module_caches():
        if isinstance(value, BoundedCache):
            caches += 1
            assert 0 < value.limit <= 65536, name
        else:
            assert value.cache_info().maxsize is not None, name
    assert caches >= 7  # paths, unit types, selections, offsets, count layouts, masks, calls


def test_a_full_cache_is_emptied_and_keeps_answering(monkeypatch):
    monkeypatch.setattr(paths_module._CACHE, "limit", 4)
    paths_module._CACHE.clear()
    for i in range(10):
        tree = {f"k{i}": 1.0, "layers": [2.0] * (i + 1)}
        assert gradtx.paths.paths(tree)[0] == f"k{i}"
        assert len(paths_module._CACHE) <= 4


def test_eager_steps_reuse_one_compiled_program_whatever_the_hyperparameters():
    # The eager dispatcher compiles per structure only; JAX bounds its cache of programs
    # (8192 per function), and new learning rates or steps must not add entries.
    params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
    grads = jax.tree.map(jnp.ones_like, params)
    tx = gradtx.adam(1e-3)
    state = tx.init(params)
    _, state = tx.update(grads, state, params)
    before = outermost_call._compiled._cache_size()
    for step in range(20):
        tx = gradtx.adam(1e-3 * (step + 1))
        _, state = tx.update(grads, state, params)
    assert outermost_call._compiled._cache_size() == before


def _cached_entries() -> dict[str, int]:
    return {
        name: len(value) if isinstance(value, BoundedCache) else value.cache_info().currsize
        for name, value in _module_caches()
    }


def test_clear_all_empties_every_cache_and_the_next_trace_fills_them_again():
    # The benchmarks time compiles from here, as a fresh process makes them.
    params = gradtx.pack({"w": jnp.ones((2, 3)), "bias": jnp.ones(3)})
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(1e-3, mask="!**/bias"))
    step = lambda p, s: tx.update(p, s, p)  # noqa: E731
    state = tx.init(params)
    before = jax.jit(step)(params, state)
    layout = jax.tree.leaves(params, is_leaf=lambda x: hasattr(x, "layout"))[0].layout
    filled = _cached_entries()
    assert sum(filled.values()) > 0 and len(layout._masks) > 0

    cache.clear_all()
    assert set(_cached_entries().values()) == {0} and len(layout._masks) == 0

    jax.clear_caches()
    after = jax.jit(step)(params, state)
    assert sum(_cached_entries().values()) > 0 and len(layout._masks) > 0
    jax.tree.map(np.testing.assert_array_equal, after, before)
