"""The contract every public transformation and optimizer keeps, run over `registry.REGISTRY`:
the numeric checks on every entry, the checks of the shared machinery (jit, vmap, scan,
donation) on one entry per public name (`registry.PER_NAME`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled import (
    FLOAT_ARRAY_COPY,
    argument_names,
    compiled_step,
    copies_in_called_computations,
    entry_computation,
)
from registry import NON_TRANSFORMATIONS, PER_NAME, REGISTRY, covered_names

import gradtx

# A cross product of the registry: left out of `make quick` (see CONTRIBUTING.md).
pytestmark = pytest.mark.slow

N_STEPS = 20
PARAM_SHAPES = {
    "enc/w": (3, 4),
    "enc/b": (4,),
    "layers/0/w": (2, 3),
    "layers/1/w": (2,),
    "layers/1/s": (),
}


def _random(shape: tuple, rng: np.random.Generator, dtype: Any = np.float32) -> jax.Array:
    return jnp.asarray(rng.normal(size=shape).astype(np.float32), dtype)


def make_tree(values: dict[str, Any]) -> dict:
    """The contract's params layout (nested dicts, a list, a scalar and a `None` leaf)."""
    return {
        "enc": {"w": values["enc/w"], "b": values["enc/b"]},
        "layers": [
            {"w": values["layers/0/w"]},
            {"w": values["layers/1/w"], "s": values["layers/1/s"]},
        ],
        "frozen": None,
    }


def _make_params(dtype: Any = np.float32) -> dict:
    rng = np.random.default_rng(0)
    return make_tree({p: _random(s, rng, dtype) for p, s in PARAM_SHAPES.items()})


def _make_grads(dtype: Any = np.float32) -> list[dict]:
    rng = np.random.default_rng(1)
    return [
        make_tree({p: _random(s, rng, dtype) for p, s in PARAM_SHAPES.items()})
        for _ in range(N_STEPS)
    ]


PARAMS = _make_params()
GRADS = _make_grads()
GRAD_STACK = jax.tree.map(lambda *xs: jnp.stack(xs), *GRADS)

ENTRIES = [pytest.param(e, id=e.id) for e in REGISTRY]
NAMES = [pytest.param(e, id=e.id) for e in PER_NAME]
DESCENT = [pytest.param(e, id=e.id) for e in REGISTRY if e.converges]
ORACLES = [pytest.param(e, id=e.id) for e in REGISTRY if e.oracle is not None]
NAMES_WITH_ORACLES = [pytest.param(e, id=e.id) for e in PER_NAME if e.oracle is not None]
STATE_DTYPE = [pytest.param(e, id=e.id) for e in REGISTRY if e.with_state_dtype is not None]


# --- helpers ------------------------------------------------------------------------------------


def flat(tree: Any) -> dict[str, Any]:
    """`{path: leaf}` rendered with JAX's own key paths (`None` leaves skipped)."""
    kps, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(kp, simple=True, separator="/"): x for kp, x in kps}


def signature(tree: Any) -> tuple:
    """Structure plus `(shape, dtype, weak_type)` of every leaf."""
    leaves = jax.tree.leaves(tree)
    return jax.tree.structure(tree), [
        (tuple(np.shape(x)), jnp.dtype(x.dtype), bool(getattr(jax.typeof(x), "weak_type", False)))
        if not isinstance(x, jax.ShapeDtypeStruct)
        else (tuple(x.shape), jnp.dtype(x.dtype), bool(x.weak_type))
        for x in leaves
    ]


def assert_trees_equal(a: Any, b: Any) -> None:
    """Same structure and bit-for-bit equal leaves of equal dtypes."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def assert_trees_close(a: Any, b: Any, rtol: float) -> None:
    """Same structure and dtypes; leaves equal within `rtol`, relative to each leaf's largest
    magnitude (float32 rounding of a sum of terms is relative to the terms, not the sum)."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        atol = rtol * float(np.max(np.abs(y), initial=0.0))
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def step_fn(tx: Any):
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state, updates

    return step


