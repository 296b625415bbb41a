"""L-BFGS and the line searches beyond the contract: step-by-step references on real problems,
optax and scipy as oracles, global inner products over nested params, partial updates,
`value_and_grad_from_state`, and the errors of misuse."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import references.lbfgs as rl
import scipy.optimize

import gradtx

# --- problems ------------------------------------------------------------------------------------

ROSENBROCK_10 = np.array([1.3, 0.7, 0.8, 1.9, 1.2, 0.9, 1.1, 0.6, 1.4, 0.5])


def rosenbrock(p: dict) -> jax.Array:
    x = p["x"]
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


def rosenbrock_np(x: np.ndarray) -> float:
    return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))


def rosenbrock_grad_np(x: np.ndarray) -> np.ndarray:
    g = np.zeros_like(x)
    g[:-1] = -400.0 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2.0 * (1 - x[:-1])
    g[1:] += 200.0 * (x[1:] - x[:-1] ** 2)
    return g


_rng = np.random.default_rng(0)
A = _rng.normal(size=(30, 5))
B = _rng.normal(size=30)


def least_squares(p: dict) -> jax.Array:
    """`|A w + b - y|^2 / 2` with the weights split over a nested dict (two leaves)."""
    w = jnp.concatenate([p["w"]["head"], p["w"]["tail"]])
    residual = jnp.asarray(A, w.dtype) @ w + p["bias"] - jnp.asarray(B, w.dtype)
    return 0.5 * jnp.sum(residual**2)


def least_squares_np(x: np.ndarray) -> float:
    residual = A @ x[:5] + x[5] - B
    return float(0.5 * residual @ residual)


def least_squares_grad_np(x: np.ndarray) -> np.ndarray:
    residual = A @ x[:5] + x[5] - B
    return np.concatenate([A.T @ residual, [residual.sum()]])


def ls_params(x: np.ndarray, dtype=jnp.float32) -> dict:
    return {
        "w": {"head": jnp.asarray(x[:2], dtype), "tail": jnp.asarray(x[2:5], dtype)},
        "bias": jnp.asarray(x[5], dtype),
    }


def ls_vector(p: dict) -> np.ndarray:
    w = p["w"]
    parts = [w["head"], w["tail"], jnp.reshape(p["bias"], (1,))]
    return np.concatenate([np.asarray(x, np.float64) for x in parts])


def scipy_minimum(fun, jac, x0: np.ndarray) -> np.ndarray:
    options = {"gtol": 1e-12, "ftol": 1e-15, "maxiter": 1000}
    return scipy.optimize.minimize(fun, x0, jac=jac, method="L-BFGS-B", options=options).x


def solve(tx, loss_fn, params, steps: int):
    """`steps` L-BFGS steps in one jitted `lax.scan`, reusing the search's value and gradient."""
    value_and_grad = gradtx.value_and_grad_from_state(loss_fn)

    def step(carry, _):
        p, state = carry
        value, grads = value_and_grad(p, state=state)
        updates, state = tx.update(grads, state, p, value=value, grad=grads, value_fn=loss_fn)
        return (gradtx.apply_updates(p, updates), state), value

    run = jax.jit(lambda p: jax.lax.scan(step, (p, tx.init(p)), None, length=steps))
    (params, state), values = run(params)
    return params, state, values


def eager_steps(tx, loss_fn, params, steps: int):
    """Step by step, each step's `(params, grads, value, updates)` recorded."""
    state, out = tx.init(params), []
    for _ in range(steps):
        value, grads = jax.value_and_grad(loss_fn)(params)
        updates, state = tx.update(grads, state, params, value=value, grad=grads, value_fn=loss_fn)
        out.append((params, grads, value, updates))
        params = gradtx.apply_updates(params, updates)
    return out, state


def flat64(tree) -> dict[str, np.ndarray]:
    return {p: np.asarray(x, np.float64) for p, x in gradtx.paths.leaves(tree).items()}


def assert_close(got: dict, want: dict, rtol: float, what: str = "") -> None:
    assert set(got) == set(want), what
    scale = max(float(np.max(np.abs(v), initial=0.0)) for v in want.values())
    for path in want:
        np.testing.assert_allclose(
            got[path], want[path], rtol=rtol, atol=rtol * scale, err_msg=f"{what} {path}"
        )


# --- the two-loop recursion ---------------------------------------------------------------------


def _lbfgs_inputs(steps: int):
    """Params and gradients of `steps` steps of L-BFGS with a fixed step on least squares."""
    tx, params = gradtx.scale_by_lbfgs(memory_size=3), ls_params(np.full(6, 0.5))
    state, out = tx.init(params), []
    for _ in range(steps):
        grads = jax.grad(least_squares)(params)
        updates, state = tx.update(grads, state, params)
        out.append((params, grads, updates))
        params = jax.tree.map(lambda p, u: p - 0.5 * u, params, updates)
    return out


