"""Paths: a leaf's identity is its key path joined with '/'."""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gradtx import paths as gpaths


class Pair(NamedTuple):
    kernel: jax.Array
    bias: jax.Array


@dataclasses.dataclass
class Dense:
    w: jax.Array
    b: jax.Array


jax.tree_util.register_dataclass(Dense, data_fields=["w", "b"], meta_fields=[])


def _mixed_tree():
    return {
        "enc": {"layers": [{"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}, {"w": jnp.ones((3, 1))}]},
        "pair": Pair(jnp.ones(2), jnp.zeros(1)),
        "dense": Dense(jnp.full((2,), 3.0), jnp.full((1,), 4.0)),
        "tup": (jnp.ones(1), None),
        "ints": {0: jnp.ones(1), 7: jnp.zeros(2)},
        "frozen": None,
    }


EXPECTED_PATHS = [
    "dense/w",
    "dense/b",
    "enc/layers/0/b",
    "enc/layers/0/w",
    "enc/layers/1/w",
    "frozen",
    "ints/0",
    "ints/7",
    "pair/kernel",
    "pair/bias",
    "tup/0",
    "tup/1",
]


def test_paths_of_dicts():
    assert gpaths.paths({"enc": {"layers": [{"w": 1.0}]}}) == ["enc/layers/0/w"]
    assert gpaths.paths({"b": 1.0, "a": {"y": 2.0, "x": 3.0}}) == ["a/x", "a/y", "b"]


def test_paths_of_lists_and_tuples():
    assert gpaths.paths([1.0, [2.0, 3.0]]) == ["0", "1/0", "1/1"]
    assert gpaths.paths((1.0, (2.0,))) == ["0", "1/0"]


def test_paths_of_namedtuple_use_field_names():
    assert gpaths.paths(Pair(1.0, 2.0)) == ["kernel", "bias"]


def test_paths_of_registered_dataclass_use_attribute_names():
    assert gpaths.paths(Dense(1.0, 2.0)) == ["w", "b"]
    assert gpaths.paths({"layer": Dense(1.0, 2.0)}) == ["layer/w", "layer/b"]


def test_none_leaves_are_kept():
    tree = {"a": None, "b": [1.0, None]}
    assert gpaths.paths(tree) == ["a", "b/0", "b/1"]
    assert gpaths.leaves(tree) == {"a": None, "b/0": 1.0, "b/1": None}


def test_int_dict_keys():
    assert gpaths.paths({0: 1.0, 2: 2.0, 10: 3.0}) == ["0", "2", "10"]
    assert gpaths.paths({"layers": {3: {"w": 1.0}}}) == ["layers/3/w"]


def test_mixed_tree_paths_in_tree_order():
    tree = _mixed_tree()
    assert gpaths.paths(tree) == EXPECTED_PATHS
    assert list(gpaths.leaves(tree)) == EXPECTED_PATHS
    rendered, leaves, treedef = gpaths.flatten(tree)
    assert list(rendered) == EXPECTED_PATHS
    assert len(leaves) == treedef.num_leaves == len(EXPECTED_PATHS)


def _assert_same_tree(a, b):
    assert jax.tree.structure(a, is_leaf=lambda x: x is None) == jax.tree.structure(
        b, is_leaf=lambda x: x is None
    )
    for x, y in zip(
        jax.tree.leaves(a, is_leaf=lambda x: x is None),
        jax.tree.leaves(b, is_leaf=lambda x: x is None),
    ):
        if x is None:
            assert y is None
        else:
            assert x is y


def test_leaves_unflatten_round_trip_is_exact():
    tree = _mixed_tree()
    flat = gpaths.leaves(tree)
    rebuilt = gpaths.unflatten(tree, flat)
    _assert_same_tree(rebuilt, tree)
    assert isinstance(rebuilt["pair"], Pair)
    assert isinstance(rebuilt["dense"], Dense)
    assert isinstance(rebuilt["tup"], tuple)


def test_unflatten_from_treedef():
    tree = _mixed_tree()
    _, _, treedef = gpaths.flatten(tree)
    rebuilt = gpaths.unflatten(treedef, gpaths.leaves(tree))
    _assert_same_tree(rebuilt, tree)


def test_unflatten_with_new_values_places_them_by_path():
    tree = {"a": [1.0, 2.0], "b": Dense(3.0, 4.0)}
    flat = {"b/b": 40.0, "a/1": 20.0, "b/w": 30.0, "a/0": 10.0}  # any order
    rebuilt = gpaths.unflatten(tree, flat)
    assert rebuilt["a"] == [10.0, 20.0]
    assert rebuilt["b"] == Dense(30.0, 40.0)


def test_unflatten_reports_missing_and_unexpected_paths():
    with pytest.raises(KeyError, match=r"Missing: \['a/1'\].*unexpected: \['c'\]"):
        gpaths.unflatten({"a": [1.0, 2.0]}, {"a/0": 1.0, "c": 3.0})


def test_duplicate_path_error_names_both_key_paths():
    with pytest.raises(gpaths.DuplicatePathError, match="'a/0'") as info:
        gpaths.paths({"a/0": 1, "a": [2]})
    message = str(info.value)
    assert "['a/0']" in message
    assert "['a'][0]" in message


def test_duplicate_path_error_deep_in_the_tree():
    tree = {"enc": {"w/b": jnp.ones(1), "w": {"b": jnp.ones(1)}}}
    with pytest.raises(gpaths.DuplicatePathError, match=r"'enc/w/b'") as info:
        gpaths.flatten(tree)
    assert "['enc']['w/b']" in str(info.value)
    assert "['enc']['w']['b']" in str(info.value)


def test_numpy_and_scalar_leaves_keep_identity():
    a = np.arange(3)
    tree = {"a": a, "s": 1.5}
    flat = gpaths.leaves(tree)
    assert flat["a"] is a
    assert flat["s"] == 1.5


@jax.tree_util.register_pytree_with_keys_class
class Box:
    """A box around one value that opts in to giving the value its own path."""

    __gradtx_path_transparent__ = True

    def __init__(self, value):
        self.value = value

    def tree_flatten_with_keys(self):
        return [(jax.tree_util.GetAttrKey("value"), self.value)], None

    def tree_flatten(self):
        return [self.value], None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


def test_a_path_transparent_box_gives_its_value_its_own_path():
    tree = {"enc": {"w": Box(jnp.ones(2)), "b": Box(None)}, "head": Box({"w": jnp.ones(1)})}
    assert gpaths.paths(tree) == ["enc/b", "enc/w", "head/w"]
    assert gpaths.select(tree, "**/w") == ["enc/w", "head/w"]
    rebuilt = gpaths.unflatten(tree, {"enc/b": None, "enc/w": 2.0, "head/w": 3.0})
    assert isinstance(rebuilt["enc"]["w"], Box) and rebuilt["enc"]["w"].value == 2.0
    with pytest.raises(gpaths.DuplicatePathError, match="'a/b'"):
        gpaths.paths({"a": {"b": Box(1.0)}, "a/b": 2.0})


@jax.tree_util.register_pytree_with_keys_class
class PlainBox(Box):
    """The same box without the opt-in."""

    __gradtx_path_transparent__ = False


def test_a_box_without_the_opt_in_keeps_the_value_key():
    assert gpaths.paths({"w": PlainBox(1.0)}) == ["w/value"]