def run_eager(tx: Any, params: Any, grads_seq: list, state: Any = None):
    """Apply `tx` for each gradient of `grads_seq`, op by op; returns params, state, updates."""
    state = tx.init(params) if state is None else state
    step = step_fn(tx)
    history = []
    for grads in grads_seq:
        params, state, updates = step(params, state, grads)
        history.append(updates)
    return params, state, history


_SHARED: dict[str, tuple[Any, list]] = {}


def shared_step(entry: Any) -> tuple[Any, list]:
    """One jitted `step(tx, params, state, grads)` per entry, the transformation passed as an
    argument (built once, reused by several tests), and the log of its traces. The conftest
    may clear JAX's caches between tests, so a test counts only the traces it causes."""
    if entry.id not in _SHARED:
        traces: list = []

        def step(tx, params, state, grads):
            traces.append(1)
            return step_fn(tx)(params, state, grads)

        _SHARED[entry.id] = (jax.jit(step), traces)
    return _SHARED[entry.id]


_DONATED: dict[tuple[str, str], jax.stages.Compiled] = {}


def shared_donated_step(entry: Any, dtype: Any = jnp.float32) -> jax.stages.Compiled:
    """One compiled step per entry and params dtype, `(params, state, grads) -> (params,
    state)` with params and state donated (`compiled.compiled_step`), built with the entry's
    scalar: the donated-step test runs it, and the copy counts read its program."""
    key = (entry.id, jnp.dtype(dtype).name)
    if key not in _DONATED:
        params, grads = (
            (PARAMS, GRADS) if dtype == jnp.float32 else (_make_params(dtype), _make_grads(dtype))
        )
        _DONATED[key] = compiled_step(entry.make(entry.scalar), params, grads[0])
    return _DONATED[key]


def quadratic(params: Any) -> jax.Array:
    """`sum_i 0.5 * a_i * (p_i - c_i)^2` with curvatures `a_i` in [0.5, 2]."""
    total = jnp.zeros((), jnp.float32)
    for path, p in flat(params).items():
        n = max(p.size, 1)
        a = jnp.linspace(0.5, 2.0, n, dtype=jnp.float32).reshape(p.shape)
        c = jnp.full(p.shape, 0.3, jnp.float32) if path.endswith("b") else jnp.ones(p.shape)
        total = total + jnp.sum(0.5 * a * (p - c) ** 2)
    return total


# --- the registry covers the public API ---------------------------------------------------------


def test_registry_covers_every_public_transformation():
    public = set(gradtx.__all__) - NON_TRANSFORMATIONS
    missing = sorted(public - covered_names())
    assert not missing, f"public transformations without a registry entry: {missing}"


def test_registry_lists_are_current():
    assert NON_TRANSFORMATIONS <= set(gradtx.__all__), sorted(
        NON_TRANSFORMATIONS - set(gradtx.__all__)
    )
    assert covered_names() <= set(gradtx.__all__)
    ids = [e.id for e in REGISTRY]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("entry", ENTRIES)
def test_make_gives_a_transformation(entry):
    tx = entry.make(entry.scalar)
    assert isinstance(tx, gradtx.Transformation)
    assert entry.make(entry.scalar) is not tx


# --- numerics -----------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", DESCENT)
def test_converges_on_quadratic(entry):
    """The loss falls by at least 100x within 200 steps."""
    tx = entry.make(entry.scalar)

    @jax.jit
    def run(params):
        def body(carry, _):
            params, state = carry
            grads = jax.grad(quadratic)(params)
            updates, state = tx.update(grads, state, params)
            return (gradtx.apply_updates(params, updates), state), None

        (params, _), _ = jax.lax.scan(body, (params, tx.init(params)), None, length=200)
        return params

    final = run(PARAMS)
    assert final["frozen"] is None
    start, end = float(quadratic(PARAMS)), float(quadratic(final))
    assert end < start / 100, (start, end)