def test_scale_by_lbfgs_matches_the_reference_step_by_step():
    """Eight steps (the memory of 3 wraps around) on the float32 inputs gradtx saw."""
    reference = rl.scale_by_lbfgs(memory_size=3)
    state = reference.init({})
    for k, (params, grads, updates) in enumerate(_lbfgs_inputs(8)):
        want, state = reference.update(flat64(grads), state, flat64(params))
        assert_close(flat64(updates), want, 1e-5, f"step {k}")


def test_scale_by_lbfgs_matches_optax():
    oracle = optax.scale_by_lbfgs(memory_size=3)
    inputs = _lbfgs_inputs(8)
    state = oracle.init(inputs[0][0])
    for k, (params, grads, updates) in enumerate(inputs):
        with jax.numpy_dtype_promotion("standard"):
            want, state = oracle.update(grads, state, params)
        assert_close(flat64(updates), flat64(want), 1e-5, f"step {k}")


def test_scale_by_lbfgs_without_scaling_starts_from_the_identity():
    tx = gradtx.scale_by_lbfgs(scale_init_precond=False)
    params, grads = {"w": jnp.array([1.0, 2.0])}, {"w": jnp.array([3.0, 4.0])}
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_array_equal(updates["w"], grads["w"])  # no pair, no 1/||g||


def test_the_secant_step_is_exact_on_a_parabola():
    """With one pair in one dimension, H = s / y: the step lands on the minimum."""
    grad_fn = jax.grad(lambda p: jnp.sum(2.0 * (p["w"] - 3.0) ** 2))
    tx, params = gradtx.scale_by_lbfgs(), {"w": jnp.zeros(1)}
    state = tx.init(params)
    for _ in range(2):
        updates, state = tx.update(grad_fn(params), state, params)
        params = {"w": params["w"] - updates["w"]}
    np.testing.assert_allclose(params["w"], [3.0], rtol=1e-6)


# --- the whole optimizer ------------------------------------------------------------------------


def _objective(loss_np, grad_np, to_vector, from_vector):
    """A `references.lbfgs.Objective` maker for a flat-dict problem given as vector functions."""

    def make(params: dict, grads: dict) -> rl.Objective:
        def loss(flat):
            return loss_np(to_vector(flat))

        def grad(flat):
            return from_vector(grad_np(to_vector(flat)))

        return rl.Objective(loss, grad, loss(params), {p: g for p, g in grads.items()})

    return make


def _ls_to_vector(flat: dict) -> np.ndarray:
    return np.concatenate(
        [np.ravel(flat["w/head"]), np.ravel(flat["w/tail"]), np.ravel(flat["bias"])]
    )


def _ls_from_vector(x: np.ndarray) -> dict:
    return {"w/head": x[:2], "w/tail": x[2:5], "bias": np.asarray(x[5])}


@pytest.mark.parametrize("search", ["zoom", "backtracking"])
def test_lbfgs_matches_the_reference_step_by_step(search):
    """Each step of `lbfgs` (direction and line search) equals the float64 reference given the
    same params and gradient, on least squares: the searches accept the same step sizes."""
    if search == "zoom":
        tx = gradtx.lbfgs(memory_size=4)
        ref_search = rl.zoom(20, initial_guess_strategy="one")
    else:
        linesearch = gradtx.scale_by_backtracking_linesearch(15, store_grad=True)
        tx = gradtx.lbfgs(memory_size=4, linesearch=linesearch)
        ref_search = rl.backtracking(15, store_grad=True)
    objective = _objective(least_squares_np, least_squares_grad_np, _ls_to_vector, _ls_from_vector)
    reference = rl.with_objective(rl.lbfgs_direction(None, 4), ref_search, objective)
    steps, _ = eager_steps(tx, least_squares, ls_params(np.zeros(6)), 8)
    state = reference.init({})
    for k, (params, grads, _, updates) in enumerate(steps):
        # The reference's direction state follows gradtx's params, step by step.
        want, state = reference.update(flat64(grads), state, flat64(params))
        assert_close(flat64(updates), want, 1e-5, f"step {k}")


