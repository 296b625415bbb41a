"""gradtx.tree: arithmetic, reductions and access, with trees matched by path.

Every operation runs over the tree zoo and is checked against NumPy references computed in
float64; combination by path (not position), `None` handling, errors and `jit` are tested
separately.
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trees import ZOO, Dense, Layer, Linear, colliding, grads_like

import gradtx
from gradtx import tree as gt
from gradtx.paths import DuplicatePathError, SelectorError


def _np(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def _present(tree):
    return {p: x for p, x in gradtx.paths.leaves(tree).items() if x is not None}


def _assert_tree(actual, expected_by_path, like, rtol=1e-6):
    """`actual` has `like`'s structure and, at each path, the expected value and dtype."""
    assert jax.tree.structure(actual, is_leaf=lambda x: x is None) == jax.tree.structure(
        like, is_leaf=lambda x: x is None
    )
    got = gradtx.paths.leaves(actual)
    for path, leaf in gradtx.paths.leaves(like).items():
        if leaf is None:
            assert got[path] is None, path
            continue
        value, dtype = expected_by_path[path]
        assert got[path].dtype == dtype, path
        assert got[path].shape == jnp.shape(leaf), path
        np.testing.assert_allclose(_np(got[path]), value, rtol=rtol, atol=1e-6, err_msg=path)


# --- every operation over the zoo --------------------------------------------------------------


@pytest.mark.parametrize("zoo", ZOO, ids=str)
def test_elementwise_over_the_zoo(zoo):
    a = zoo.make()
    b = grads_like(a)
    pa, pb = _present(a), _present(b)
    assert list(gradtx.paths.leaves(gt.add(a, b))) == list(zoo.paths)
    lowp = {p: jnp.asarray(x).dtype != jnp.float32 for p, x in pa.items()}
    tol = 1e-2 if any(lowp.values()) else 1e-6

    def expect(fn, dtype=None):
        return {p: (fn(_np(pa[p]), _np(pb[p])), dtype or pa[p].dtype) for p in pa}

    _assert_tree(gt.add(a, b), expect(lambda x, y: x + y), a, tol)
    _assert_tree(gt.add(a, b, a), expect(lambda x, y: 2 * x + y), a, tol)
    _assert_tree(gt.sub(a, b), expect(lambda x, y: x - y), a, tol)
    _assert_tree(gt.mul(a, b), expect(lambda x, y: x * y), a, tol)
    _assert_tree(gt.div(a, gt.full_like(b, 4.0)), expect(lambda x, y: x / 4), a, tol)
    _assert_tree(gt.scale(-0.5, a), expect(lambda x, y: -0.5 * x), a, tol)
    _assert_tree(gt.add_scale(a, 3.0, b), expect(lambda x, y: x + 3 * y), a, tol)
    _assert_tree(gt.zeros_like(a), expect(lambda x, y: 0 * x), a)
    _assert_tree(gt.ones_like(a, jnp.int32), expect(lambda x, y: 0 * x + 1, jnp.int32), a)
    _assert_tree(gt.full_like(a, 2.5), expect(lambda x, y: 0 * x + 2.5), a)
    _assert_tree(gt.cast(a, jnp.bfloat16), expect(lambda x, y: x, jnp.bfloat16), a, 1e-2)
    _assert_tree(gt.cast(a, None), expect(lambda x, y: x), a)
    _assert_tree(gt.clip(a, -0.5, 0.25), expect(lambda x, y: np.clip(x, -0.5, 0.25)), a, tol)
    _assert_tree(gt.clip(a, max_value=0.0), expect(lambda x, y: np.minimum(x, 0)), a, tol)
    f32 = gt.cast(a, jnp.float32)
    _assert_tree(gt.cast_like(f32, a), expect(lambda x, y: x), a, tol)
    shift = gt.map_with_path(lambda p, x, y: x + y + len(p), a, b)
    _assert_tree(shift, {p: (_np(pa[p]) + _np(pb[p]) + len(p), pa[p].dtype) for p in pa}, a, tol)
    assert bool(gt.allclose(a, a))
    assert bool(gt.allclose(gt.add(a, gt.zeros_like(a)), a, rtol=0, atol=0))