@pytest.mark.parametrize("entry", ENTRIES)
def test_matches_numpy_reference(entry):
    """20 steps equal the float64 NumPy reference within float32 rounding."""
    tx = entry.make(entry.scalar)
    reference = entry.reference(entry.scalar)
    params, _, history = run_eager(tx, PARAMS, GRADS)

    ref_params = {p: np.asarray(x, np.float64) for p, x in flat(PARAMS).items()}
    # float32 rounding of the params grows with the sizes of the terms added up
    magnitude = {p: np.abs(x) for p, x in ref_params.items()}
    ref_state = reference.init(ref_params)
    for k, grads in enumerate(GRADS):
        ref_updates, ref_state = reference.update(
            {p: np.asarray(g, np.float64) for p, g in flat(grads).items()}, ref_state, ref_params
        )
        ref_params = {p: x + ref_updates[p] for p, x in ref_params.items()}
        got = flat(history[k])
        assert set(got) == set(ref_updates)
        for path, u in got.items():
            want = ref_updates[path]
            magnitude[path] = magnitude[path] + np.abs(want)
            np.testing.assert_allclose(
                np.asarray(u, np.float64),
                want,
                rtol=entry.reference_rtol,
                atol=1e-6 * float(np.max(np.abs(want), initial=0.0)),
                err_msg=f"step {k}, path {path}",
            )
    for path, p in flat(params).items():
        error = np.abs(np.asarray(p, np.float64) - ref_params[path])
        assert np.all(error <= entry.reference_rtol * magnitude[path]), (path, error)


@pytest.mark.parametrize("entry", ORACLES)
def test_matches_optax(entry):
    tx = entry.make(entry.scalar)
    params, _, history = run_eager(tx, PARAMS, GRADS)

    oracle = entry.oracle(entry.scalar)
    with jax.numpy_dtype_promotion("standard"):
        o_params = PARAMS
        o_state = oracle.init(o_params)
        o_update = jax.jit(oracle.update)
        for k, grads in enumerate(GRADS):
            o_updates, o_state = o_update(grads, o_state, o_params)
            o_params = jax.tree.map(lambda p, u: p + u, o_params, o_updates)
            assert_trees_close(history[k], o_updates, rtol=entry.oracle_rtol)
    assert_trees_close(params, o_params, rtol=entry.oracle_rtol)


# --- state structure and dtypes -----------------------------------------------------------------


@pytest.mark.parametrize("entry", ENTRIES)
def test_state_structure_is_stable(entry):
    tx = entry.make(entry.scalar)
    init = tx.init(PARAMS)
    _, eager, _ = run_eager(tx, PARAMS, GRADS[:2])
    _, jitted, _ = shared_step(entry)[0](tx, PARAMS, init, GRADS[0])
    assert signature(eager) == signature(init)
    assert signature(jitted) == signature(init)
    # the state's float slots follow the float32 params
    for key, x in gradtx.state_dict(init).items():
        if jnp.issubdtype(x.dtype, jnp.floating):
            assert x.dtype == jnp.float32, key


@pytest.mark.parametrize("entry", NAMES)
def test_init_accepts_shape_dtype_structs(entry):
    tx = entry.make(entry.scalar)
    expected = signature(tx.init(PARAMS))
    structs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), PARAMS)
    assert signature(tx.init(structs)) == expected
    assert signature(jax.eval_shape(tx.init, structs)) == expected
    assert signature(jax.eval_shape(tx.init, PARAMS)) == expected


def _param_slots(state: Any, params: Any, scalars: bool = False) -> dict[str, tuple[str, Any]]:
    """Float state entries that belong to one parameter and have its shape:
    `{key: (path, leaf)}` (a PRNG key slot of shape (2,) is not a copy of a (2,) parameter;
    scalar parameters' entries only with `scalars`)."""
    by_path = flat(params)
    out = {}
    for key, x in gradtx.state_dict(state).items():
        if not jnp.issubdtype(x.dtype, jnp.floating):
            continue
        for path, p in by_path.items():
            if key.endswith("/" + path) and (scalars or np.ndim(p) > 0) and x.shape == p.shape:
                out[key] = (path, x)
    return out


def _assert_finite_bf16_updates(history: list) -> None:
    for updates in history:
        for path, u in flat(updates).items():
            assert u.dtype == jnp.bfloat16, path
            assert bool(jnp.all(jnp.isfinite(u))), path


