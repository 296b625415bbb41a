"""Schedule-Free SGD and AdamW against the paper (NumPy) and against optax; the rest is the
contract (tests/contract/registry/schedule_free.py)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import references.schedule_free as rsf
from trajectories import eval_trajectory
from trees import ZOO, grads_like

import gradtx
from gradtx import schedules

N_STEPS = 20
SHAPES = {"enc/w": (3, 4), "enc/b": (4,), "head/0": (2, 3), "head/1": ()}


def tree(values: dict[str, Any]) -> dict:
    return {
        "enc": {"w": values["enc/w"], "b": values["enc/b"]},
        "head": [values["head/0"], values["head/1"]],
    }


def flat(t: Any) -> dict[str, Any]:
    kps, _ = jax.tree_util.tree_flatten_with_path(t)
    return {jax.tree_util.keystr(kp, simple=True, separator="/"): x for kp, x in kps}


def _random(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return tree({p: jnp.asarray(rng.normal(size=s), jnp.float32) for p, s in SHAPES.items()})


PARAMS = _random(0)
GRADS = [_random(1 + t) for t in range(N_STEPS)]


def run(tx: Any, params: Any = PARAMS, grads: list = GRADS) -> tuple[list, list, Any]:
    """Jitted steps; the params and the eval params after each one, and the last state."""
    return eval_trajectory(tx, params, grads)


def run_reference(reference: Any, params: Any = PARAMS, grads: list = GRADS) -> tuple:
    """The float64 reference's params (y) and averages (x) after each step."""
    y = {p: np.asarray(v, np.float64) for p, v in flat(params).items()}
    state, ys, xs = reference.init(y), [], []
    for g in grads:
        u, state = reference.update({p: np.asarray(v) for p, v in flat(g).items()}, state, y)
        y = {p: y[p] + u[p] for p in y}
        ys.append(y)
        xs.append(rsf.reference_eval_params(state))
    return ys, xs


def run_optax(tx: Any, params: Any = PARAMS, grads: list = GRADS) -> tuple[list, list]:
    """optax's params and `schedule_free_eval_params` after each step."""
    ys, xs = [], []
    with jax.numpy_dtype_promotion("standard"):
        state = tx.init(params)
        for g in grads:
            u, state = tx.update(g, state, params)
            params = optax.apply_updates(params, u)
            ys.append(params)
            xs.append(optax.contrib.schedule_free_eval_params(state, params))
    return ys, xs


def assert_close(got: Any, want: Any, rtol: float) -> None:
    """Leaves (by path: a tree or a reference's flat dict) within `rtol` of the size of the
    leaf's weights, at least 1: float32 weights carry rounding relative to their size."""
    got, want = flat(got), flat(want)
    assert set(got) == set(want)
    for p, v in got.items():
        w = np.asarray(want[p], np.float64)
        scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
        np.testing.assert_allclose(
            np.asarray(v, np.float64), w, rtol=0, atol=rtol * scale, err_msg=p
        )


def assert_trajectories(got: tuple[list, list], want: tuple[list, list], rtol: float) -> None:
    """The params and the eval params agree after every step."""
    for t, (y, x, wy, wx) in enumerate(zip(got[0], got[1], want[0], want[1])):
        try:
            assert_close(y, wy, rtol)
            assert_close(x, wx, rtol)
        except AssertionError as e:
            raise AssertionError(f"step {t}: {e}") from None


SGD = {"warmup_steps": 5, "b1": 0.9, "weight_decay": 0.01, "weight_lr_power": 1.5}
ADAMW = {"warmup_steps": 5, "b1": 0.95, "weight_decay": 0.05, "weight_lr_power": 1.0}


# --- the paper ----------------------------------------------------------------------------------


def test_sgd_matches_the_paper():
    tx = gradtx.schedule_free_sgd(0.5, **SGD)
    reference = rsf.schedule_free_sgd(0.5, **SGD)
    assert_trajectories(run(tx)[:2], run_reference(reference), rtol=2e-6)


def test_adamw_matches_the_papers_algorithm_2():
    tx = gradtx.schedule_free_adamw(0.05, **ADAMW)
    reference = rsf.schedule_free_adamw(0.05, **ADAMW)
    assert_trajectories(run(tx)[:2], run_reference(reference), rtol=2e-6)


