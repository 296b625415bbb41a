"""`gradtx.projections` against independent NumPy (float64) references, written from the
definitions (the simplex and l1-ball projections by sorting, Duchi et al. 2008), with optax's
`optax.projections` as a second oracle. The sets are over the whole tree, as optax's."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.projections as op
import pytest

import gradtx
from gradtx import projections as gp

RNG = np.random.default_rng(0)


def _r(*shape: int, scale: float = 1.0) -> jax.Array:
    return jnp.asarray((scale * RNG.normal(size=shape)).astype(np.float32))


# Nested dicts, a list, a scalar and a `None` leaf; `A` is a second tree with the same paths.
TREE = {"enc": {"w": _r(3, 4), "b": _r(4)}, "layers": [_r(5), _r()], "frozen": None}
A = {"enc": {"w": _r(3, 4), "b": _r(4)}, "layers": [_r(5), _r()], "frozen": None}
NO_NONE = {k: v for k, v in TREE.items() if k != "frozen"}
A_NO_NONE = {k: v for k, v in A.items() if k != "frozen"}


def flat(tree: Any) -> dict[str, np.ndarray]:
    return {
        p: np.asarray(x, np.float64) for p, x in gradtx.paths.leaves(tree).items() if x is not None
    }


def vector(tree: Any) -> tuple[np.ndarray, list[tuple[str, tuple]]]:
    """The tree's elements as one float64 vector, and `(path, shape)` per leaf."""
    leaves = flat(tree)
    layout = [(p, x.shape) for p, x in leaves.items()]
    return np.concatenate([x.reshape(-1) for x in leaves.values()]), layout


def unvector(v: np.ndarray, layout: list[tuple[str, tuple]]) -> dict[str, np.ndarray]:
    out, offset = {}, 0
    for path, shape in layout:
        size = int(np.prod(shape))
        out[path] = v[offset : offset + size].reshape(shape)
        offset += size
    return out


# --- NumPy references ---------------------------------------------------------------------------