# Schedule-free updates run from the params to a point computed from the new z as the state
# keeps it: with bfloat16 z, the update is a step the bfloat16 params can take, within their
# spacing of the float32 one.
STEPS_BETWEEN_KEPT_POINTS = {"schedule_free", "schedule_free_sgd", "schedule_free_adamw"}


@pytest.mark.parametrize("entry", ENTRIES)
def test_bf16_params_default_state(entry):
    params = _make_params(jnp.bfloat16)
    grads = _make_grads(jnp.bfloat16)[:3]
    tx = entry.make(entry.scalar)
    init = tx.init(params)
    for key, (_, x) in _param_slots(init, params).items():
        assert x.dtype == jnp.bfloat16, key
    new_params, state, history = run_eager(tx, params, grads)
    assert signature(state) == signature(init)
    _assert_finite_bf16_updates(history)
    for path, p in flat(new_params).items():
        assert p.dtype == jnp.bfloat16, path

    # The first step agrees with the float32 computation on the same (bf16) values.
    up32 = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    g32 = jax.tree.map(lambda x: x.astype(jnp.float32), grads[0])
    u32, _ = tx.update(g32, tx.init(up32), up32)
    for path, u in flat(history[0]).items():
        want = np.asarray(flat(u32)[path], np.float64)
        got = np.asarray(u, np.float64)
        atol = 1e-2 * float(np.max(np.abs(want), initial=0.0))
        if entry.name in STEPS_BETWEEN_KEPT_POINTS:  # where the params land, within a spacing
            p = np.asarray(flat(params)[path], np.float64)
            got, want = p + got, p + want
            atol = 2.0**-7 * float(np.max(np.abs(want), initial=0.0))
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=atol, err_msg=path)


@pytest.mark.parametrize("entry", STATE_DTYPE)
def test_bf16_params_float32_state(entry):
    params = _make_params(jnp.bfloat16)
    grads = _make_grads(jnp.bfloat16)[:3]
    tx = entry.with_state_dtype(entry.scalar, jnp.float32)
    init = tx.init(params)
    floats = {
        k: x for k, x in gradtx.state_dict(init).items() if jnp.issubdtype(x.dtype, jnp.floating)
    }
    assert floats, "a transformation with a state dtype option keeps float state"
    for key, x in floats.items():
        assert x.dtype == jnp.float32, key
    new_params, state, history = run_eager(tx, params, grads, init)
    assert signature(state) == signature(init)
    # An update comes out in the promoted dtype of its gradient and the state it read: float32
    # where the path keeps float32 state, rounded once by `apply_updates`.
    slots = _param_slots(init, params, scalars=True).values()
    wide = {path for path, x in slots if x.dtype == jnp.float32}
    for updates in history:
        for path, u in flat(updates).items():
            assert u.dtype == (jnp.float32 if path in wide else jnp.bfloat16), path
            assert bool(jnp.all(jnp.isfinite(u))), path
    for path, p in flat(new_params).items():
        assert p.dtype == jnp.bfloat16, path
        assert not np.array_equal(np.asarray(p), np.asarray(flat(params)[path])), path


# --- compilation --------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", NAMES)
def test_no_recompilation_on_second_step(entry):
    """Later steps, each with an equal but freshly built transformation, reuse the first
    compilation."""
    step, traces = shared_step(entry)
    before = len(traces)  # 0 or 1: another test may have compiled it (unless caches were cleared)
    params, state = PARAMS, entry.make(entry.scalar).init(PARAMS)
    for grads in GRADS[:3]:
        params, state, _ = step(entry.make(entry.scalar), params, state, grads)
    assert len(traces) - before <= 1
    assert step._cache_size() == 1