def test_the_average_is_recovered_from_y_and_z():
    """`eval_params` is (y - (1 - b1) z) / b1, with the paper's x kept explicitly."""
    tx = gradtx.schedule_free_sgd(0.5, **SGD)
    ys, xs, state = run(tx)
    z = state["z"]
    for path, y in flat(ys[-1]).items():
        want = (np.asarray(y, np.float64) - 0.1 * np.asarray(z[path], np.float64)) / 0.9
        np.testing.assert_allclose(np.asarray(flat(xs[-1])[path]), want, rtol=1e-6, atol=1e-6)


# --- a rate that rises, then falls -------------------------------------------------------------


def _official_form(
    rates: list[float],
    b1: float,
    power: float,
    weight_decay: float,
    b2: float | None = None,
    eps: float = 1e-8,
) -> tuple[list, list]:
    """Schedule-Free SGD (or, with `b2`, AdamW) in float64, written as the authors' reference
    implementation steps: `y` moved towards `z` by `c`, then along the gradient, `x` read as
    `y + (1 - 1/b1) (z - y)`. `rates[t]` is the rate of step `t + 1` (Adam's bias correction
    included); the averaging weight is the largest rate so far to the power `power`."""
    b1, power, wd = (float(np.float32(v)) for v in (b1, power, weight_decay))
    y = {p: np.asarray(v, np.float64) for p, v in flat(PARAMS).items()}
    z = {p: v.copy() for p, v in y.items()}
    v = {p: np.zeros_like(x) for p, x in y.items()}
    lr_max, weight_sum, ys, xs = 0.0, 0.0, [], []
    for lr, grads in zip(rates, GRADS):
        lr_max = max(lr_max, lr)
        weight = lr_max**power
        weight_sum += weight
        c = weight / weight_sum
        for p, g in flat(grads).items():
            g = np.asarray(g, np.float64)
            if b2 is None:
                step = g + wd * y[p]
            else:
                v[p] = b2 * v[p] + (1 - b2) * g * g
                step = g / (np.sqrt(v[p]) + eps) + wd * y[p]
            y[p] = (1 - c) * y[p] + c * z[p] + lr * (b1 * (1 - c) - 1) * step
            z[p] = z[p] - lr * step
        ys.append(dict(y))
        xs.append({p: y[p] + (1 - 1 / b1) * (z[p] - y[p]) for p in y})
    return ys, xs


def _falls(rates: list[float]) -> None:
    """The rates fall well below their running maximum: the weights depend on the max."""
    running = np.maximum.accumulate(rates)
    assert np.sum(np.asarray(rates) < 0.5 * running) >= 5, rates


def test_sgd_with_a_warmup_then_decay_weighs_by_the_largest_rate_so_far():
    schedule = schedules.warmup_cosine_decay(0.05, 0.5, 3, 15, end_value=0.02)
    rates = [float(np.float32(schedule(k))) for k in range(N_STEPS)]
    _falls(rates)
    tx = gradtx.schedule_free_sgd(schedule, b1=0.9, weight_decay=0.01, weight_lr_power=2.0)
    want = _official_form(rates, b1=0.9, power=2.0, weight_decay=0.01)
    assert_trajectories(run(tx)[:2], want, rtol=2e-6)


def test_adamw_with_a_decaying_rate_weighs_by_the_largest_corrected_rate_so_far():
    """The weights follow the largest of the rates times Adam's bias correction."""
    b2 = 0.9
    schedule = schedules.warmup_cosine_decay(0.005, 0.05, 2, 12, end_value=0.002)
    rates = [
        float(np.float32(schedule(k))) * float(np.sqrt(1 - np.float32(b2) ** (k + 1)))
        for k in range(N_STEPS)
    ]
    _falls(rates)
    tx = gradtx.schedule_free_adamw(schedule, b1=0.9, b2=b2, weight_decay=0.05)
    want = _official_form(rates, b1=0.9, power=2.0, weight_decay=0.05, b2=float(np.float32(b2)))
    assert_trajectories(run(tx)[:2], want, rtol=2e-6)


# --- precision --------------------------------------------------------------------------------