@pytest.mark.parametrize("problem", ["rosenbrock_2", "rosenbrock_10", "least_squares"])
def test_lbfgs_matches_optax(problem):
    """optax's `lbfgs` with its defaults takes the same steps (same search, same trials)."""
    if problem == "least_squares":
        loss_fn, params = least_squares, ls_params(np.zeros(6))
    else:
        x0 = [-1.2, 1.0] if problem == "rosenbrock_2" else ROSENBROCK_10
        loss_fn, params = rosenbrock, {"x": jnp.asarray(x0, jnp.float32)}

    def stepper(tx, apply):
        @jax.jit  # the same compiled step for both, so they round alike
        def step(p, state):
            with jax.numpy_dtype_promotion("standard"):  # optax mixes dtypes
                value, grads = jax.value_and_grad(loss_fn)(p)
                kwargs = {"value": value, "grad": grads, "value_fn": loss_fn}
                updates, state = tx.update(grads, state, p, **kwargs)
                return apply(p, updates), state, updates

        return step

    ours, theirs = gradtx.lbfgs(), optax.lbfgs()
    step, o_step = stepper(ours, gradtx.apply_updates), stepper(theirs, optax.apply_updates)
    p, state, o_p, o_state = params, ours.init(params), params, theirs.init(params)
    for k in range(10):
        p, state, updates = step(p, state)
        o_p, o_state, o_updates = o_step(o_p, o_state)
        assert_close(flat64(updates), flat64(o_updates), 1e-5, f"step {k}")
        info = optax.tree.get(o_state, "info")
        assert int(state["info"]["num_linesearch_steps"]) == int(info.num_linesearch_steps)


CASES = {
    "rosenbrock_2": (rosenbrock, rosenbrock_np, rosenbrock_grad_np, np.array([-1.2, 1.0]), 100),
    "rosenbrock_10": (rosenbrock, rosenbrock_np, rosenbrock_grad_np, ROSENBROCK_10, 100),
    "least_squares": (least_squares, least_squares_np, least_squares_grad_np, np.zeros(6), 30),
}


def _params_of(problem: str, x: np.ndarray, dtype) -> dict:
    if problem == "least_squares":
        return ls_params(x, dtype)
    return {"x": jnp.asarray(x, dtype)}


def _vector_of(problem: str, params: dict) -> np.ndarray:
    return ls_vector(params) if problem == "least_squares" else np.asarray(params["x"], np.float64)


@pytest.mark.parametrize("problem", list(CASES))
def test_lbfgs_reaches_scipys_minimum_in_float64(problem):
    loss_fn, fun, jac, x0, steps = CASES[problem]
    want = scipy_minimum(fun, jac, x0)
    with jax.enable_x64(True):
        params, state, values = solve(
            gradtx.lbfgs(), loss_fn, _params_of(problem, x0, jnp.float64), steps
        )
        assert state["value"].dtype == jnp.float64
    np.testing.assert_allclose(_vector_of(problem, params), want, rtol=1e-8, atol=1e-8)
    assert float(values[-1]) <= fun(want) + 1e-12


@pytest.mark.parametrize("problem", list(CASES))
def test_lbfgs_reaches_scipys_minimum_in_float32(problem):
    loss_fn, fun, jac, x0, steps = CASES[problem]
    want = scipy_minimum(fun, jac, x0)
    params, _, _ = solve(gradtx.lbfgs(), loss_fn, _params_of(problem, x0, jnp.float32), steps)
    np.testing.assert_allclose(_vector_of(problem, params), want, rtol=2e-4, atol=2e-4)


def test_the_step_runs_in_scan_and_fori_loop_as_eagerly():
    loss_fn, params, tx = least_squares, ls_params(np.zeros(6)), gradtx.lbfgs()
    steps, eager_state = eager_steps(tx, loss_fn, params, 6)
    eager_params = gradtx.apply_updates(steps[-1][0], steps[-1][3])
    scanned, scan_state, _ = solve(tx, loss_fn, params, 6)

    value_and_grad = gradtx.value_and_grad_from_state(loss_fn)

    def body(_, carry):
        p, state = carry
        value, grads = value_and_grad(p, state=state)
        updates, state = tx.update(grads, state, p, value=value, grad=grads, value_fn=loss_fn)
        return gradtx.apply_updates(p, updates), state

    looped, loop_state = jax.jit(lambda p: jax.lax.fori_loop(0, 6, body, (p, tx.init(p))))(params)
    for got in (scanned, looped):
        assert_close(flat64(got), flat64(eager_params), 1e-5)
    for got_state in (scan_state, loop_state):
        assert_close(gradtx.state_dict(got_state), gradtx.state_dict(eager_state), 1e-4)


# --- paths: global inner products, state_dict, partial updates ----------------------------------


def _split(x: jax.Array) -> dict:
    return {"a": {"head": x[:3]}, "b": [x[3:7], {"tail": x[7:]}]}


def test_nested_params_take_the_steps_of_one_vector():
    """The inner products are sums over every path: a 10-D Rosenbrock split over three leaves
    of a nested dict follows the trajectory of the single vector."""

    def nested_loss(p: dict) -> jax.Array:
        x = jnp.concatenate([p["a"]["head"], p["b"][0], p["b"][1]["tail"]])
        return rosenbrock({"x": x})

    x0 = jnp.asarray(ROSENBROCK_10, jnp.float32)
    flat, _, _ = solve(gradtx.lbfgs(), rosenbrock, {"x": x0}, 12)
    nested, state, _ = solve(gradtx.lbfgs(), nested_loss, _split(x0), 12)
    assert_close(flat64(nested), flat64(_split(flat["x"])), 1e-5)
    memory = gradtx.state_dict(state)["diff_params_memory/b/1/tail"]
    assert memory.shape == (10, 3)