@pytest.mark.parametrize("entry", NAMES)
def test_new_scalar_does_not_recompile(entry):
    """A transformation built with a new scalar, passed as the argument of a jitted step,
    reuses the compiled step (the scalar is a leaf, not part of the cache key), and the step
    gives the eager results. A constructor given a traced scalar is checked by
    `test_vmap_over_stacked_scalar`, which builds the transformations from a batched one."""
    a, b = entry.sweep[0], entry.sweep[2]
    _, state, _ = run_eager(entry.make(entry.scalar), PARAMS, GRADS[:2])
    passed, passed_traces = shared_step(entry)
    before = len(passed_traces)
    out_a = passed(entry.make(a), PARAMS, state, GRADS[2])
    out_b = passed(entry.make(b), PARAMS, state, GRADS[2])
    assert len(passed_traces) - before <= 1
    assert passed._cache_size() == 1
    assert_trees_close(out_a, step_fn(entry.make(a))(PARAMS, state, GRADS[2]), 1e-6)
    assert_trees_close(out_b, step_fn(entry.make(b))(PARAMS, state, GRADS[2]), 1e-6)
    if entry.uses_scalar:
        assert not all(
            np.array_equal(x, y) for x, y in zip(jax.tree.leaves(out_a), jax.tree.leaves(out_b))
        )


@pytest.mark.parametrize("entry", NAMES)
def test_vmap_over_stacked_scalar(entry):
    """Three values of the scalar run as one program, from three states (each after a step
    with its own scalar, so the state is batched too); each slice is the separate run. The
    constructor is called with the batched (traced) scalar."""
    scalars = jnp.asarray(entry.sweep, jnp.float32)
    states = [run_eager(entry.make(s), PARAMS, GRADS[:1])[1] for s in entry.sweep]
    stacked_states = jax.tree.map(lambda *xs: jnp.stack(xs), *states)

    def run(tx, state):
        # The state comes in as an argument, as in training: nothing is constant-folded.
        params, state, history = run_eager(tx, PARAMS, GRADS[1:2], state)
        return params, state, history[-1]

    if entry.uses_scalar:
        # a stack of three transformations, built by vmapping the constructor
        stacked = jax.vmap(entry.make)(scalars)
        assert jax.tree.structure(stacked) == jax.tree.structure(entry.make(entry.scalar))
        assert all(x.shape[0] == 3 for x in jax.tree.leaves(stacked))
        swept = jax.jit(jax.vmap(run))(stacked, stacked_states)
    else:
        swept = jax.jit(jax.vmap(lambda s, state: run(entry.make(s), state)))(
            scalars, stacked_states
        )
    for i in range(3):
        single = run(entry.make(entry.sweep[i]), states[i])
        assert_trees_close(jax.tree.map(lambda x, i=i: x[i], swept), single, rtol=1e-6)


# --- protocol -----------------------------------------------------------------------------------


def _copy(tree: Any) -> Any:
    """Host copies of every leaf (a buffer changed in place would differ from its copy)."""
    return jax.tree.map(lambda x: np.array(x, copy=True), tree)


@pytest.mark.parametrize("entry", NAMES)
def test_update_leaves_its_inputs_unchanged(entry):
    """Gradients, state and params are the same after an eager `update`, so a norm taken
    afterwards is the gradient's real norm (an optimizer that overwrote its gradients in place
    broke that). An eager call runs a compiled program of the library's own
    (gradtx/_core/dispatch.py), which must not donate its arguments; a user's `jax.jit` step
    donates only what the user asks it to (`test_donated_step_matches_undonated`)."""
    tx = entry.make(entry.scalar)
    grads = GRADS[0]
    _, state = tx.update(GRADS[1], tx.init(PARAMS), PARAMS)  # a state with non-zero slots
    before = _copy((grads, state, PARAMS))
    norm_before = gradtx.global_norm(grads)
    jax.block_until_ready(tx.update(grads, state, PARAMS))
    assert_trees_equal((grads, state, PARAMS), before)
    np.testing.assert_array_equal(gradtx.global_norm(grads), norm_before)


@pytest.mark.parametrize("entry", NAMES)
def test_unknown_extra_arguments_are_ignored(entry):
    tx = entry.make(entry.scalar)
    state = tx.init(PARAMS)
    plain = tx.update(GRADS[0], state, PARAMS)
    extra = tx.update(GRADS[0], state, PARAMS, foo=1, value=2.0)
    assert_trees_equal(plain, extra)


@pytest.mark.parametrize("entry", ENTRIES)
def test_params_requirement(entry):
    tx = entry.make(entry.scalar)
    state = tx.init(PARAMS)
    if entry.needs_params:
        with pytest.raises(ValueError, match="needs the params"):
            tx.update(GRADS[0], state)
    else:
        assert_trees_equal(tx.update(GRADS[0], state), tx.update(GRADS[0], state, PARAMS))