PRECISION = {"lr": 0.05, "warmup": 10, "b1": 0.9, "power": 2.0, "steps": 300, "n": 4096}


def _sgd_problem() -> tuple[np.ndarray, Any]:
    """Float32 start and a noisy quadratic's gradient at step `t` (it reads the params)."""
    rng = np.random.default_rng(0)
    n, steps = PRECISION["n"], PRECISION["steps"]
    y0, target = rng.normal(size=n).astype(np.float32), 3 * rng.normal(size=n)
    noise = 0.3 * rng.normal(size=(steps, n))
    return y0, lambda y, t: (y - target.astype(y.dtype)) + noise[t].astype(y.dtype)


def _sgd32(from_old_z: bool) -> np.ndarray:
    """Schedule-free SGD in float32 NumPy, the update written from the old z (`c (z - y) +
    (1 - b1 (1 - c)) u`) or, as optax does, from x recovered by dividing by b1."""
    f, (y0, grad), k = np.float32, _sgd_problem(), PRECISION
    y, z, b1, weight_sum, lr_max = y0.copy(), y0.copy(), f(k["b1"]), f(0), f(0)
    for t in range(k["steps"]):
        lr = f(k["lr"]) * f(min(1.0, (t + 1) / k["warmup"]))
        lr_max = max(lr_max, lr)
        weight = lr_max ** f(k["power"])
        weight_sum = f(weight_sum + weight)
        c = f(weight / weight_sum)
        u = -lr * grad(y, t)
        if from_old_z:
            out = c * (z - y) + (f(1) - b1 * (f(1) - c)) * u
            z = z + u
        else:
            x = (y - (f(1) - b1) * z) / b1
            z = z + u
            out = b1 * ((f(1) - c) * x + c * z) + (f(1) - b1) * z - y
        y = y + out
    return y


def test_the_params_are_as_precise_as_with_the_update_from_the_old_z():
    """The update is written from the new z (one read of z less on a CPU); over 300 steps,
    the float32 params stay as close to a float64 run as with the update from the old z, and
    closer than with x recovered by dividing by b1 (optax's form), which the bound rejects."""
    k, (y0, grad) = PRECISION, _sgd_problem()
    reference = rsf.schedule_free_sgd(k["lr"], k["warmup"], k["b1"], None, k["power"])
    y = {"w": y0.astype(np.float64)}
    state = reference.init(y)
    for t in range(k["steps"]):
        u, state = reference.update({"w": grad(y["w"], t)}, state, y)
        y = {"w": y["w"] + u["w"]}
    exact = y["w"]

    tx = gradtx.schedule_free_sgd(k["lr"], k["warmup"], k["b1"], weight_lr_power=k["power"])
    step = jax.jit(lambda p, s, g: _applied(tx, p, s, g))
    params = {"w": jnp.asarray(y0)}
    state = tx.init(params)
    for t in range(k["steps"]):
        params, state = step(params, state, {"w": grad(np.asarray(params["w"]), t)})

    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)

    def error(got: Any) -> tuple[float, float]:  # in float32 spacings: median, mean
        e = np.abs(np.asarray(got, np.float64) - exact) / ulp
        return float(np.median(e)), float(np.mean(e))

    ours, old_z, optax_form = error(params["w"]), error(_sgd32(True)), error(_sgd32(False))
    assert ours[0] <= 1.2 * old_z[0] and ours[1] <= 1.2 * old_z[1], (ours, old_z)
    assert optax_form[0] > 1.2 * old_z[0], (optax_form, old_z)  # the bound can fail


def _applied(tx: Any, params: Any, state: Any, grads: Any) -> tuple[Any, Any]:
    u, state = tx.update(grads, state, params)
    return gradtx.apply_updates(params, u), state


# --- optax --------------------------------------------------------------------------------------


@pytest.mark.parametrize("lr", [0.1, 0.5])
def test_sgd_matches_optax_with_the_papers_rates(lr):
    tx = gradtx.schedule_free_sgd(lr, **SGD)
    oracle = rsf.optax_schedule_free_sgd(
        lr, SGD["warmup_steps"], SGD["b1"], SGD["weight_decay"], SGD["weight_lr_power"]
    )
    assert_trajectories(run(tx)[:2], run_optax(oracle), rtol=2e-6)