def ref_simplex(v: np.ndarray, s: float) -> np.ndarray:
    """Duchi et al. (2008), Figure 1: sort decreasingly, rho = the largest j with
    u_j - (sum_{i<=j} u_i - s) / j > 0, theta = (sum_{i<=rho} u_i - s) / rho."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    j = np.arange(1, v.size + 1)
    rho = int(np.nonzero(u - (css - s) / j > 0)[0][-1]) + 1
    theta = (css[rho - 1] - s) / rho
    return np.maximum(v - theta, 0.0)


def ref_l1_sphere(v: np.ndarray, s: float) -> np.ndarray:
    return np.sign(v) * ref_simplex(np.abs(v), s)


def ref_l1_ball(v: np.ndarray, s: float) -> np.ndarray:
    return v if np.sum(np.abs(v)) <= s else ref_l1_sphere(v, s)


def ref_l2_sphere(v: np.ndarray, s: float) -> np.ndarray:
    return s * v / np.linalg.norm(v)


def ref_l2_ball(v: np.ndarray, s: float) -> np.ndarray:
    norm = np.linalg.norm(v)
    return v if norm <= s else s * v / norm


def ref_hyperplane(v: np.ndarray, a: np.ndarray, b: float) -> np.ndarray:
    return v - (a @ v - b) / (a @ a) * a


def ref_halfspace(v: np.ndarray, a: np.ndarray, b: float) -> np.ndarray:
    return v if a @ v <= b else ref_hyperplane(v, a, b)


def ref_vector(v: np.ndarray, a: np.ndarray) -> np.ndarray:
    return (a @ v) / (a @ a) * a


# Each case: (name, gradtx call, NumPy call on the whole vector, optax call or None).
S = 2.0
CASES = [
    (
        "non_negative",
        lambda t: gp.projection_non_negative(t),
        lambda v: np.maximum(v, 0),
        lambda t: op.projection_non_negative(t),
    ),
    ("box", lambda t: gp.projection_box(t, -0.5, 0.25), lambda v: np.clip(v, -0.5, 0.25), None),
    ("hypercube", lambda t: gp.projection_hypercube(t, 0.5), lambda v: np.clip(v, 0, 0.5), None),
    (
        "simplex",
        lambda t: gp.projection_simplex(t, S),
        lambda v: ref_simplex(v, S),
        lambda t: op.projection_simplex(t, S),
    ),
    (
        "l1_sphere",
        lambda t: gp.projection_l1_sphere(t, S),
        lambda v: ref_l1_sphere(v, S),
        lambda t: op.projection_l1_sphere(t, S),
    ),
    (
        "l1_ball",
        lambda t: gp.projection_l1_ball(t, S),
        lambda v: ref_l1_ball(v, S),
        lambda t: op.projection_l1_ball(t, S),
    ),
    (
        "l1_ball-inside",
        lambda t: gp.projection_l1_ball(t, 100.0),
        lambda v: ref_l1_ball(v, 100.0),
        lambda t: op.projection_l1_ball(t, 100.0),
    ),
    (
        "l2_sphere",
        lambda t: gp.projection_l2_sphere(t, S),
        lambda v: ref_l2_sphere(v, S),
        lambda t: op.projection_l2_sphere(t, S),
    ),
    (
        "l2_ball",
        lambda t: gp.projection_l2_ball(t, S),
        lambda v: ref_l2_ball(v, S),
        lambda t: op.projection_l2_ball(t, S),
    ),
    (
        "l2_ball-inside",
        lambda t: gp.projection_l2_ball(t, 100.0),
        lambda v: ref_l2_ball(v, 100.0),
        lambda t: op.projection_l2_ball(t, 100.0),
    ),
    (
        "linf_ball",
        lambda t: gp.projection_linf_ball(t, 0.5),
        lambda v: np.clip(v, -0.5, 0.5),
        lambda t: op.projection_linf_ball(t, 0.5),
    ),
]
PAIR_CASES = [
    (
        "hyperplane",
        lambda t, a: gp.projection_hyperplane(t, a, 0.5),
        lambda v, a: ref_hyperplane(v, a, 0.5),
        lambda t, a: op.projection_hyperplane(t, a, 0.5),
    ),
    (
        "halfspace-outside",
        lambda t, a: gp.projection_halfspace(t, a, -10.0),
        lambda v, a: ref_halfspace(v, a, -10.0),
        lambda t, a: op.projection_halfspace(t, a, -10.0),
    ),
    (
        "halfspace-inside",
        lambda t, a: gp.projection_halfspace(t, a, 10.0),
        lambda v, a: ref_halfspace(v, a, 10.0),
        lambda t, a: op.projection_halfspace(t, a, 10.0),
    ),
    (
        "vector",
        lambda t, a: gp.projection_vector(t, a),
        lambda v, a: ref_vector(v, a),
        lambda t, a: op.projection_vector(t, a),
    ),
]


def assert_close(got: Any, want: dict[str, np.ndarray], rtol: float = 2e-6) -> None:
    got = flat(got)
    assert sorted(got) == sorted(want)
    for path, x in got.items():
        np.testing.assert_allclose(x, want[path], rtol=rtol, atol=2e-6, err_msg=path)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_numpy_and_optax(case):
    _, project, reference, oracle = case
    got = jax.jit(project)(TREE)
    assert got["frozen"] is None
    assert jax.tree.structure(got) == jax.tree.structure(TREE)
    v, layout = vector(TREE)
    assert_close(got, unvector(reference(v), layout))
    if oracle is not None:
        with jax.numpy_dtype_promotion("standard"):
            assert_close(got, flat(oracle(NO_NONE)))


@pytest.mark.parametrize("case", PAIR_CASES, ids=[c[0] for c in PAIR_CASES])
def test_two_tree_projections_match_numpy_and_optax(case):
    _, project, reference, oracle = case
    got = jax.jit(project)(TREE, A)
    v, layout = vector(TREE)
    a, _ = vector(A)
    assert_close(got, unvector(reference(v, a), layout), rtol=1e-5)
    with jax.numpy_dtype_promotion("standard"):
        assert_close(got, flat(oracle(NO_NONE, A_NO_NONE)), rtol=1e-5)


def test_the_results_lie_in_their_sets():
    simplex = vector(gp.projection_simplex(TREE, S))[0]
    assert np.all(simplex >= 0) and np.isclose(simplex.sum(), S, rtol=1e-6)
    assert np.isclose(np.abs(vector(gp.projection_l1_sphere(TREE, S))[0]).sum(), S, rtol=1e-6)
    assert np.abs(vector(gp.projection_l1_ball(TREE, S))[0]).sum() <= S * (1 + 1e-6)
    assert np.isclose(np.linalg.norm(vector(gp.projection_l2_sphere(TREE, S))[0]), S)
    a = vector(A)[0]
    assert np.isclose(a @ vector(gp.projection_hyperplane(TREE, A, 0.5))[0], 0.5, atol=1e-5)
    for project in (lambda t: gp.projection_simplex(t, S), lambda t: gp.projection_l1_ball(t, S)):
        once = project(TREE)
        assert_close(project(once), flat(once))  # a point of the set is its own projection


def test_box_bounds_are_scalars_or_trees_matched_by_path():
    lower = {"layers": [jnp.full(5, -0.1), jnp.asarray(-1.0)], "enc": {"b": -0.2, "w": -0.3}}
    got = gp.projection_box(TREE, lower, 0.1)
    for path, x in flat(got).items():
        low = {"enc/w": -0.3, "enc/b": -0.2, "layers/0": -0.1, "layers/1": -1.0}[path]
        np.testing.assert_allclose(x, np.clip(flat(TREE)[path], np.float32(low), np.float32(0.1)))
    with jax.numpy_dtype_promotion("standard"):  # optax takes trees of bounds only
        full = jax.tree.map(lambda x, lo: jnp.full_like(x, lo), NO_NONE, lower)
        oracle = op.projection_box(
            NO_NONE, full, jax.tree.map(lambda x: jnp.full_like(x, 0.1), NO_NONE)
        )
    assert_close(got, flat(oracle))


def test_dtypes_are_kept_and_the_math_runs_in_float32():
    tree = {"w": jnp.array([0.7, 0.2, 0.4], jnp.bfloat16), "b": jnp.array([0.1], jnp.float32)}
    got = gp.projection_simplex(tree)
    assert got["w"].dtype == jnp.bfloat16 and got["b"].dtype == jnp.float32
    v, layout = vector(tree)
    want = unvector(ref_simplex(v, 1.0), layout)
    np.testing.assert_allclose(np.asarray(got["w"], np.float64), want["w"], rtol=1e-2)
    np.testing.assert_allclose(np.asarray(got["b"], np.float64), want["b"], atol=1e-6)
    python_leaf = gp.projection_l2_ball({"w": jnp.array([3.0]), "b": 4.0}, 1.0)
    np.testing.assert_allclose(python_leaf["b"], 0.8, rtol=1e-6)


def test_packed_params_project_like_the_tree():
    packed = gradtx.pack(NO_NONE)
    for _name, project, _, _ in CASES:
        assert_close(project(packed).unpack(), flat(project(NO_NONE)), rtol=1e-6)
    a = gradtx.pack(A_NO_NONE)
    assert_close(
        gp.projection_hyperplane(packed, a, 0.5).unpack(),
        flat(gp.projection_hyperplane(NO_NONE, A_NO_NONE, 0.5)),
        rtol=1e-6,
    )


def test_projected_gradient_descent_after_apply_updates():
    """Minimising |x - c|^2 over the simplex by projected SGD converges to the projection of c
    (the nearest point of the set)."""
    c = {"w": jnp.array([0.9, 0.6, -0.3]), "b": jnp.array([0.4])}
    tx = gradtx.sgd(0.1)

    @jax.jit
    def step(params, state):
        grads = jax.grad(lambda p: gradtx.tree.norm(gradtx.tree.sub(p, c), squared=True))(params)
        updates, state = tx.update(grads, state, params)
        return gp.projection_simplex(gradtx.apply_updates(params, updates)), state

    params = gp.projection_simplex(jax.tree.map(jnp.zeros_like, c))
    state = tx.init(params)
    for _ in range(200):
        params, state = step(params, state)
    v, layout = vector(c)
    assert_close(params, unvector(ref_simplex(v, 1.0), layout), rtol=1e-5)


def test_errors_name_the_argument_or_the_path():
    missing = r"`lower` must have the paths of the tree, but path 'enc/b' is in the tree"
    with pytest.raises(ValueError, match=missing):
        gp.projection_box(TREE, {"enc": {"w": 0.0}, "layers": [0.0, 0.0]}, 1.0)
    with pytest.raises(ValueError, match=r"path 'extra' is in `upper` but not in the tree"):
        gp.projection_box(NO_NONE, 0.0, {**jax.tree.map(lambda _: 1.0, NO_NONE), "extra": 1.0})
    with pytest.raises(ValueError, match=r"at path 'enc/b' `upper` has shape \(3,\)"):
        gp.projection_box(
            NO_NONE,
            0.0,
            {**jax.tree.map(lambda _: 1.0, NO_NONE), "enc": {"w": 1.0, "b": jnp.ones(3)}},
        )
    with pytest.raises(ValueError, match=r"`a` is None at path 'enc/w'"):
        gp.projection_hyperplane(
            NO_NONE, {**A_NO_NONE, "enc": {"w": None, "b": A["enc"]["b"]}}, 1.0
        )
    with pytest.raises(ValueError, match="projection_simplex: `scale` must be a scalar"):
        gp.projection_simplex(TREE, jnp.ones(2))
    with pytest.raises(ValueError, match="projection_hyperplane: `b` must be a scalar"):
        gp.projection_hyperplane(TREE, A, jnp.ones(2))
    with pytest.raises(TypeError, match=r"the leaf at 'i' has dtype int32"):
        gp.projection_l2_ball({"i": jnp.arange(3)})
    with pytest.raises(ValueError, match="`lower` must be a scalar or a tree"):
        gp.projection_box(TREE, jnp.zeros(3), 1.0)


def test_the_namespace_is_optaxs():
    assert sorted(gp.__all__) == sorted(
        n for n in dir(optax.projections) if n.startswith("projection")
    )
    assert gradtx.projections is gp