@pytest.mark.parametrize("entry", ENTRIES)
def test_state_dict_save_load_continue(entry):
    tx = entry.make(entry.scalar)
    full_params, full_state, full_history = run_eager(tx, PARAMS, GRADS[:8])

    mid_params, mid_state, _ = run_eager(tx, PARAMS, GRADS[:4])
    flat_state = gradtx.state_dict(mid_state)
    on_disk = {k: np.array(v) for k, v in flat_state.items()}  # host copies, as a checkpoint
    for checkpoint in (flat_state, on_disk):
        restored, report = gradtx.load_state_dict(tx, mid_params, checkpoint)
        assert report.clean, str(report)
        assert_trees_equal(restored, mid_state)
        params, state, history = run_eager(tx, mid_params, GRADS[4:8], state=restored)
        assert_trees_equal(params, full_params)
        assert_trees_equal(state, full_state)
        assert_trees_equal(history, full_history[4:])


@pytest.mark.parametrize("entry", NAMES)
def test_donated_step_matches_undonated(entry):
    """The same step with params and state donated gives bit-for-bit the same results."""
    tx = entry.make(entry.scalar)
    plain = compiled_step(tx, PARAMS, GRADS[0], donate=False)
    donated = shared_donated_step(entry)

    p1, s1 = PARAMS, tx.init(PARAMS)
    p2 = jax.tree.map(jnp.copy, PARAMS)
    s2 = tx.init(p2)
    for grads in GRADS[:4]:
        p1, s1 = plain(p1, s1, grads)
        old = jax.tree.leaves(p2)
        p2, s2 = donated(p2, s2, grads)
        assert all(x.is_deleted() for x in old)  # the buffers were donated
        assert_trees_equal(p1, p2)
        assert_trees_equal(s1, s2)


def _float_array_copies(program: str) -> int:
    """How many float arrays XLA copies in the entry computation of a `program`."""
    return len(FLOAT_ARRAY_COPY.findall(entry_computation(program)))


@pytest.mark.parametrize("entry", NAMES_WITH_ORACLES)
def test_a_donated_step_copies_no_more_arrays_than_optax(entry):
    """XLA copies a donated buffer that is read after it is overwritten; each copy costs a
    pass over memory and a buffer. (Armijo backtracking with `store_grad` copied the incoming
    gradients into its loop: 4 copies against optax's 0.)"""
    ours = _float_array_copies(shared_donated_step(entry).as_text())
    with jax.numpy_dtype_promotion("standard"):
        optax_step = compiled_step(
            entry.oracle(entry.scalar), PARAMS, GRADS[0], lambda p, u: jax.tree.map(jnp.add, p, u)
        )
        theirs = _float_array_copies(optax_step.as_text())
    assert ours <= theirs


# Entries whose step reads a slot's old value in a kernel other than the one that writes its
# new value in place: the previous gradient (Adan, optimistic gradient), the previous second
# moment or Hessian estimate (ADOPT, ACProp, Sophia), a sum over every element (D-Adaptation,
# SM3's cover maxima), values kept for a later step (lookahead's gap, SAM's cache, L-BFGS's
# memory, Mechanic's moments), or the params after the update has written them (SAM,
# L-BFGS). XLA's CPU compiler orders kernels by their data alone and copies such a slot or
# param, as it does optax's. (Momo's new lower bound reads the params in its sums; summed in
# a fixed pairwise order, they were copied.) `accumulate` around plain SGD runs the step on
# every call and selects it: the update and the new sum each read the old sum, as in optax's
# `MultiSteps` (a `lax.cond` copies no slot, but costs kernels: 1.3-1.5x optax's compile).
READS_AN_OLD_SLOT = {
    "scale_by_adan",
    "adan",
    "scale_by_optimistic_gradient",
    "optimistic_gradient_descent",
    "optimistic_adam",
    "contrib.scale_by_adopt",
    "contrib.adopt",
    "contrib.scale_by_acprop",
    "contrib.acprop-mask",
    "contrib.scale_by_sophia-no_clipping",
    "contrib.sophia",
    "contrib.dadapt_adamw",
    "scale_by_sm3-b2",
    "sm3",
    "lookahead-sgd",
    "contrib.sam-sgd",
    "scale_by_lbfgs",
    "lbfgs",
    "contrib.mechanize-adam",
    "accumulate-sgd",
}
# With bfloat16 params, `ema_params` averages the new params as `apply_updates` rounds them;
# XLA recomputes that sum from the old params in the average's kernel, and copies them.
READS_THE_OLD_PARAMS_IN_BF16 = {"ema_params-sgd-momentum"}