def test_adamw_matches_optax_with_the_papers_rates():
    tx = gradtx.schedule_free_adamw(0.05, **ADAMW)
    oracle = rsf.optax_schedule_free_adamw(
        0.05, ADAMW["warmup_steps"], ADAMW["b1"], 0.999, 1e-8, ADAMW["weight_decay"], 1.0
    )
    assert_trajectories(run(tx)[:2], run_optax(oracle), rtol=2e-6)


def test_sgd_without_warmup_is_optax_schedule_free_sgd():
    kw = {"b1": 0.9, "weight_decay": 0.01, "weight_lr_power": 1.5}
    tx = gradtx.schedule_free_sgd(0.3, **kw)
    oracle = optax.contrib.schedule_free_sgd(0.3, **kw)
    assert_trajectories(run(tx)[:2], run_optax(oracle), rtol=2e-6)


def test_optax_sgd_warmup_wastes_the_first_step():
    """The one difference with optax's `schedule_free_sgd` (warm-up): optax's SGD counts
    from 0 and takes a first step at rate 0; the paper's (and gradtx's) is lr / warmup."""
    g = GRADS[0]
    tx = gradtx.schedule_free_sgd(0.5, warmup_steps=5)
    u, _ = tx.update(g, tx.init(PARAMS), PARAMS)
    moved = flat(gradtx.apply_updates(PARAMS, u))
    for path, v in flat(PARAMS).items():
        want = np.asarray(v) - np.float32(0.1) * np.asarray(flat(g)[path])
        np.testing.assert_allclose(np.asarray(moved[path]), want, rtol=1e-6, atol=1e-7)
    oracle = optax.contrib.schedule_free_sgd(0.5, warmup_steps=5)
    ou, _ = oracle.update(g, oracle.init(PARAMS), PARAMS)
    assert all(float(jnp.max(jnp.abs(v))) < 1e-6 for v in jax.tree.leaves(ou))


def test_optax_adamw_is_gradtx_pieces_without_the_papers_rate():
    """optax's `schedule_free_adamw` puts Adam's bias correction in the second moment and so
    leaves it out of the averaging weights; the same composition in gradtx matches it, and
    gradtx's `schedule_free_adamw` (the paper's Algorithm 2) differs from it."""
    lr, wd = 0.05, 0.05
    optax_form = gradtx.schedule_free(
        gradtx.chain(
            gradtx.scale_by_rms(0.999, 1e-8, eps_in_sqrt=False, bias_correction=True),
            gradtx.add_decayed_weights(wd),
            gradtx.scale_by_learning_rate(lr),
        ),
        lr,
    )
    oracle = optax.contrib.schedule_free_adamw(lr, weight_decay=wd)
    want = run_optax(oracle)
    assert_trajectories(run(optax_form)[:2], want, rtol=2e-6)
    paper = run(gradtx.schedule_free_adamw(lr, weight_decay=wd))[0]
    gap = np.max(np.abs(np.asarray(flat(paper[-1])["enc/w"]) - np.asarray(want[0][-1]["enc"]["w"])))
    assert gap > 1e-3


def test_wrapper_reads_the_rate_at_the_count_of_earlier_updates():
    """`schedule_free(sgd(s), s)`: the averaging weight of a step uses the rate that step
    took (the schedule at the number of earlier updates, as everywhere in gradtx); optax's
    wrapper counts from 1, so its equivalent is `lambda t: s(t - 1)`. A schedule starting at
    0 gives a first step of nothing, and no averaging weight for it."""
    s = schedules.linear(0.0, 0.5, 4)
    tx = gradtx.schedule_free(gradtx.sgd(s), s, b1=0.8)
    os_ = optax.linear_schedule(0.0, 0.5, 4)
    oracle = optax.contrib.schedule_free(optax.sgd(os_), lambda t: os_(t - 1), b1=0.8)
    ys, xs, _ = run(tx)
    assert_trajectories((ys, xs), run_optax(oracle), rtol=2e-6)
    for path, y in flat(ys[0]).items():
        np.testing.assert_array_equal(np.asarray(y), np.asarray(flat(PARAMS)[path]))