@pytest.mark.parametrize("zoo", ZOO, ids=str)
def test_reductions_over_the_zoo(zoo):
    a = zoo.make()
    b = grads_like(a, seed=7)
    xs = [_np(x).ravel() for x in _present(a).values()]
    ys = [_np(_present(b)[p]).ravel() for p in _present(a)]
    flat_x, flat_y = np.concatenate(xs), np.concatenate(ys)
    tol = dict(rtol=1e-5, atol=1e-6)
    for value in (gt.sum(a), gt.vdot(a, b), gt.norm(a), gt.norm(a, 1), gt.norm(a, math.inf)):
        assert value.dtype == jnp.float32 and value.shape == ()
    np.testing.assert_allclose(gt.sum(a), flat_x.sum(), **tol)
    np.testing.assert_allclose(gt.vdot(a, b), flat_x @ flat_y, **tol)
    np.testing.assert_allclose(gt.norm(a), np.linalg.norm(flat_x), **tol)
    np.testing.assert_allclose(gt.norm(a, squared=True), np.sum(flat_x**2), **tol)
    np.testing.assert_allclose(gt.norm(a, ord=1), np.abs(flat_x).sum(), **tol)
    np.testing.assert_allclose(gt.norm(a, ord="inf"), np.abs(flat_x).max(), **tol)
    np.testing.assert_allclose(gt.norm(a, ord=np.inf, squared=True), np.abs(flat_x).max() ** 2)
    np.testing.assert_allclose(gt.max(a), flat_x.max(), **tol)
    np.testing.assert_allclose(gt.min(a), flat_x.min(), **tol)
    assert gt.size(a) == flat_x.size
    np.testing.assert_allclose(gt.norm(a), gradtx.global_norm(a), rtol=1e-6)


@pytest.mark.parametrize("zoo", ZOO, ids=str)
def test_get_and_set_every_path_of_the_zoo(zoo):
    tree = zoo.make()
    before = jax.tree.map(np.asarray, tree)
    for i, (path, leaf) in enumerate(gradtx.paths.leaves(tree).items()):
        assert gt.get(tree, path) is leaf
        marker = jnp.full((1,), float(i))
        new = gt.set(tree, path, marker)
        assert type(new) is type(tree)
        changed = gradtx.paths.leaves(new)
        assert list(changed) == list(zoo.paths)
        assert changed[path] is marker
        for other, value in gradtx.paths.leaves(tree).items():
            if other != path:
                assert changed[other] is value  # everything else is shared, unchanged
    # Nothing was modified in place.
    jax.tree.map(np.testing.assert_array_equal, tree, before)
    assert gt.get(tree, "") is tree


# --- matching by path --------------------------------------------------------------------------


def test_trees_combine_by_path_not_position():
    # A NamedTuple flattens as (w, b); a dict as (b, w). By position, w would meet b.
    layer = Layer(w=jnp.array([1.0, 2.0]), b=jnp.array([10.0]))
    as_dict = {"b": jnp.array([100.0]), "w": jnp.array([0.5, 0.5])}
    out = gt.add(layer, as_dict)
    assert isinstance(out, Layer)
    np.testing.assert_array_equal(out.w, [1.5, 2.5])
    np.testing.assert_array_equal(out.b, [110.0])
    np.testing.assert_allclose(gt.vdot(layer, as_dict), 1.5 + 1000.0)
    assert not bool(gt.allclose(layer, as_dict))
    assert bool(gt.allclose(layer, {"b": layer.b, "w": layer.w}))