def _copied_buffers(entry: Any, dtype: Any) -> tuple[set[str], list[str]]:
    """The params and state slots (`p['enc']`, `s['nu']`) of which the entry's donated step
    on `dtype` params copies an array, and the arrays copied inside the computations it
    calls."""
    whole = shared_donated_step(entry, dtype).as_text()
    program = entry_computation(whole)
    names = argument_names(program)
    copied = FLOAT_ARRAY_COPY.findall(program)
    slots = {names.get(x, "").split("]")[0] + "]" for x in copied}
    return {slot for slot in slots if slot.startswith(("s[", "p["))}, (
        copies_in_called_computations(whole)
    )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("entry", NAMES)
def test_a_donated_step_copies_no_param_or_state_slot(entry, dtype):
    """A buffer written in place is read by the kernel that writes it, or through its new
    value: a copy would be one more pass over it per step. (AdaBelief's second moment, with
    eps_root summed last, was recomputed from the old one in the update's kernel and copied:
    1.4x the step time on one 4M-float leaf; COCOB's reward, a `maximum`, likewise, and the
    params with it. With bfloat16 state, schedule-free's z and Rprop's slots were copied
    while the update read their unrounded new values.) Nor does a branch of a `lax.cond` or
    a loop's body copy a param or a state slot: accumulate's branches returned the
    accumulators, which XLA copied on every call (2.1x optax's step around SGD on 3.1M
    floats). Its waiting branch may copy the gradients, which it passes through as its
    updates."""
    copied, copied_inside = _copied_buffers(entry, dtype)
    assert [c for c in copied_inside if not c.startswith("g[")] == []
    if entry.id in READS_AN_OLD_SLOT:  # the list holds what float32 steps copy
        assert copied or dtype != jnp.float32, "nothing copied: take it out of READS_AN_OLD_SLOT"
    elif entry.id in READS_THE_OLD_PARAMS_IN_BF16 and dtype == jnp.bfloat16:
        assert copied <= {"p['enc']", "p['layers']"}, copied
    else:
        assert copied == set()


@pytest.mark.parametrize("entry", NAMES)
def test_inside_lax_scan(entry):
    tx = entry.make(entry.scalar)

    @jax.jit
    def run(params, state, grad_stack):
        def body(carry, grads):
            params, state, updates = step_fn(tx)(*carry, grads)
            return (params, state), updates

        (params, state), history = jax.lax.scan(body, (params, state), grad_stack)
        return params, state, history

    params, state, history = run(PARAMS, tx.init(PARAMS), GRAD_STACK)
    e_params, e_state, e_history = run_eager(tx, PARAMS, GRADS)
    assert_trees_close(params, e_params, rtol=entry.scan_rtol)
    assert_trees_close(state, e_state, rtol=entry.scan_rtol)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *e_history)
    assert_trees_close(history, stacked, rtol=entry.scan_rtol)


@pytest.mark.parametrize("entry", ENTRIES)
def test_none_gradient_leaves_keep_their_state(entry):
    tx = entry.make(entry.scalar)
    _, state, _ = run_eager(tx, PARAMS, GRADS[:1])
    grads = {**GRADS[1], "enc": {"w": None, "b": GRADS[1]["enc"]["b"]}}
    params, new_state, (updates,) = run_eager(tx, PARAMS, [grads], state=state)

    assert updates["enc"]["w"] is None
    assert updates["frozen"] is None
    assert jax.tree.structure(updates) == jax.tree.structure(grads)
    np.testing.assert_array_equal(np.asarray(params["enc"]["w"]), np.asarray(PARAMS["enc"]["w"]))
    before, after = gradtx.state_dict(state), gradtx.state_dict(new_state)
    assert set(before) == set(after)
    for key in before:
        if key.endswith("/enc/w"):
            assert after[key].dtype == before[key].dtype
            np.testing.assert_array_equal(np.asarray(after[key]), np.asarray(before[key]), key)
        if key.endswith("count/enc/b"):
            assert int(after[key]) == 2 and int(after[key.replace("enc/b", "enc/w")]) == 1