# --- donation, partial updates, layouts ---------------------------------------------------------


def _step(tx: Any):
    def step(params, state, g):
        u, state = tx.update(g, state, params)
        return gradtx.apply_updates(params, u), state

    return step


@pytest.mark.parametrize(
    "make",
    [
        lambda: gradtx.schedule_free_sgd(0.5, **SGD),
        lambda: gradtx.schedule_free_adamw(0.05, **ADAMW),
        lambda: gradtx.ema_params(gradtx.schedule_free_sgd(0.5, **SGD), decay=0.9),
    ],
    ids=["sgd", "adamw", "ema_params"],
)
def test_donated_step_matches_the_undonated_one(make):
    tx = make()
    params = jax.tree.map(jnp.copy, PARAMS)
    state = tx.init(params)
    z = state["z"] if "z" in state else state["inner"]["z"]
    pointers = {x.unsafe_buffer_pointer() for x in jax.tree.leaves(params)}
    assert not pointers & {x.unsafe_buffer_pointer() for x in z.values()}

    plain = jax.jit(_step(tx))
    donated = jax.jit(_step(tx), donate_argnums=(0, 1))
    p1, s1 = PARAMS, tx.init(PARAMS)
    p2, s2 = params, state
    for g in GRADS[:4]:
        p1, s1 = plain(p1, s1, g)
        old = jax.tree.leaves((p2, s2))
        p2, s2 = donated(p2, s2, g)
        assert all(x.is_deleted() for x in old if isinstance(x, jax.Array) and x.ndim)
    for a, b in zip(jax.tree.leaves((p1, s1)), jax.tree.leaves((p2, s2))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    x1 = gradtx.eval_params(tx, s1, p1)
    x2 = gradtx.eval_params(tx, s2, p2)
    for a, b in zip(jax.tree.leaves(x1), jax.tree.leaves(x2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_eval_params_before_any_step_are_the_params():
    tx = gradtx.schedule_free_adamw(0.05, **ADAMW)
    x = gradtx.eval_params(tx, tx.init(PARAMS), PARAMS)
    for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(PARAMS)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_path_without_gradient_keeps_its_weights_and_z():
    tx = gradtx.schedule_free_sgd(0.5, **SGD)
    ys, _, state = run(tx, grads=GRADS[:2])
    g = {**GRADS[2], "enc": {"w": None, "b": GRADS[2]["enc"]["b"]}}
    u, new = tx.update(g, state, ys[-1])
    assert u["enc"]["w"] is None
    np.testing.assert_array_equal(np.asarray(new["z"]["enc/w"]), np.asarray(state["z"]["enc/w"]))
    assert not np.array_equal(np.asarray(new["z"]["enc/b"]), np.asarray(state["z"]["enc/b"]))
    x = gradtx.eval_params(tx, new, gradtx.apply_updates(ys[-1], u))
    before = gradtx.eval_params(tx, state, ys[-1])
    np.testing.assert_array_equal(np.asarray(x["enc"]["w"]), np.asarray(before["enc"]["w"]))


def test_bf16_params_with_float32_z():
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), PARAMS)
    grads = [jax.tree.map(lambda x: x.astype(jnp.bfloat16), g) for g in GRADS[:5]]
    tx = gradtx.schedule_free_adamw(0.05, **ADAMW, state_dtype=jnp.float32)
    state = tx.init(params)
    assert {x.dtype for x in state["z"].values()} == {jnp.dtype(jnp.float32)}
    ys, xs, _ = run(tx, params, grads)
    want_y, want_x = run(gradtx.schedule_free_adamw(0.05, **ADAMW), PARAMS, grads)[:2]
    for got, want in ((ys[-1], want_y[-1]), (xs[-1], want_x[-1])):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert a.dtype == jnp.bfloat16
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b), atol=0.05)


