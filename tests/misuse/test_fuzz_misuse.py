"""Fuzzing the boundary: random param trees, random mistakes in the gradients or params.

Every call either succeeds with the documented meaning or raises one of the errors gradtx
raises on purpose, naming the path of the mistake: never a bare JAX or Python error.
Budget: `FUZZ_EXAMPLES` trees per optimizer (see the settings below).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradtx

FUZZ_EXAMPLES = 40

OPTIMIZERS = {
    "adam": lambda: gradtx.adam(0.1),
    "sgd-momentum": lambda: gradtx.sgd(0.1, momentum=0.9),
    "clip-adamw": lambda: gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(0.1)),
}
MISTAKES = ("none", "missing", "extra", "reshaped", "integer", "not-an-array", "none-leaf")
SHAPES = ((), (2,), (2, 3))
DTYPES = (jnp.float32, jnp.bfloat16)

leaf = st.tuples(st.sampled_from(SHAPES), st.sampled_from(DTYPES)).map(
    lambda sd: jnp.full(sd[0], 0.5, sd[1])
)
trees = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.dictionaries(st.sampled_from("abcdw"), inner, min_size=1, max_size=3),
        st.lists(inner, min_size=1, max_size=3),
    ),
    max_leaves=6,
)


def _paths(tree):
    return gradtx.paths.leaves(tree)


def _set(tree, path, value):
    """`tree` with the leaf at `path` replaced by `value` (a copy)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)
    out = []
    for kp, x in leaves:
        name = jax.tree_util.keystr(kp, simple=True, separator="/")
        out.append(value if name == path else x)
    return jax.tree.unflatten(treedef, out)


def _drop(tree, path):
    """`tree` without the dict entry at `path` (None when the leaf sits in a list)."""
    head, _, last = path.rpartition("/")
    parent = tree
    for part in head.split("/") if head else []:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    if isinstance(parent, dict):
        copy = jax.tree.map(lambda x: x, tree)
        target = copy
        for part in head.split("/") if head else []:
            target = target[int(part)] if isinstance(target, list) else target[part]
        del target[last]
        return copy
    return None


@pytest.mark.parametrize("name", OPTIMIZERS)
@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(params=trees, mistake=st.sampled_from(MISTAKES), pick=st.integers(0, 100))
def test_every_call_succeeds_or_names_the_path(name, params, mistake, pick):
    if not isinstance(params, (dict, list)):
        params = {"w": params}
    paths = sorted(_paths(params))
    path = paths[pick % len(paths)]
    grads = jax.tree.map(lambda p: jnp.ones_like(p), params)
    tx = OPTIMIZERS[name]()
    expected: tuple[type, str] | None = None
    if mistake == "missing":
        dropped = _drop(grads, path)
        if dropped is None or not _paths(dropped):
            mistake = "none"
        else:
            grads, expected = dropped, (ValueError, path)
    elif mistake == "extra":
        grads = {"zz_extra": jnp.ones(2), **grads} if isinstance(grads, dict) else grads
        expected = (KeyError, "zz_extra") if isinstance(grads, dict) else None
    elif mistake == "reshaped":
        grads = _set(grads, path, jnp.ones((7,), jnp.float32))
        expected = (ValueError, path)
    elif mistake == "integer":
        params = _set(params, path, jnp.zeros((2,), jnp.int32))
        grads = _set(grads, path, jnp.zeros((2,), jnp.int32))
        expected = (TypeError, path)
    elif mistake == "not-an-array":
        grads = _set(grads, path, "oops")
        expected = (TypeError, path)
    elif mistake == "none-leaf":
        grads = _set(grads, path, None)

    with jax.disable_jit():
        if expected is None:
            state = tx.init(params)
            updates, state = tx.update(grads, state, params)
            new = gradtx.apply_updates(params, updates)
            for p, x in _paths(params).items():
                assert _paths(new)[p].dtype == x.dtype, p
                if mistake == "none-leaf" and p == path:
                    assert _paths(new)[p] is x  # no gradient: unchanged
            return
        kind, where = expected
        with pytest.raises(kind) as info:
            state = tx.init(params)
            tx.update(grads, state, params)
    text = info.value.args[0] if isinstance(info.value, KeyError) else str(info.value)
    # The path is named: the message is gradtx's, not a bare JAX or Python error.
    assert repr(where) in text or f"'{where}" in text, text
