"""Invariants over generated trees (hypothesis)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtx
from gradtx.paths import LabelError, SelectorError, leaves, paths, resolve_labels, select, unflatten

SETTINGS = settings(max_examples=25, deadline=None)

# Keys without glob metacharacters or '/'; "0" and "1" may sit next to list indices.
KEYS = st.text(alphabet="abxy01_", min_size=1, max_size=3)


@st.composite
def arrays(draw: Any) -> np.ndarray:
    shape = draw(st.sampled_from([(), (2,), (1, 3)]))
    value = draw(st.floats(-4.0, 4.0, width=32))
    return np.full(shape, value, np.float32)


def nested(leaf: Any, max_leaves: int = 12) -> Any:
    return st.recursive(
        leaf,
        lambda children: (
            st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=3)
        ),
        max_leaves=max_leaves,
    )


TREES = nested(arrays() | st.none())
# trees with at least one array leaf, as params are
PARAMS = nested(arrays() | st.none()).filter(
    lambda t: any(x is not None for x in jax.tree.leaves(t))
)


def _present(tree: Any) -> list[str]:
    return [p for p, x in leaves(tree).items() if x is not None]


def _outside_anywhere(tree: Any, glob: str) -> list[str]:
    """The paths, `None` leaves' included, that `glob` does not select."""
    filled = jax.tree.map(lambda x: np.zeros(()) if x is None else x, tree, is_leaf=_is_none)
    inside = select(filled, glob, strict=False)
    return [p for p in paths(tree) if p not in inside]


def _is_none(x: Any) -> bool:
    return x is None


@st.composite
def tree_and_glob(draw: Any) -> tuple[Any, str]:
    """A params tree and a glob built from one of its paths, so that it matches something."""
    tree = draw(PARAMS)
    segments = draw(st.sampled_from(_present(tree))).split("/")
    segments = segments[: draw(st.integers(1, len(segments)))]  # a prefix selects a subtree
    glob = [draw(st.sampled_from([s, "*"])) for s in segments]
    if draw(st.booleans()):
        glob = ["**"] + glob[draw(st.integers(0, len(glob) - 1)) :]
    return tree, "/".join(glob)


@SETTINGS
@given(TREES)
def test_path_round_trip(tree):
    flat = leaves(tree)
    assert list(flat) == paths(tree)
    assert len(set(flat)) == len(flat)
    for rebuilt in (
        unflatten(tree, flat),
        unflatten(jax.tree.structure(tree, is_leaf=lambda x: x is None), flat),
    ):
        assert jax.tree.structure(rebuilt, is_leaf=lambda x: x is None) == jax.tree.structure(
            tree, is_leaf=lambda x: x is None
        )
        assert all(a is b for a, b in zip(jax.tree.leaves(rebuilt), jax.tree.leaves(tree)))


CHAINABLE = {
    "adam": lambda: gradtx.adam(0.1),
    "sgd-momentum": lambda: gradtx.sgd(0.1, momentum=0.9, nesterov=True),
    "clip_by_global_norm": lambda: gradtx.clip_by_global_norm(1.0),
    "adamw": lambda: gradtx.adamw(0.1, weight_decay=0.1),
}


@SETTINGS
@given(
    name=st.sampled_from(sorted(CHAINABLE)),
    values=st.lists(st.floats(-10.0, 10.0, width=32), min_size=7, max_size=7),
)
def test_chain_with_identity_is_the_same(name, values):
    tx = CHAINABLE[name]()
    chained = gradtx.chain(gradtx.identity(), tx)
    params = {
        "a": np.float32(values[0]) * np.ones((2, 2), np.float32),
        "b": [None, np.ones(3, np.float32)],
    }
    grads = [
        {
            "a": np.array([[values[1], values[2]], [values[3], 0.0]], np.float32),
            "b": [None, np.full(3, values[4], np.float32)],
        },
        {
            "a": np.full((2, 2), values[5], np.float32),
            "b": [None, np.full(3, values[6], np.float32)],
        },
    ]
    s1, s2 = tx.init(params), chained.init(params)
    for g in grads:
        u1, s1 = tx.update(g, s1, params)
        u2, s2 = chained.update(g, s2, params)
        assert jax.tree.structure(u1) == jax.tree.structure(u2)
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    flat1 = gradtx.state_dict(s1)
    flat2 = gradtx.state_dict(s2)
    assert set(flat2) == {f"{tx.name}/{k}" for k in flat1}
    for k, v in flat1.items():
        np.testing.assert_array_equal(np.asarray(flat2[f"{tx.name}/{k}"]), np.asarray(v))


# Labels cannot be dict keys of the generated trees (a dict whose keys are all known labels
# would be read as `{label: selector}`).
LABELS = ("L0", "L1", "L2")


@SETTINGS
@given(tree=PARAMS, data=st.data())
def test_label_tree_partition_covers_every_leaf_once(tree, data):
    labels_by_path = {p: data.draw(st.sampled_from(LABELS)) for p in _present(tree)}
    label_tree = unflatten(tree, {p: labels_by_path.get(p) for p in paths(tree)})
    resolved = resolve_labels(tree, label_tree, known=LABELS)
    assert list(resolved) == _present(tree)
    assert resolved == labels_by_path
    # the same partition as a function of the path
    assert resolve_labels(tree, lambda p, leaf: labels_by_path[p]) == labels_by_path


@SETTINGS
@given(tree_and_glob())
def test_glob_partition_covers_every_leaf_once(case):
    tree, glob = case
    inside = select(tree, glob)
    if not _outside_anywhere(tree, glob):
        with pytest.raises(SelectorError):
            resolve_labels(tree, {"in": glob, "out": "!" + glob})
        return
    resolved = resolve_labels(tree, {"in": glob, "out": "!" + glob})
    assert list(resolved) == _present(tree)
    assert [p for p, label in resolved.items() if label == "in"] == inside
    # overlapping selectors label some leaf twice
    with pytest.raises(LabelError, match="several labels"):
        resolve_labels(tree, {"in": glob, "all": "**"})


@SETTINGS
@given(tree_and_glob())
def test_negated_glob_is_the_complement(case):
    tree, glob = case
    inside = select(tree, glob)
    assert inside  # the glob was built to match
    outside = select(tree, "!" + glob, strict=False)
    assert set(inside).isdisjoint(outside)
    assert sorted(inside + outside) == sorted(_present(tree))
    # both come back in tree order
    order = {p: i for i, p in enumerate(_present(tree))}
    assert inside == sorted(inside, key=order.get)
    assert outside == sorted(outside, key=order.get)
    if not _outside_anywhere(tree, glob):
        with pytest.raises(SelectorError):
            select(tree, "!" + glob)
    else:
        select(tree, "!" + glob)  # "!glob" picks a path, if only a `None` leaf's: no typo