@pytest.mark.parametrize("zoo", [pytest.param(z, id=z.id) for z in ZOO])
def test_tree_zoo_under_jit(zoo):
    """Every zoo tree keeps its structure and dtypes, and `z` and the eval params are keyed by
    the zoo's own paths."""
    tx = gradtx.schedule_free_sgd(0.1, warmup_steps=2, weight_decay=0.01)
    params = zoo.make()
    grads = grads_like(params)

    @jax.jit
    def step(params, state, grads):
        u, state = tx.update(grads, state, params)
        params = gradtx.apply_updates(params, u)
        return params, state, gradtx.eval_params(tx, state, params)

    state = jax.jit(tx.init)(params)
    new, state, x = step(params, state, grads)
    new, state, x = step(new, state, grads)
    none = lambda v: v is None  # noqa: E731
    assert jax.tree.structure(x, is_leaf=none) == jax.tree.structure(params, is_leaf=none)
    present = {p for p, v in zip(zoo.paths, jax.tree.leaves(params, is_leaf=none)) if v is not None}
    assert set(state["z"]) == present
    for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(params)):
        assert a.dtype == b.dtype and a.shape == b.shape


def test_explain_shows_the_base_rate_once():
    tx = gradtx.schedule_free_sgd(0.3, weight_decay=0.1)
    row = gradtx.explain(tx, {"w": jnp.ones(2)})["w"]
    assert row.steps == ("add_decayed_weights", "scale_by_learning_rate", "schedule_free_sgd")
    assert row.learning_rate == pytest.approx(0.3)
    assert row.b1 == pytest.approx(0.9)


# --- misuse -------------------------------------------------------------------------------------


def test_update_without_params_names_them():
    tx = gradtx.schedule_free_sgd(0.1)
    with pytest.raises(ValueError, match="schedule_free_sgd needs the params"):
        tx.update(GRADS[0], tx.init(PARAMS))


@pytest.mark.parametrize("b1", [0.0, -0.5, 1.5])
def test_b1_out_of_range_is_named(b1):
    with pytest.raises(ValueError, match=r"`b1` must be in \(0, 1\]"):
        gradtx.schedule_free(gradtx.sgd(0.1), 0.1, b1=b1)
    with pytest.raises(ValueError, match="schedule_free_adamw: `b1`"):
        gradtx.schedule_free_adamw(b1=b1)


def test_a_scheduled_b1_is_refused_with_the_way_to_schedule_it():
    with pytest.raises(TypeError, match="`b1` must be a number.*inject_hyperparams"):
        gradtx.schedule_free(gradtx.sgd(0.1), 0.1, b1=schedules.constant(0.9))
    with pytest.raises(TypeError, match="`weight_lr_power` must be a number"):
        gradtx.schedule_free_sgd(weight_lr_power=lambda step: 2.0)


def test_warmup_steps_misuse_is_named():
    with pytest.raises(ValueError, match="`warmup_steps` must be a non-negative integer"):
        gradtx.schedule_free_sgd(0.1, warmup_steps=-3)
    with pytest.raises(ValueError, match="`warmup_steps`"):
        gradtx.schedule_free_adamw(warmup_steps=2.5)
    with pytest.raises(TypeError, match="`warmup_steps` needs a number as `learning_rate`"):
        gradtx.schedule_free_sgd(schedules.cosine_decay(0.1, 10), warmup_steps=3)


def test_base_that_is_no_transformation_is_named():
    with pytest.raises(TypeError, match=r"`schedule_free\(base\)` must be a transformation"):
        gradtx.schedule_free("sgd", 0.1)


def test_a_state_of_another_transformation_is_named():
    tx = gradtx.schedule_free_sgd(0.1)
    with pytest.raises(KeyError, match="schedule_free_sgd: expected the state made by its init"):
        tx.update(GRADS[0], gradtx.adam(0.1).init(PARAMS), PARAMS)
    with pytest.raises(KeyError, match="schedule_free_sgd: expected the state made by its init"):
        gradtx.eval_params(tx, {}, PARAMS)


def test_params_that_changed_since_init_point_at_reconcile():
    tx = gradtx.schedule_free_sgd(0.1)
    state = tx.init(PARAMS)
    bigger = {**PARAMS, "new": jnp.ones(2)}
    with pytest.raises(KeyError, match="reconcile"):
        gradtx.eval_params(tx, state, bigger)