# The packed path runs the same math over a buffer instead of leaf by leaf, but not with the
# same machine code: XLA vectorises a buffer and a small leaf differently (loop tails and 0-d
# arrays run as scalar code, where LLVM may contract multiply-adds into FMAs differently), and
# global norms sum the buffer in another order. Results agree to a few float32 ulps.
PACKED_RTOL = 1e-6


@pytest.mark.parametrize("entry", ENTRIES)
def test_packed_params_match_the_tree(entry):
    """The packed layout (one buffer per dtype) gives the per-leaf layout's results within
    PACKED_RTOL (relative to each leaf's largest magnitude), and the same `state_dict` keys,
    so checkpoints are shared between packed and unpacked models."""
    tx = entry.make(entry.scalar)
    if not entry.packed:
        # TypeError: the transformation cannot run on packed params; ValueError: the entry's
        # selection splits the packed buffer, which belongs to one group.
        with pytest.raises((TypeError, ValueError), match="packed params"):
            tx.init(gradtx.pack(PARAMS))
        return
    params, state, history = run_eager(tx, PARAMS, GRADS[:4])
    packed = gradtx.pack(PARAMS)
    p_params, p_state, p_history = run_eager(tx, packed, [gradtx.pack(g) for g in GRADS[:4]])

    assert isinstance(p_params, gradtx.Packed)
    assert_trees_close(p_params.unpack(), params, rtol=PACKED_RTOL)
    for p_updates, updates in zip(p_history, history):
        assert_trees_close(p_updates.unpack(), updates, rtol=PACKED_RTOL)
    flat_state, p_flat_state = gradtx.state_dict(state), gradtx.state_dict(p_state)
    assert sorted(p_flat_state) == sorted(flat_state)
    assert_trees_close(p_flat_state, flat_state, rtol=PACKED_RTOL)
    # A packed checkpoint restores into the unpacked model and back.
    restored, report = gradtx.load_state_dict(tx, PARAMS, p_flat_state)
    assert report.clean
    assert_trees_equal(gradtx.state_dict(restored), p_flat_state)
    repacked, report = gradtx.load_state_dict(tx, packed, flat_state)
    assert report.clean
    assert_trees_equal(gradtx.state_dict(repacked), flat_state)


@pytest.mark.parametrize("entry", [e for e in ENTRIES if e.values[0].packed])
def test_bucketed_state_matches_the_tree(entry):
    """`gradtx.bucketed(tx)` (state in flat buffers, params a tree) gives the per-leaf
    layout's params, updates and `state_dict` within PACKED_RTOL, and its checkpoints load
    into the per-leaf layout."""
    tx = entry.make(entry.scalar)
    params, state, history = run_eager(tx, PARAMS, GRADS[:3])
    b_params, b_state, b_history = run_eager(gradtx.bucketed(tx), PARAMS, GRADS[:3])
    assert_trees_close(b_params, params, rtol=PACKED_RTOL)
    for b_updates, updates in zip(b_history, history):
        assert_trees_close(b_updates, updates, rtol=PACKED_RTOL)
    flat_state, b_flat_state = gradtx.state_dict(state), gradtx.state_dict(b_state)
    if "inner" in b_state:  # a state that is not a dict is kept under `inner`
        b_flat_state = {k.removeprefix("inner/"): v for k, v in b_flat_state.items()}
    assert sorted(b_flat_state) == sorted(flat_state)
    assert_trees_close(b_flat_state, flat_state, rtol=PACKED_RTOL)
    restored, report = gradtx.load_state_dict(tx, PARAMS, b_flat_state)
    assert report.clean
