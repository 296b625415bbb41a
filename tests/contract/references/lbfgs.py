"""References of L-BFGS and the line searches.

Written from Nocedal & Wright, "Numerical Optimization" (2nd ed.): the two-loop recursion
(Algorithm 7.4), backtracking (Algorithm 3.1) and the strong-Wolfe line search with zoom
(Algorithms 3.5 and 3.6), as plain loops, with the choices gradtx's docstrings state (first
step, fallbacks, interpolation safeguards).

The line searches need the loss: `with_objective` gives them, at every step, an `Objective`
(the loss and its gradient as float64 functions of flat params, and their values at the
params), as gradtx's line searches get `value`, `grad` and `value_fn`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from references import Flat, Reference, State, f32

Loss = Callable[[Flat], float]


Grad = Callable[[Flat], Flat]


class Objective(NamedTuple):
    """The loss and gradient functions of one step, and their values at the params."""

    loss: Loss
    grad: Grad
    value: float
    gradient: Flat


def _f64(x: Any) -> np.ndarray:
    return np.asarray(x, np.float64)


def _dot(a: Flat, b: Flat) -> float:
    return float(sum(np.sum(a[p] * b[p]) for p in a))


def two_loop(g: Flat, pairs: list[tuple[Flat, Flat]], gamma: float) -> Flat:
    """`H g` for the pairs `(s, y)`, oldest first, from `H0 = gamma I` (Algorithm 7.4)."""
    q = {p: x.copy() for p, x in g.items()}
    alphas = []
    for s, y in reversed(pairs):
        sy = _dot(s, y)
        rho = 0.0 if sy == 0 else 1.0 / sy
        alpha = rho * _dot(s, q)
        q = {p: q[p] - alpha * y[p] for p in q}
        alphas.append((alpha, rho))
    r = {p: gamma * x for p, x in q.items()}
    for (s, y), (alpha, rho) in zip(pairs, reversed(alphas)):
        beta = rho * _dot(y, r)
        r = {p: r[p] + (alpha - beta) * s[p] for p in r}
    return r


def scale_by_lbfgs(memory_size: int = 10, scale_init_precond: bool = True) -> Reference:
    """u = H g over the last `memory_size` pairs; the first step g * min(1, 1 / ||g||)."""

    def init(params: Flat) -> State:
        return {"pairs": [], "last": None}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        g = {p: _f64(x) for p, x in grads.items()}
        x = {p: _f64(params[p]) for p in g}
        pairs = list(state["pairs"])
        if state["last"] is None:
            norm = math.sqrt(_dot(g, g))
            gamma = min(1.0, 1.0 / norm) if scale_init_precond and norm > 0 else 1.0
        else:
            x_old, g_old = state["last"]
            s = {p: x[p] - x_old[p] for p in g}
            y = {p: g[p] - g_old[p] for p in g}
            pairs = (pairs + [(s, y)])[-memory_size:]
            yy = _dot(y, y)
            gamma = _dot(s, y) / yy if scale_init_precond and yy > 0 else 1.0
        return two_loop(g, pairs, gamma), {"pairs": pairs, "last": (x, g)}

    return Reference(init, update)


class Point(NamedTuple):
    eta: float
    value: float
    slope: float
    grad: Flat | None


class _Line:
    """phi(eta) = loss(x + eta u), its slope <grad, u>, counting the evaluations."""

    def __init__(self, loss: Loss, grad: Grad, x: Flat, u: Flat) -> None:
        self.loss, self.grad, self.x, self.u = loss, grad, x, u
        self.evaluations = 0

    def at(self, eta: float, with_grad: bool = True) -> Point:
        self.evaluations += 1
        trial = {p: self.x[p] + eta * self.u.get(p, 0.0) for p in self.x}
        if not with_grad:
            return Point(eta, self.loss(trial), math.nan, None)
        g = {p: _f64(v) for p, v in self.grad(trial).items()}
        return Point(eta, self.loss(trial), _dot({p: g[p] for p in self.u}, self.u), g)


def backtracking(
    max_backtracking_steps: int,
    slope_rtol: float = 1e-4,
    decrease_factor: float = 0.8,
    increase_factor: float = 1.5,
    max_learning_rate: float = 1.0,
    atol: float = 0.0,
    rtol: float = 0.0,
    store_grad: bool = False,
) -> Reference:
    """Armijo backtracking (Algorithm 3.1) from the last step size times `increase_factor`.

    Out of reductions at a point whose value (or slope) is not finite, it takes no step, and
    the next search starts again from `max_learning_rate`.
    """
    c1, shrink, grow = f32(slope_rtol), f32(decrease_factor), f32(increase_factor)
    top, atol, rtol = f32(max_learning_rate), f32(atol), f32(rtol)

    def init(params: Flat) -> State:
        return {"learning_rate": 1.0, "value": math.inf}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        u = {p: _f64(v) for p, v in grads.items()}
        x = {p: _f64(v) for p, v in params.items()}
        objective = state["objective"]
        f0 = objective.value
        slope0 = _dot({p: objective.gradient[p] for p in u}, u)
        line = _Line(objective.loss, objective.grad, x, u)
        last = state["learning_rate"]
        eta = min(last * grow, top) if last > 0 else top
        while True:
            point = line.at(eta, with_grad=store_grad)
            finite = math.isfinite(point.value) and (not store_grad or math.isfinite(point.slope))
            if finite and point.value <= f0 + c1 * eta * slope0 + atol + rtol * abs(f0):
                break
            if line.evaluations > max_backtracking_steps:
                if not finite:  # never a non-finite point: the start, evaluated once more
                    point = line.at(0.0, with_grad=store_grad)
                break  # else the last step size tried is taken anyway
            eta *= shrink
        out = {p: point.eta * v for p, v in u.items()}
        new = {"learning_rate": point.eta, "value": point.value, "steps": line.evaluations}
        return out, {**state, **new}

    return Reference(init, update)


def _cubic_minimizer(a: Point, b: Point, c: Point) -> float | None:
    """The local minimizer of the cubic with a's value and slope through b and c."""
    db, dc = b.eta - a.eta, c.eta - a.eta
    matrix = np.array([[db**2, db**3], [dc**2, dc**3]])
    rhs = np.array([b.value - a.value - a.slope * db, c.value - a.value - a.slope * dc])
    try:
        quad, cube = np.linalg.solve(matrix, rhs)
    except np.linalg.LinAlgError:
        return None
    # p(t) = cube t^3 + quad t^2 + slope t + value; p'(t) = 0 where p'' = 2 sqrt(radical) > 0.
    radical = quad * quad - 3 * cube * a.slope
    if not radical >= 0:
        return None
    root = math.sqrt(radical)
    if quad >= 0:  # the same root, without cancellation (and the parabola's for cube = 0)
        return a.eta - a.slope / (quad + root) if quad + root != 0 else None
    return a.eta + (root - quad) / (3 * cube)


