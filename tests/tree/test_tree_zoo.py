"""The tree zoo crossed with representative transformations, under `jax.jit`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trees import ZOO, colliding, grads_like

import gradtx
from gradtx.paths import DuplicatePathError

# A cross product of the registry: left out of `make quick` (see CONTRIBUTING.md).
pytestmark = pytest.mark.slow

# name -> (factory, {state_dict prefix of a per-path slot: expected dtype or None for the
# param's dtype}, keys that are not per path)
TRANSFORMS: dict[str, tuple[Any, dict[str, Any], set[str]]] = {
    "adam": (
        lambda: gradtx.adam(0.1),
        {"mu/": None, "nu/": None, "count/": jnp.int32},
        set(),
    ),
    "adamw-mask-all": (
        lambda: gradtx.adamw(0.1, weight_decay=0.1, mask="**"),
        {"mu/": None, "nu/": None, "count/": jnp.int32},
        set(),
    ),
    "sgd-momentum": (lambda: gradtx.sgd(0.1, momentum=0.9), {"trace/": None}, set()),
    "clip-then-adam": (
        lambda: gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1)),
        {"adam/mu/": None, "adam/nu/": None, "adam/count/": jnp.int32},
        {"clip_by_global_norm/global_norm", "clip_by_global_norm/clipped"},
    ),
}

ZOO_PARAMS = [pytest.param(z, id=z.id) for z in ZOO]
TX_PARAMS = [pytest.param(name, id=name) for name in TRANSFORMS]


def _structure(tree: Any) -> Any:
    """The treedef with `None` leaves kept as leaves, so their positions are compared too."""
    return jax.tree.structure(tree, is_leaf=lambda x: x is None)


def _present(tree: Any) -> dict[str, Any]:
    kps, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(kp, simple=True, separator="/"): x for kp, x in kps}


@pytest.mark.parametrize("zoo", ZOO_PARAMS)
def test_paths_are_the_written_ones(zoo):
    tree = zoo.make()
    assert gradtx.paths.paths(tree) == list(zoo.paths)
    leaves = gradtx.paths.leaves(tree)
    assert list(leaves) == list(zoo.paths)
    rebuilt = gradtx.paths.unflatten(tree, leaves)
    assert _structure(rebuilt) == _structure(tree)
    assert all(a is b for a, b in zip(jax.tree.leaves(rebuilt), jax.tree.leaves(tree)))


@pytest.mark.parametrize("name", TX_PARAMS)
@pytest.mark.parametrize("zoo", ZOO_PARAMS)
def test_step_under_jit(zoo, name):
    make, slots, other_keys = TRANSFORMS[name]
    tx = make()
    params = zoo.make()
    grads = grads_like(params)

    @jax.jit
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state, updates

    state = jax.jit(tx.init)(params)
    new_params, new_state, updates = step(params, state, grads)
    new_params, new_state, updates = step(new_params, new_state, grads)
    assert step._cache_size() == 1

    # structures (static fields included) and dtypes are preserved
    assert _structure(updates) == _structure(params)
    assert _structure(new_params) == _structure(params)
    assert jax.tree.structure(new_state) == jax.tree.structure(state)
    before, after = _present(params), _present(new_params)
    for path, p in before.items():
        assert after[path].dtype == p.dtype, path
        assert _present(updates)[path].dtype == p.dtype, path
        assert after[path].shape == p.shape, path
        assert bool(jnp.all(jnp.isfinite(after[path].astype(jnp.float32)))), path
        if p.size:
            assert not np.array_equal(np.asarray(after[path]), np.asarray(p)), path
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(new_state)):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)

    # the state is keyed by the zoo's own paths, one entry per slot and present leaf
    flat = gradtx.state_dict(new_state)
    present = {p for p in zoo.paths if p in before}
    for prefix, dtype in slots.items():
        keyed = {k[len(prefix) :]: x for k, x in flat.items() if k.startswith(prefix)}
        assert set(keyed) == present, prefix
        for path, x in keyed.items():
            want = before[path].dtype if dtype is None else jnp.dtype(dtype)
            assert x.dtype == want, (prefix, path)
            if dtype is None:
                assert x.shape == before[path].shape, (prefix, path)
    slot_keys = {k for k in flat if any(k.startswith(prefix) for prefix in slots)}
    assert set(flat) - slot_keys == other_keys


@pytest.mark.parametrize("name", TX_PARAMS)
def test_colliding_paths_are_an_error(name):
    tx = TRANSFORMS[name][0]()
    with pytest.raises(DuplicatePathError, match="a/0"):
        tx.init(colliding())


def test_colliding_paths_are_named():
    with pytest.raises(
        DuplicatePathError, match=r"\['a/0'\].*\['a'\]\[0\]|\['a'\]\[0\].*\['a/0'\]"
    ):
        gradtx.paths.paths(colliding())
    with pytest.raises(DuplicatePathError):
        gradtx.apply_updates(colliding(), colliding())