def test_state_dict_names_paths_and_scalars():
    params = {"enc": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}, "head": [jnp.ones(2)]}
    state = gradtx.lbfgs(memory_size=4).init(params)
    keys = gradtx.state_dict(state)
    per_path = ["params", "updates", "diff_params_memory", "diff_updates_memory", "grad"]
    for path in ("enc/w", "enc/b", "head/0"):
        for slot in per_path:
            assert f"{slot}/{path}" in keys, (slot, path)
    assert keys["diff_params_memory/enc/w"].shape == (4, 2, 3)
    assert keys["grad/enc/w"].shape == (2, 3)
    scalars = {"count", "weights_memory", "learning_rate", "value"}
    info = {
        "info/num_linesearch_steps",
        "info/decrease_error",
        "info/curvature_error",
        "info/failed",
    }
    slots = {f"{slot}/{path}" for slot in per_path for path in ("enc/w", "enc/b", "head/0")}
    assert set(keys) == slots | scalars | info
    assert keys["weights_memory"].shape == (4,)
    restored, report = gradtx.load_state_dict(gradtx.lbfgs(memory_size=4), params, keys)
    assert report.clean
    stats = gradtx.stats(state)
    assert set(stats) == info


def test_a_path_without_gradient_does_not_move_nor_its_memory():
    params = {"a": jnp.array([1.0, -1.0]), "b": jnp.array([0.5, 2.0, -1.0])}

    def loss_fn(p):
        return jnp.sum((p["a"] - 2.0) ** 2) + jnp.sum(jnp.cos(p["b"]) + p["b"] ** 2)

    tx = gradtx.lbfgs()
    steps, state = eager_steps(tx, loss_fn, params, 3)
    params = gradtx.apply_updates(steps[-1][0], steps[-1][3])
    before = gradtx.state_dict(state)
    value, grads = jax.value_and_grad(loss_fn)(params)
    grads = {"a": grads["a"], "b": None}
    updates, state = tx.update(grads, state, params, value=value, grad=grads, value_fn=loss_fn)
    assert updates["b"] is None
    after = gradtx.state_dict(state)
    for key in before:
        if key.endswith("/b"):
            np.testing.assert_array_equal(after[key], before[key], key)
    assert int(after["count"]) == int(before["count"]) + 1


def test_a_path_never_given_a_gradient_leaves_the_others_as_without_it():
    """`b` always `None`: `a` follows exactly the run of L-BFGS on `a` alone."""

    def loss_fn(p):
        return jnp.sum((p["a"] - 2.0) ** 2 * jnp.array([1.0, 5.0])) + jnp.sum(p["a"] ** 4)

    alone, _ = eager_steps(gradtx.lbfgs(), loss_fn, {"a": jnp.array([0.0, 1.0])}, 5)
    tx, params = gradtx.lbfgs(), {"a": jnp.array([0.0, 1.0]), "b": jnp.ones(3)}
    state = tx.init(params)
    for k, (_, _, _, want) in enumerate(alone):
        value, grads = jax.value_and_grad(loss_fn)(params)
        grads = {"a": grads["a"], "b": None}
        updates, state = tx.update(grads, state, params, value=value, grad=grads, value_fn=loss_fn)
        np.testing.assert_allclose(updates["a"], want["a"], rtol=1e-6, err_msg=f"step {k}")
        params = gradtx.apply_updates(params, updates)
    np.testing.assert_array_equal(params["b"], jnp.ones(3))


# --- value_and_grad_from_state ------------------------------------------------------------------


def test_value_and_grad_from_state_computes_first_then_reuses():
    loss_fn, params = least_squares, ls_params(np.zeros(6))
    tx = gradtx.lbfgs()
    value_and_grad = gradtx.value_and_grad_from_state(loss_fn)
    state = tx.init(params)
    value, grads = value_and_grad(params, state=state)  # nothing kept yet: computed
    want_value, want_grads = jax.value_and_grad(loss_fn)(params)
    assert value == want_value
    assert_close(flat64(grads), flat64(want_grads), 0.0)
    updates, state = tx.update(grads, state, params, value=value, grad=grads, value_fn=loss_fn)
    params = gradtx.apply_updates(params, updates)
    value, grads = value_and_grad(params, state=state)  # kept by the search: read back
    assert value == state["value"]
    kept = {k[5:]: v for k, v in flat64(gradtx.state_dict(state)).items() if k.startswith("grad/")}
    assert_close(flat64(grads), kept, 0.0)
    # Read back, not computed: another function gives the same (kept) value.
    other = gradtx.value_and_grad_from_state(lambda p: loss_fn(p) + 1.0)
    assert other(params, state=state)[0] == value
    want_value, want_grads = jax.value_and_grad(loss_fn)(params)
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    assert_close(flat64(grads), flat64(want_grads), 1e-5)