def test_alternating_two_models_from_one_optimizer_equals_two_optimizers():
    # Every scalar of the averaging (weight sum, largest rate, count) is kept per path, so a
    # path without a gradient (None) keeps them: model A and model B, updated in turn by one
    # optimizer, follow exactly what an optimizer of their own gives each.
    tx = gradtx.schedule_free_adamw(1e-2, warmup_steps=3, weight_decay=1e-3)
    models = {"a": {"w": jnp.ones(3)}, "b": {"w": jnp.full(2, -1.0)}}
    rng = np.random.default_rng(5)
    grads = [
        {
            k: {"w": jnp.asarray(rng.normal(size=v["w"].shape), jnp.float32)}
            for k, v in models.items()
        }
        for _ in range(8)
    ]
    params, state = models, tx.init(models)
    alone = {k: (models[k], tx.init(models[k])) for k in models}
    for t, g in enumerate(grads):
        turn = "ab"[t % 2]
        partial = {k: g[k] if k == turn else {"w": None} for k in models}
        updates, state = tx.update(partial, state, params)
        params = gradtx.apply_updates(params, updates)
        p, s = alone[turn]
        u, s = tx.update(g[turn], s, p)
        alone[turn] = (gradtx.apply_updates(p, u), s)
    for k in models:
        np.testing.assert_array_equal(params[k]["w"], alone[k][0]["w"])
        together = gradtx.eval_params(tx, state, params)[k]["w"]
        np.testing.assert_array_equal(together, gradtx.eval_params(tx, *alone[k][::-1])["w"])


def test_the_averaging_scalars_are_kept_once_while_all_paths_step():
    # Like a step count, the weight sum and the largest rate change only when a path steps:
    # one value per group of paths that step together, not one per leaf (a tree of 150
    # leaves passed 300 more scalars in and out of each step, and launched a scalar kernel
    # per leaf on a GPU).
    tx = gradtx.schedule_free_adamw(1e-2, warmup_steps=3)
    params = {f"w{i}": jnp.full((3,), 0.1 * i) for i in range(12)}
    grads = jax.tree.map(jnp.cos, params)
    state = tx.init(params)
    step = jax.jit(lambda s, p: tx.update(grads, s, p))
    for _ in range(3):
        updates, state = step(state, params)
        params = gradtx.apply_updates(params, updates)
    for name in ("weight_sum", "max_lr", "count"):
        assert len(jax.tree.leaves(state[name])) == 1, name
        assert sorted(state[name]) == sorted(params)
    assert int(state["count"]["w5"]) == 3
    assert float(state["weight_sum"]["w7"]) > 0
    # A partial update keeps them per path from then on, each path its own.
    partial = {**grads, "w0": None}
    _, after = jax.jit(lambda s, p: tx.update(partial, s, p))(state, params)
    assert len(jax.tree.leaves(after["weight_sum"])) == 12
    assert float(after["weight_sum"]["w0"]) == float(state["weight_sum"]["w0"])
    assert float(after["weight_sum"]["w1"]) > float(state["weight_sum"]["w1"])
    assert int(after["count"]["w0"]) == 3 and int(after["count"]["w1"]) == 4


def test_a_checkpoint_whose_scalars_group_apart_steps_inside_a_cond():
    # Loading groups each slot by its own values: here the counts of `a` and `b` differ (b
    # skipped a step) but their weight sums agree (the rate was 0 so far). The scalars are
    # then read per path, in the update and in `apply_if_finite`'s skipped branch alike.
    rate = schedules.piecewise_constant(0.0, {3: 1.0})
    tx = gradtx.apply_if_finite(gradtx.schedule_free_sgd(rate), 3)
    params = {"a": jnp.ones(2), "b": jnp.ones(2)}
    state = tx.init(params)
    _, state = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
    _, state = tx.update({"a": jnp.ones(2), "b": None}, state, params)
    loaded, _ = gradtx.load_state_dict(tx, params, gradtx.state_dict(state))
    assert len(jax.tree.leaves(loaded["inner"]["count"])) == 2
    assert len(jax.tree.leaves(loaded["inner"]["weight_sum"])) == 1
    _, new = jax.jit(lambda s: tx.update(jax.tree.map(jnp.ones_like, params), s, params))(loaded)
    assert {p: int(c) for p, c in new["inner"]["count"].items()} == {"a": 3, "b": 2}