def test_a_dict_and_a_dataclass_with_the_same_paths_combine():
    dense = {"d": Dense(jnp.ones((2, 2)), jnp.zeros(2), name="proj")}
    plain = {"d": {"bias": jnp.ones(2), "kernel": jnp.full((2, 2), 2.0)}}
    out = gt.sub(dense, plain)
    assert isinstance(out["d"], Dense) and out["d"].name == "proj"
    np.testing.assert_array_equal(out["d"].kernel, -np.ones((2, 2)))
    np.testing.assert_array_equal(out["d"].bias, -np.ones(2))
    # The other way round the result is a dict.
    assert isinstance(gt.add(plain, dense)["d"], dict)
    module = Linear(jnp.ones((1, 2)), jnp.ones(1))
    total = gt.map_with_path(lambda p, x, y: x * y, module, {"weight": 3.0, "bias": 4.0})
    assert isinstance(total, Linear) and total.activation == "tanh"
    np.testing.assert_array_equal(total.weight, [[3.0, 3.0]])


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda a, b: gt.add(a, b), r"tree.add: .*path 'enc/w' is in `a` but not in `b`"),
        (lambda a, b: gt.sub(b, a), r"tree.sub: .*path 'enc/v' is in `a` but not in `b`"),
        (lambda a, b: gt.add(a, a, b), r"path 'enc/w' is in `a` but not in `rest\[0\]`"),
        (lambda a, b: gt.vdot(a, b), r"tree.vdot: .*'enc/w'"),
        (lambda a, b: gt.allclose(a, b), r"tree.allclose: .*'enc/w'"),
        (lambda a, b: gt.cast_like(a, b), r"in `tree` but not in `other`"),
        (lambda a, b: gt.where("enc", a, b), r"tree.where: .*'enc/w'"),
        (lambda a, b: gt.map_with_path(lambda p, x, y: x, a, b), r"not in `rest\[0\]`"),
    ],
)
def test_mismatched_paths_name_the_path(call, match):
    a = {"enc": {"w": jnp.ones(2)}, "head": jnp.ones(1)}
    b = {"enc": {"v": jnp.ones(2)}, "head": jnp.ones(1)}
    with pytest.raises(ValueError, match=match):
        call(a, b)