def _quadratic_minimizer(a: Point, b: Point) -> float | None:
    """The minimizer of the parabola with a's value and slope through b (None if concave)."""
    db = b.eta - a.eta
    curvature = (b.value - a.value - a.slope * db) / (db * db)
    if not curvature > 0:
        return None
    return a.eta - a.slope / (2 * curvature)


def _strictly_inside(x: float | None, lo: float, hi: float, margin: float) -> bool:
    left, right = min(lo, hi), max(lo, hi)
    gap = margin * (right - left)
    return x is not None and math.isfinite(x) and left + gap < x < right - gap


def zoom(
    max_linesearch_steps: int,
    max_learning_rate: float | None = None,
    tol: float = 0.0,
    increase_factor: float = 2.0,
    slope_rtol: float = 1e-4,
    curv_rtol: float = 0.9,
    approx_dec_rtol: float | None = 1e-6,
    stepsize_precision: float = 1e-5,
    initial_guess_strategy: str = "keep",
) -> Reference:
    """Strong Wolfe conditions: bracketing (Algorithm 3.5), then zoom (Algorithm 3.6)."""
    c1, c2, tol, grow = f32(slope_rtol), f32(curv_rtol), f32(tol), f32(increase_factor)
    c3 = None if approx_dec_rtol is None else f32(approx_dec_rtol)
    top = math.inf if max_learning_rate is None else f32(max_learning_rate)
    precision = f32(stepsize_precision)

    def init(params: Flat) -> State:
        return {"learning_rate": 1.0, "value": math.inf}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        u = {p: _f64(v) for p, v in grads.items()}
        x = {p: _f64(v) for p, v in params.items()}
        objective = state["objective"]
        f0 = objective.value
        origin = Point(0.0, f0, _dot({p: objective.gradient[p] for p in u}, u), None)
        line = _Line(objective.loss, objective.grad, x, u)

        def decreases(pt: Point) -> bool:
            if not (math.isfinite(pt.value) and math.isfinite(pt.slope)):
                return False
            if pt.value <= f0 + c1 * pt.eta * origin.slope + tol:
                return True
            if c3 is None:
                return False
            close = pt.value <= f0 + c3 * abs(f0)
            return close and pt.slope <= (2 * c1 - 1) * origin.slope + tol

        def flat_enough(pt: Point) -> bool:
            return abs(pt.slope) <= c2 * abs(origin.slope) + tol

        seen: list[Point] = []

        def evaluate(eta: float) -> Point:
            pt = line.at(eta)
            seen.append(pt)
            return pt

        def search() -> Point | None:
            """The point meeting both conditions, or None when the search stopped first."""
            last = state["learning_rate"]
            eta = 1.0 if initial_guess_strategy == "one" or last == 0 else last
            prev, eta = origin, min(eta, top)
            while line.evaluations < max_linesearch_steps:
                pt = evaluate(eta)
                if not decreases(pt) or (len(seen) > 1 and pt.value >= prev.value):
                    return zoom_into(prev, pt)
                if flat_enough(pt):
                    return pt
                if pt.slope >= 0:
                    return zoom_into(pt, prev)
                if min(eta * grow, top) <= eta:
                    return None  # the largest step size allowed
                prev, eta = pt, min(eta * grow, top)
            return None

        def zoom_into(lo: Point, hi: Point) -> Point | None:
            rec, j = None, 0
            while line.evaluations < max_linesearch_steps:
                if abs(hi.eta - lo.eta) <= precision and any(decreases(p) for p in seen):
                    return None
                trial = _cubic_minimizer(lo, hi, rec) if j > 0 else None
                if not _strictly_inside(trial, lo.eta, hi.eta, 0.2):
                    trial = _quadratic_minimizer(lo, hi)
                    if not _strictly_inside(trial, lo.eta, hi.eta, 0.1):
                        trial = (lo.eta + hi.eta) / 2
                pt = evaluate(trial)
                j += 1
                if not decreases(pt) or pt.value >= lo.value:
                    rec, hi = hi, pt
                    continue
                if flat_enough(pt):
                    return pt
                if pt.slope * (hi.eta - lo.eta) >= 0:
                    rec, hi = hi, lo
                else:
                    rec = lo
                lo = pt
            return None

        chosen = search()
        if chosen is None:  # the lowest value that decreased enough, else the last trial
            good = [p for p in seen if decreases(p)]
            chosen = min(good, key=lambda p: p.value) if good else seen[-1]
            if not (math.isfinite(chosen.value) and math.isfinite(chosen.slope)):
                chosen = Point(0.0, f0, origin.slope, objective.gradient)  # no step
        out = {p: chosen.eta * v for p, v in u.items()}
        new = {"learning_rate": chosen.eta, "value": chosen.value, "grad": chosen.grad}
        return out, {**state, **new, "steps": line.evaluations}

    return Reference(init, update)