def test_value_and_grad_from_state_passes_arguments_and_finds_the_search_in_a_chain():
    def loss_fn(p, target, *, weight):
        return weight * jnp.sum((p["w"] - target) ** 2)

    tx = gradtx.chain(gradtx.clip_by_global_norm(10.0), gradtx.lbfgs())
    params, target = {"w": jnp.zeros(3)}, jnp.array([1.0, 2.0, 3.0])
    value_and_grad = gradtx.value_and_grad_from_state(loss_fn)
    state = tx.init(params)
    for _ in range(3):
        value, grads = value_and_grad(params, target, state=state, weight=2.0)
        updates, state = tx.update(
            grads,
            state,
            params,
            value=value,
            grad=grads,
            value_fn=loss_fn,
            target=target,
            weight=2.0,
        )
        params = gradtx.apply_updates(params, updates)
    np.testing.assert_allclose(params["w"], target, rtol=1e-6)


def test_backtracking_keeps_the_gradient_only_when_asked():
    def loss_fn(p):
        return jnp.sum((p["w"] - 1.0) ** 2)

    params = {"w": jnp.zeros(2)}
    for store_grad in (False, True):
        tx = gradtx.lbfgs(
            linesearch=gradtx.scale_by_backtracking_linesearch(10, store_grad=store_grad)
        )
        state = tx.init(params)
        assert ("grad/w" in gradtx.state_dict(state)) == store_grad
        value_and_grad = gradtx.value_and_grad_from_state(loss_fn)
        if not store_grad:
            with pytest.raises(ValueError, match="store_grad=True"):
                value_and_grad(params, state=state)
        else:
            value, grads = value_and_grad(params, state=state)
            assert float(value) == 2.0


def test_value_and_grad_from_state_errors():
    value_and_grad = gradtx.value_and_grad_from_state(lambda p: jnp.sum(p["w"] ** 2))
    params = {"w": jnp.ones(2)}
    with pytest.raises(ValueError, match="exactly one line search.*found 0"):
        value_and_grad(params, state=gradtx.adam(0.1).init(params))
    two = gradtx.named_chain(("first", gradtx.lbfgs()), ("second", gradtx.lbfgs()))
    with pytest.raises(ValueError, match="found 2 at \\['first', 'second'\\]"):
        value_and_grad(params, state=two.init(params))
    with pytest.raises(KeyError, match="no gradient for path 'v'"):
        value_and_grad({"v": jnp.ones(2)}, state=gradtx.lbfgs().init(params))


# --- the line searches alone --------------------------------------------------------------------


def _quadratic(p):
    return jnp.sum((p["w"] - 1.0) ** 2 * jnp.array([1.0, 10.0]))


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (
            lambda: gradtx.scale_by_zoom_linesearch(10),
            lambda: optax.scale_by_zoom_linesearch(10),
        ),
        (
            lambda: gradtx.scale_by_zoom_linesearch(10, max_learning_rate=4.0, curv_rtol=0.5),
            lambda: optax.scale_by_zoom_linesearch(10, max_learning_rate=4.0, curv_rtol=0.5),
        ),
        (
            lambda: gradtx.scale_by_backtracking_linesearch(5, store_grad=True),
            lambda: optax.scale_by_backtracking_linesearch(5, store_grad=True),
        ),
    ],
    ids=["zoom", "zoom-capped", "backtracking"],
)
def test_line_searches_match_optax_along_given_directions(ours, theirs):
    """Descent, overshooting, uphill and short directions, the step size carried between them."""
    params = {"w": jnp.zeros(2)}
    value, grads = jax.value_and_grad(_quadratic)(params)
    tx, oracle = ours(), theirs()
    state, o_state = tx.init(params), oracle.init(params)
    for scale in (-0.01, -1.0, 1.0, -0.05, -0.001):
        direction = {"w": scale * grads["w"]}
        kwargs = {"value": value, "grad": grads, "value_fn": _quadratic}
        updates, state = tx.update(direction, state, params, **kwargs)
        o_updates, o_state = oracle.update(direction, o_state, params, **kwargs)
        np.testing.assert_allclose(updates["w"], o_updates["w"], rtol=1e-6, err_msg=str(scale))
        assert float(state["learning_rate"]) == pytest.approx(float(o_state.learning_rate), 1e-6)
        assert int(state["info"]["num_linesearch_steps"]) == int(o_state.info.num_linesearch_steps)