def test_shape_mismatch_in_reductions_names_the_path():
    with pytest.raises(ValueError, match=r"tree.vdot: at path 'w' the shapes differ: \(2,\)"):
        gt.vdot({"w": jnp.ones(2)}, {"w": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"tree.allclose: at path 'w'"):
        gt.allclose({"w": jnp.ones(2)}, {"w": jnp.ones(3)})


def test_colliding_paths_are_an_error():
    with pytest.raises(DuplicatePathError, match=r"'a/0'"):
        gt.add(colliding(), colliding())
    with pytest.raises(DuplicatePathError):
        gt.norm(colliding())


# --- None leaves -------------------------------------------------------------------------------


def test_none_leaves_stay_none_and_reductions_skip_them():
    a = {"w": jnp.array([3.0]), "frozen": None, "b": jnp.array([4.0])}
    b = {"w": jnp.array([1.0]), "frozen": jnp.array([100.0]), "b": None}
    out = gt.add(a, b)
    assert out["frozen"] is None and out["b"] is None
    np.testing.assert_array_equal(out["w"], [4.0])
    assert gt.scale(2.0, a)["frozen"] is None
    assert gt.zeros_like(a)["frozen"] is None
    calls = []
    gt.map_with_path(lambda p, x, y: calls.append(p), a, b)
    assert calls == ["w"]  # fn is never called with a None leaf
    np.testing.assert_allclose(gt.norm(a), 5.0)
    np.testing.assert_allclose(gt.sum(a), 7.0)
    np.testing.assert_allclose(gt.vdot(a, b), 3.0)  # only 'w' is in both
    assert gt.size(a) == 2
    np.testing.assert_allclose(gt.max(a), 4.0)
    assert bool(gt.allclose(a, a))
    assert not bool(gt.allclose(a, b))  # None on one side only is a difference
    assert gt.where("**", a, b)["b"] is None


def test_empty_trees():
    assert float(gt.sum({})) == 0.0 and gt.sum({}).dtype == jnp.float32
    assert float(gt.norm({"a": None})) == 0.0
    assert float(gt.norm({"a": jnp.zeros((0,))}, ord="inf")) == 0.0
    assert gt.size({"a": None, "b": jnp.zeros((0, 3))}) == 0
    for fn in (gt.max, gt.min):
        with pytest.raises(ValueError, match=r"the tree has no elements"):
            fn({"a": None, "b": jnp.zeros((0,))})


# --- dtypes ------------------------------------------------------------------------------------


def test_reductions_accumulate_in_float32():
    ones = jnp.ones(4097, jnp.bfloat16)  # 4097 is not a bfloat16 number
    assert gt.sum({"x": ones}).dtype == jnp.float32
    assert float(gt.sum({"x": ones})) == 4097.0
    assert float(gt.vdot({"x": ones}, {"x": ones})) == 4097.0
    assert float(gt.norm({"x": ones}, squared=True)) == 4097.0
    assert float(gt.norm({"x": ones}, ord=1)) == 4097.0
    big = jnp.full(3, 300.0, jnp.float16)  # squares overflow float16
    np.testing.assert_allclose(gt.norm({"x": big}), 300 * np.sqrt(3), rtol=1e-6)
    ints = {"i": jnp.arange(5, dtype=jnp.int32)}
    assert gt.sum(ints).dtype == jnp.float32 and float(gt.sum(ints)) == 10.0
    assert gt.max(ints).dtype == jnp.float32 and float(gt.max(ints)) == 4.0
    mixed = {"a": jnp.ones(2, jnp.bfloat16), "b": jnp.ones(2)}
    assert bool(gt.allclose(mixed, {"a": jnp.ones(2), "b": jnp.ones(2, jnp.bfloat16)}))


def test_scalars_keep_each_leaf_dtype():
    tree = {"h": jnp.ones(2, jnp.bfloat16), "f": jnp.ones(2), "i": jnp.ones(2, jnp.int32)}
    scaled = gt.scale(jnp.float32(0.5), tree)
    assert scaled["h"].dtype == jnp.bfloat16 and scaled["f"].dtype == jnp.float32
    np.testing.assert_array_equal(_np(scaled["h"]), [0.5, 0.5])
    clipped = gt.clip(tree, jnp.float32(-1), jnp.float32(0.5))
    assert clipped["h"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(_np(clipped["h"]), [0.5, 0.5])
    assert gt.add_scale(tree, jnp.float32(2.0), tree)["h"].dtype == jnp.bfloat16
    # Integer leaves: a fractional factor promotes (as NumPy does); clip keeps the dtype and
    # rounds the bounds inwards.
    assert scaled["i"].dtype == jnp.float32
    np.testing.assert_array_equal(scaled["i"], [0.5, 0.5])
    np.testing.assert_array_equal(gt.add_scale(tree, 0.5, tree)["i"], [1.5, 1.5])
    ints = {"i": jnp.arange(-3, 4, dtype=jnp.int32)}
    clipped = gt.clip(ints, -1.5, 1.5)["i"]
    assert clipped.dtype == jnp.int32
    np.testing.assert_array_equal(clipped, [-1, -1, -1, 0, 1, 1, 1])
    np.testing.assert_array_equal(gt.clip(ints, max_value=-0.5)["i"], [-3, -2, -1, -1, -1, -1, -1])


# --- norm arguments ----------------------------------------------------------------------------


@pytest.mark.parametrize("ord", [0, 3, "fro", "nuc", -1])
def test_norm_rejects_other_orders(ord):
    with pytest.raises(ValueError, match=r"tree.norm: `ord` must be 1, 2 or inf"):
        gt.norm({"a": jnp.ones(2)}, ord=ord)


# --- where -------------------------------------------------------------------------------------

PARAMS = {
    "enc": {"w": jnp.ones(2), "b": jnp.ones(1)},
    "head": {"w": jnp.ones(2), "b": jnp.ones(1)},
}
ZEROS = gt.zeros_like(PARAMS)


def _chosen(out):
    return sorted(p for p, x in gradtx.paths.leaves(out).items() if float(jnp.sum(x)) > 0)


@pytest.mark.parametrize(
    "cond,expected",
    [
        ("enc", ["enc/b", "enc/w"]),
        (["**/w", "!head"], ["enc/w"]),
        (re.compile(r".*/b"), ["enc/b", "head/b"]),
        (lambda path, leaf: leaf.shape == (2,), ["enc/w", "head/w"]),
        (
            lambda params: {"enc": {"w": True, "b": False}, "head": True},
            ["enc/w", "head/b"] + ["head/w"],
        ),
        ({"enc": False, "head": {"w": True, "b": False}}, ["head/w"]),
    ],
    ids=["glob", "globs", "regex", "path_fn", "tree_fn", "bool_prefix"],
)
def test_where_with_selectors(cond, expected):
    assert _chosen(gt.where(cond, PARAMS, ZEROS)) == sorted(expected)
    # The complement comes from the second tree.
    assert _chosen(gt.where(cond, ZEROS, PARAMS)) == sorted(
        set(gradtx.paths.paths(PARAMS)) - set(expected)
    )


def test_where_with_elementwise_bool_trees():
    mask = {
        "enc": {"w": jnp.array([True, False]), "b": jnp.array([False])},
        "head": {"w": jnp.array([False, True]), "b": jnp.array(True)},  # a scalar broadcasts
    }
    out = gt.where(mask, PARAMS, ZEROS)
    np.testing.assert_array_equal(out["enc"]["w"], [1.0, 0.0])
    np.testing.assert_array_equal(out["head"]["w"], [0.0, 1.0])
    np.testing.assert_array_equal(out["enc"]["b"], [0.0])
    np.testing.assert_array_equal(out["head"]["b"], [1.0])
    # Bools computed inside jit (traced) work the same.
    positive = jax.jit(lambda a, b: gt.where(gt.map_with_path(lambda p, x: x > 0, a), a, b))
    signed = {"w": jnp.array([-1.0, 2.0])}
    np.testing.assert_array_equal(positive(signed, {"w": jnp.zeros(2)})["w"], [0.0, 2.0])
    with pytest.raises(ValueError, match=r"path 'enc/b' is in `a` but not in `cond`"):
        gt.where({"enc": {"w": jnp.array([True, False])}}, PARAMS, ZEROS)


def test_where_selector_errors():
    with pytest.raises(SelectorError, match=r"`cond`: the glob 'dec' matches no path"):
        gt.where("dec", PARAMS, ZEROS)
    assert _chosen(gt.where("dec", PARAMS, ZEROS, strict=False)) == []
    with pytest.raises(SelectorError, match=r"`cond`: cannot use"):
        gt.where(3.5, PARAMS, ZEROS)


# --- get and set -------------------------------------------------------------------------------


def test_get_and_set_subtrees():
    params = {"enc": {"layers": [{"w": jnp.ones(2)}, {"w": jnp.zeros(2)}]}, "head": None}
    assert gt.get(params, "enc/layers/1") is params["enc"]["layers"][1]
    assert gt.get(params, "head") is None
    new = gt.set(params, "enc/layers", [])
    assert new["enc"]["layers"] == [] and len(params["enc"]["layers"]) == 2
    assert new["head"] is None
    grown = gt.set(params, "head", {"w": jnp.ones(3)})
    assert gradtx.paths.paths(grown)[-1] == "head/w"
    assert gt.set(params, "", 5) == 5
    module = Linear(jnp.ones((1, 2)), jnp.ones(1), activation="identity")
    updated = gt.set(module, "bias", jnp.zeros(1))
    assert isinstance(updated, Linear) and updated.activation == "identity"
    np.testing.assert_array_equal(module.bias, [1.0])  # the original is untouched
    np.testing.assert_array_equal(updated.bias, [0.0])


@pytest.mark.parametrize("path", ["enc/layers/2/w", "enc/w", "head/x", "enc/layers/0/w/extra", "x"])
def test_get_and_set_unknown_paths_name_the_path(path):
    params = {"enc": {"layers": [{"w": jnp.ones(2)}]}, "head": jnp.ones(1)}
    with pytest.raises(KeyError, match=rf"tree.get: no leaf or subtree at path '{path}'"):
        gt.get(params, path)
    with pytest.raises(KeyError, match=rf"tree.set: no leaf or subtree at path '{path}'"):
        gt.set(params, path, 0.0)


def test_keys_containing_slashes():
    tree = {"a/b": jnp.ones(1), "c": {"d/e": jnp.zeros(1)}}
    assert gt.get(tree, "a/b") is tree["a/b"]
    assert gt.get(tree, "c/d/e") is tree["c"]["d/e"]
    assert float(gt.set(tree, "c/d/e", jnp.ones(1))["c"]["d/e"][0]) == 1.0


# --- jit ---------------------------------------------------------------------------------------


def test_under_jit_matches_eager():
    a = ZOO[0].make()
    b = grads_like(a)

    def step(a, b):
        clipped = gt.clip(b, -0.5, 0.5)
        out = gt.add_scale(a, -0.1, gt.where("**/w", clipped, gt.zeros_like(b)))
        out = gt.set(out, "head/w", gt.get(out, "head/w") * 2)
        return out, gt.norm(out), gt.vdot(a, b), gt.allclose(a, out), gt.max(out), gt.size(out)

    eager = step(a, b)
    jitted = jax.jit(step)(a, b)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6), eager, jitted)
    assert not bool(jitted[3])