def with_objective(
    direction: Reference, search: Reference, objective: Callable[[Flat, Flat], Objective]
) -> Reference:
    """`search` along the updates of `direction`; `objective(params, grads)` gives the loss."""

    def init(params: Flat) -> State:
        return {"direction": direction.init(params), "search": search.init(params)}

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        u, d_state = direction.update(grads, state["direction"], params)
        s_state = {**state["search"], "objective": objective(params, grads)}
        out, s_state = search.update(u, s_state, params)
        return out, {"direction": d_state, "search": s_state}

    return Reference(init, update)


def prescaled(factor: float, inner: Reference) -> Reference:
    """`inner` given the gradients times `factor`."""
    k = f32(factor)

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        return inner.update({p: k * _f64(g) for p, g in grads.items()}, state, params)

    return Reference(inner.init, update)


def negated() -> Reference:
    """`u = -g`."""

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        return {p: -_f64(g) for p, g in grads.items()}, state

    return Reference(lambda params: {}, update)


def lbfgs_direction(
    learning_rate: float | None = None, memory_size: int = 10, scale_init_precond: bool = True
) -> Reference:
    """`u = -learning_rate * H g` (learning rate 1 for `None`)."""
    inner = scale_by_lbfgs(memory_size, scale_init_precond)
    lr = 1.0 if learning_rate is None else f32(learning_rate)

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        u, state = inner.update(grads, state, params)
        return {p: -lr * v for p, v in u.items()}, state

    return Reference(inner.init, update)