def test_line_searches_match_the_reference_along_given_directions():
    params = {"w": jnp.zeros(2)}
    value, grads = jax.value_and_grad(_quadratic)(params)

    def loss(flat):
        return float(np.sum((flat["w"] - 1.0) ** 2 * np.array([1.0, 10.0])))

    def grad(flat):
        return {"w": 2.0 * (flat["w"] - 1.0) * np.array([1.0, 10.0])}

    objective = rl.Objective(loss, grad, float(value), flat64(grads))
    for tx, reference in (
        (gradtx.scale_by_zoom_linesearch(10), rl.zoom(10)),
        (gradtx.scale_by_backtracking_linesearch(5), rl.backtracking(5)),
    ):
        state, ref_state = tx.init(params), reference.init({})
        for scale in (-0.01, -1.0, 1.0, -0.05, -0.001):
            direction = {"w": scale * grads["w"]}
            kwargs = {"value": value, "grad": grads, "value_fn": _quadratic}
            updates, state = tx.update(direction, state, params, **kwargs)
            ref_state = {**ref_state, "objective": objective}
            want, ref_state = reference.update(flat64(direction), ref_state, flat64(params))
            np.testing.assert_allclose(updates["w"], want["w"], rtol=1e-5, err_msg=str(scale))
            assert int(state["info"]["num_linesearch_steps"]) == ref_state["steps"]


def test_zoom_picks_the_parabolas_minimum():
    """On a parabola the quadratic interpolant is exact: the second trial is the minimum."""
    tx = gradtx.chain(gradtx.scale(-1.0), gradtx.scale_by_zoom_linesearch(10))
    params = {"w": jnp.zeros(2)}
    value, grads = jax.value_and_grad(lambda p: jnp.sum((p["w"] - 1.0) ** 2))(params)
    loss_fn = lambda p: jnp.sum((p["w"] - 1.0) ** 2)  # noqa: E731
    updates, state = tx.update(
        grads, tx.init(params), params, value=value, grad=grads, value_fn=loss_fn
    )
    np.testing.assert_allclose(updates["w"], [1.0, 1.0])
    info = gradtx.stats(state)
    assert int(info["scale_by_zoom_linesearch/info/num_linesearch_steps"]) == 2
    assert float(info["scale_by_zoom_linesearch/info/curvature_error"]) == 0.0
    assert not bool(info["scale_by_zoom_linesearch/info/failed"])


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_zoom_falls_back_to_an_earlier_trial_with_its_own_gradient(jit):
    """Out of trials after overshooting, the search takes the lower earlier trial, and keeps
    the gradient there (evaluated once more), not the last trial's."""
    loss_fn = lambda p: jnp.sum((p["w"] - 1.0) ** 2)  # noqa: E731
    params = {"w": jnp.zeros(2)}
    value, grads = jax.value_and_grad(loss_fn)(params)
    # eta = 1 reaches w = 0.05: lower, but the slope is still steep, so it grows the step
    # 39.5-fold to w = 1.975, lower than the start but above w = 0.05, with no trial left.
    tx = gradtx.scale_by_zoom_linesearch(2, increase_factor=39.5)
    direction = {"w": jnp.full(2, 0.05)}

    def update(direction, state, params, value, grads):
        return tx.update(direction, state, params, value=value, grad=grads, value_fn=loss_fn)

    update = jax.jit(update) if jit else update
    updates, state = update(direction, tx.init(params), params, value, grads)
    np.testing.assert_allclose(updates["w"], [0.05, 0.05])
    moved = gradtx.apply_updates(params, updates)
    np.testing.assert_allclose(state["grad"]["w"], jax.grad(loss_fn)(moved)["w"], rtol=1e-6)
    np.testing.assert_allclose(state["value"], loss_fn(moved), rtol=1e-6)
    assert int(state["info"]["num_linesearch_steps"]) == 2
    assert float(state["info"]["curvature_error"]) > 0  # not both conditions: the fallback
    assert bool(state["info"]["failed"])

    def loss(flat):
        return float(np.sum((flat["w"] - 1.0) ** 2))

    def grad(flat):
        return {"w": 2.0 * (flat["w"] - 1.0)}

    reference = rl.zoom(2, increase_factor=39.5)
    ref_state = {**reference.init({}), "objective": rl.Objective(loss, grad, 2.0, flat64(grads))}
    want, ref_state = reference.update(flat64(direction), ref_state, flat64(params))
    np.testing.assert_allclose(updates["w"], want["w"], rtol=1e-6)
    np.testing.assert_allclose(state["grad"]["w"], ref_state["grad"]["w"], rtol=1e-6)


# --- searches where trials are not finite -------------------------------------------------------


def _walled(kind: str):
    """`sum (w - 1)^2` inside `|w| < 2`, `inf` or NaN outside; and its float64 twins."""
    wall = {"inf": np.inf, "nan": np.nan}[kind]

    def loss_fn(p):
        w = p["w"]
        return jnp.sum(jnp.where(jnp.abs(w) < 2.0, (w - 1.0) ** 2, wall))

    def loss(flat):
        w = flat["w"]
        return float(np.sum(np.where(np.abs(w) < 2.0, (w - 1.0) ** 2, wall)))

    def grad(flat):
        w = flat["w"]
        return {"w": np.where(np.abs(w) < 2.0, 2.0 * (w - 1.0), 0.0)}

    return loss_fn, loss, grad


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_lbfgs_takes_no_step_when_no_trial_is_finite(jit):
    """`sum(w**4)` at `w = 1e6`: every trial of the first direction overflows to `inf`. The
    search takes no step (as optax does), says it failed, and the params stay finite."""

    def loss_fn(p):
        return jnp.sum(p["w"] ** 4)

    params = {"w": jnp.array([1e6, -3e5])}
    tx = gradtx.lbfgs(scale_init_precond=False)
    value_and_grad = gradtx.value_and_grad_from_state(loss_fn)

    def step(p, state):
        value, grads = value_and_grad(p, state=state)
        updates, state = tx.update(grads, state, p, value=value, grad=grads, value_fn=loss_fn)
        return gradtx.apply_updates(p, updates), state, updates

    step = jax.jit(step) if jit else step
    p, state = params, tx.init(params)
    for k in range(3):
        p, state, updates = step(p, state)
        np.testing.assert_array_equal(updates["w"], [0.0, 0.0], err_msg=f"step {k}")
        np.testing.assert_array_equal(p["w"], params["w"])
        stats = gradtx.stats(state)
        assert bool(stats["info/failed"])
        assert float(stats["info/decrease_error"]) == np.inf
        assert float(state["learning_rate"]) == 0.0
        # What the search kept is the loss and gradient at the params, all finite.
        assert float(state["value"]) == float(loss_fn(params))
        want = jax.grad(loss_fn)(params)["w"]
        np.testing.assert_array_equal(state["grad"]["w"], want)

    oracle = optax.lbfgs(scale_init_precond=False)
    o_state = oracle.init(params)
    value, grads = jax.value_and_grad(loss_fn)(params)
    with jax.numpy_dtype_promotion("standard"):
        o_updates, _ = oracle.update(
            grads, o_state, params, value=value, grad=grads, value_fn=loss_fn
        )
    np.testing.assert_array_equal(o_updates["w"], updates["w"])


@pytest.mark.parametrize("kind", ["inf", "nan"])
@pytest.mark.parametrize(
    ("make", "reference"),
    [
        (lambda: gradtx.scale_by_zoom_linesearch(3), lambda: rl.zoom(3)),
        (
            lambda: gradtx.scale_by_backtracking_linesearch(3),
            lambda: rl.backtracking(3),
        ),
        (
            lambda: gradtx.scale_by_backtracking_linesearch(3, store_grad=True),
            lambda: rl.backtracking(3, store_grad=True),
        ),
    ],
    ids=["zoom", "backtracking", "backtracking-grad"],
)
def test_a_search_never_takes_a_point_that_is_not_finite(make, reference, kind):
    """Every trial past the wall: no step, `failed`, and the next search starts over (from 1)
    instead of growing a step size of 0. Then an ordinary search, as the reference's."""
    loss_fn, loss, grad = _walled(kind)
    tx, ref = make(), reference()
    params = {"w": jnp.array([0.0, 0.5])}
    value, grads = jax.value_and_grad(loss_fn)(params)
    state, ref_state = tx.init(params), ref.init({})
    objective = rl.Objective(loss, grad, float(value), flat64(grads))
    kwargs = {"value": value, "grad": grads, "value_fn": loss_fn}
    for k, scale in enumerate((-100.0, -0.3, -100.0, -0.03)):
        direction = {"w": scale * grads["w"]}
        updates, state = tx.update(direction, state, params, **kwargs)
        ref_state = {**ref_state, "objective": objective}
        want, ref_state = ref.update(flat64(direction), ref_state, flat64(params))
        np.testing.assert_allclose(updates["w"], want["w"], rtol=1e-6, err_msg=f"call {k}")
        assert int(state["info"]["num_linesearch_steps"]) == ref_state["steps"], k
        assert np.isfinite(float(state["value"])), k
        if scale == -100.0:
            np.testing.assert_array_equal(updates["w"], [0.0, 0.0])
            assert float(state["learning_rate"]) == 0.0
            assert bool(state["info"]["failed"])
            assert float(state["info"]["decrease_error"]) == np.inf
            if "grad" in state:  # the gradient at the params, not past the wall
                np.testing.assert_array_equal(state["grad"]["w"], grads["w"])
        else:
            assert float(state["learning_rate"]) > 0.0
            assert not bool(state["info"]["failed"]), k
            assert float(state["info"]["decrease_error"]) == 0.0


def test_zoom_keeps_the_best_finite_trial_and_says_it_failed():
    """A finite trial that decreased enough, then trials past the wall: the finite one."""
    loss_fn, loss, grad = _walled("nan")
    params = {"w": jnp.array([0.0, 0.5])}
    value, grads = jax.value_and_grad(loss_fn)(params)
    # eta = 1 reaches w = 0.02, 0.51: lower, slope steep; grown 100-fold, past the wall.
    tx = gradtx.scale_by_zoom_linesearch(2, increase_factor=100.0)
    direction = {"w": -0.01 * grads["w"]}
    kwargs = {"value": value, "grad": grads, "value_fn": loss_fn}
    updates, state = tx.update(direction, tx.init(params), params, **kwargs)
    np.testing.assert_allclose(updates["w"], direction["w"], rtol=1e-6)
    assert bool(state["info"]["failed"])
    moved = gradtx.apply_updates(params, updates)
    np.testing.assert_allclose(state["value"], loss_fn(moved), rtol=1e-6)
    np.testing.assert_allclose(state["grad"]["w"], jax.grad(loss_fn)(moved)["w"], rtol=1e-6)
    ref = rl.zoom(2, increase_factor=100.0)
    objective = rl.Objective(loss, grad, float(value), flat64(grads))
    ref_state = {**ref.init({}), "objective": objective}
    want, _ = ref.update(flat64(direction), ref_state, flat64(params))
    np.testing.assert_allclose(updates["w"], want["w"], rtol=1e-6)


def test_extra_arguments_reach_value_fn():
    def loss_fn(p, batch):
        return jnp.sum((p["w"] - batch) ** 2)

    batch = jnp.array([2.0, -1.0])
    tx, params = gradtx.lbfgs(), {"w": jnp.zeros(2)}
    state = tx.init(params)
    for _ in range(3):
        value, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, state = tx.update(
            grads, state, params, value=value, grad=grads, value_fn=loss_fn, batch=batch, other=1
        )
        params = gradtx.apply_updates(params, updates)
    np.testing.assert_allclose(params["w"], batch, rtol=1e-6)


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tx",
    [
        gradtx.scale_by_zoom_linesearch(5),
        gradtx.scale_by_backtracking_linesearch(5),
        gradtx.lbfgs(),
    ],
    ids=["zoom", "backtracking", "lbfgs"],
)
def test_a_line_search_says_what_it_needs(tx):
    params = {"w": jnp.ones(2)}
    grads, state = {"w": jnp.ones(2)}, tx.init(params)
    given = {"value": jnp.float32(1.0), "grad": grads, "value_fn": lambda p: jnp.sum(p["w"])}
    for missing in ("value_fn", "value", "grad"):
        kwargs = {k: v for k, v in given.items() if k != missing}
        with pytest.raises(TypeError, match=f"needs `{missing}`"):
            tx.update(grads, state, params, **kwargs)
    with pytest.raises(ValueError, match="needs the params"):
        tx.update(grads, state, **given)
    with pytest.raises(ValueError, match="`grad` has no leaf at path 'w'"):
        tx.update(grads, state, params, **{**given, "grad": {"v": jnp.ones(2)}})
    with pytest.raises(TypeError, match="scalar loss"):
        tx.update(grads, state, params, **{**given, "value_fn": lambda p: p["w"]})


def test_arguments_are_checked_by_name():
    with pytest.raises(ValueError, match="`memory_size` must be a positive integer"):
        gradtx.scale_by_lbfgs(memory_size=0)
    with pytest.raises(TypeError, match="`scale_init_precond` must be True or False"):
        gradtx.scale_by_lbfgs(scale_init_precond="yes")
    with pytest.raises(ValueError, match="`max_linesearch_steps` must be a positive integer"):
        gradtx.scale_by_zoom_linesearch(0)
    with pytest.raises(ValueError, match="`max_backtracking_steps` must be a positive integer"):
        gradtx.scale_by_backtracking_linesearch(2.5)
    with pytest.raises(ValueError, match="`initial_guess_strategy` must be one of"):
        gradtx.scale_by_zoom_linesearch(5, initial_guess_strategy="zero")
    with pytest.raises(TypeError, match="`linesearch` must be a gradtx line search"):
        gradtx.lbfgs(linesearch=optax.scale_by_zoom_linesearch(5))


def test_packed_params_are_refused_with_a_clear_error():
    packed = gradtx.pack({"w": jnp.ones(3), "b": jnp.ones(2)})
    for tx in (gradtx.scale_by_lbfgs(), gradtx.scale_by_zoom_linesearch(5), gradtx.lbfgs()):
        with pytest.raises(TypeError, match="packed params"):
            tx.init(packed)


def test_the_lbfgs_state_is_made_by_its_init():
    tx, params = gradtx.scale_by_lbfgs(), {"w": jnp.ones(2)}
    with pytest.raises(KeyError, match="scale_by_lbfgs: expected the state made by its init"):
        tx.update(params, {}, params)
    with pytest.raises(KeyError, match="reconcile"):
        tx.update({"v": jnp.ones(2)}, tx.init(params), {"v": jnp.ones(2)})
