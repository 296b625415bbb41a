"""The strong-Wolfe line search of Nocedal & Wright (Algorithms 3.5 and 3.6, "zoom")."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from gradtx._core.lift import cast
from gradtx._core.module import hyperparam, static
from gradtx._core.protocol import Params, Updates
from gradtx._core.update_sharding import like
from gradtx._transforms.linesearch import Line, Linesearch, check_steps, missed, report

_STRATEGIES = ("one", "keep")
# Safeguards of the interpolated trial points: at least this fraction of the interval away
# from its ends, else the next interpolant (cubic, then quadratic, then the midpoint).
_CUBIC_MARGIN = 0.2
_QUADRATIC_MARGIN = 0.1


def _strategy(value: Any, name: str) -> str:
    if value not in _STRATEGIES:
        raise ValueError(
            f"`initial_guess_strategy` must be one of {list(_STRATEGIES)}, got {value!r}"
        )
    return value


def _cubic_minimizer(a: Any, fa: Any, fpa: Any, b: Any, fb: Any, c: Any, fc: Any) -> jax.Array:
    """The minimizer of the cubic through `(a, fa)` with slope `fpa`, `(b, fb)` and `(c, fc)`.

    NaN or infinite when there is none; the caller's bounds check then rejects it.
    """
    db, dc = b - a, c - a
    denominator = (db * dc) ** 2 * (db - dc)
    rb, rc = fb - fa - fpa * db, fc - fa - fpa * dc
    cubic = (dc**2 * rb - db**2 * rc) / denominator
    square = (-(dc**3) * rb + db**3 * rc) / denominator
    root = jnp.sqrt(square * square - 3 * cubic * fpa)
    # The root of the derivative where the curvature is positive, written without
    # cancellation: a nearly quadratic cubic (cubic ~ 0) gives the parabola's minimizer.
    stable = jnp.where(square >= 0, -fpa / (square + root), (root - square) / (3 * cubic))
    return a + stable


def _quadratic_minimizer(a: Any, fa: Any, fpa: Any, b: Any, fb: Any) -> jax.Array:
    """The minimizer of the parabola through `(a, fa)` with slope `fpa` and `(b, fb)`.

    NaN when the parabola opens downwards (no minimizer).
    """
    db = b - a
    curvature = (fb - fa - fpa * db) / (db * db)
    return jnp.where(curvature > 0, a - fpa / (2 * curvature), jnp.nan)


def _inside(x: jax.Array, lo: jax.Array, hi: jax.Array, margin: float) -> jax.Array:
    left, right = jnp.minimum(lo, hi), jnp.maximum(lo, hi)
    gap = margin * (right - left)
    return jnp.isfinite(x) & (x > left + gap) & (x < right - gap)


def _next_in_interval(c: dict) -> jax.Array:
    """The next trial inside `[lo, hi]`: cubic, quadratic or bisection (scipy's safeguards)."""
    (a, fa, fpa), (b, fb, _), (r, fr) = c["lo"], c["hi"], c["rec"]
    cubic = _cubic_minimizer(a, fa, fpa, b, fb, r, fr)
    use_cubic = (c["zoom_steps"] > 0) & _inside(cubic, a, b, _CUBIC_MARGIN)
    quadratic = _quadratic_minimizer(a, fa, fpa, b, fb)
    use_quadratic = _inside(quadratic, a, b, _QUADRATIC_MARGIN)
    middle = (a + b) / 2
    return jnp.where(use_cubic, cubic, jnp.where(use_quadratic, quadratic, middle))


def _pick(flag: jax.Array, yes: Any, no: Any) -> Any:
    return jax.tree.map(lambda x, y: jnp.where(flag, x, like(y, x)), yes, no)


class ScaleByZoomLinesearch(Linesearch):
    """The strong-Wolfe zoom line search along the updates (see `scale_by_zoom_linesearch`)."""

    name: ClassVar[str] = "scale_by_zoom_linesearch"
    info_keys: ClassVar[tuple[str, ...]] = (
        "num_linesearch_steps",
        "decrease_error",
        "curvature_error",
        "failed",
    )
    max_linesearch_steps: int = static(15)
    max_learning_rate: Any = hyperparam(None)
    tol: Any = hyperparam(0.0)
    increase_factor: Any = hyperparam(2.0)
    slope_rtol: Any = hyperparam(1e-4)
    curv_rtol: Any = hyperparam(0.9)
    approx_dec_rtol: Any = hyperparam(1e-6)
    stepsize_precision: Any = hyperparam(1e-5)
    initial_guess_strategy: str = static("keep", converter=_strategy)
    verbose: bool = static(False)
    keep_statistics: bool = static(True)

    def __check__(self) -> None:
        check_steps(self.max_linesearch_steps, "max_linesearch_steps")

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Bracket a step size meeting the strong Wolfe conditions, then zoom into it."""
        line = self.line(updates, state, params, extra)
        dtype = line.dtype
        c = _Conditions(self, line)
        last_rate = state["learning_rate"]
        # After a search that took no step, "keep" starts over from 1: growing 0 finds nothing.
        kept = jnp.where(last_rate > 0, last_rate, jnp.ones((), dtype))
        start = jnp.ones((), dtype) if self.initial_guess_strategy == "one" else kept
        if self.max_learning_rate is not None:
            start = jnp.minimum(start, cast(self.max_learning_rate, dtype))
        origin = (jnp.zeros((), dtype), line.value0, line.slope0)
        carry = {
            "step": jnp.zeros((), jnp.int32),
            "zoom_steps": jnp.zeros((), jnp.int32),
            "zooming": jnp.zeros((), bool),
            "done": jnp.zeros((), bool),
            "met": jnp.zeros((), bool),
            "trial": start,
            "prev": origin,
            "lo": origin,
            "hi": origin,
            "rec": origin[:2],
            "last": (*origin, list(line.grad0)),
            # The safest point so far, without its gradient: selecting a whole gradient on
            # every trial cost a pass over it per trial, for a point taken only when the
            # search fails. Then one more pass of the loop ("refetching") evaluates it again,
            # in place (a `lax.cond` after the loop would copy the gradient on every step).
            "safe": origin,
            "refetching": jnp.zeros((), bool),
            "found": jnp.zeros((), bool),
            "no_step": jnp.zeros((), bool),
        }

        def keep_going(carry: dict) -> jax.Array:
            searching = ~carry["done"] & (carry["step"] < self.max_linesearch_steps)
            return searching | carry["refetching"]

        def iterate(carry: dict) -> dict:  # explicit axes: the carry keeps its layouts
            return jax.tree.map(like, self._iterate(line, c, carry), carry)

        carry = lax.while_loop(keep_going, iterate, carry)
        # Both conditions met: the last point. Else the lowest value that decreased enough,
        # if any; else the last point tried, which is the start again (eta = 0) when its value
        # or slope was not finite.
        use_last = carry["met"] | ~carry["found"]
        eta, value, slope = _pick(use_last, carry["last"][:3], carry["safe"])
        grads = carry["last"][3]  # the safe point's, when it was evaluated again
        decrease_error = jnp.where(c.decrease(eta, value, slope), 0, c.excess(eta, value))
        decrease_error = missed(decrease_error, carry["no_step"])
        curvature_error = missed(jnp.maximum(c.curvature_excess(slope), 0), carry["no_step"])
        if self.verbose:
            report(self.name, ~carry["met"], eta, jnp.maximum(decrease_error, curvature_error))
        info = {
            "num_linesearch_steps": carry["step"],
            "decrease_error": decrease_error,
            "curvature_error": curvature_error,
            "failed": ~carry["met"],
        }
        return self.finish(line, state, eta, value, grads, info)

    def _iterate(self, line: Line, c: _Conditions, carry: dict) -> dict:
        """Evaluate the trial step size, then search on, or keep the gradient refetched."""
        value, slope, grads = line.value_and_grad(carry["trial"])
        point = (carry["trial"], value, slope)
        searched = self._search(c, carry, point, grads)
        refetched = {**carry, "last": (*point, grads), "done": True, "refetching": False}
        return _pick(carry["refetching"], refetched, searched)

    def _search(self, c: _Conditions, carry: dict, point: tuple, grads: list) -> dict:
        """Move the bracket or the zoom interval by the trial `point`; the next trial."""
        eta, value, slope = point
        dtype = eta.dtype
        # A non-finite value or slope is never a decrease, so never taken (nor kept as safe).
        finite = jnp.isfinite(value) & jnp.isfinite(slope)
        decrease = c.decrease(eta, value, slope) & finite
        met = decrease & c.curvature(slope)
        safer = decrease & (~carry["found"] | (value < carry["safe"][1]))
        out = dict(carry)
        out["step"] = carry["step"] + 1
        out["met"] = met
        out["last"] = (*point, grads)
        out["safe"] = _pick(safer, point, carry["safe"])
        out["found"] = carry["found"] | decrease

        # Bracketing (Algorithm 3.5): [prev, eta] or [eta, prev] holds a step size meeting
        # both conditions once the value stops decreasing enough or the slope turns up.
        prev = carry["prev"]
        above = ~decrease | ((carry["step"] > 0) & (value >= prev[1]))
        upward = ~above & ~met & (slope >= 0)
        grow = ~above & ~met & ~upward
        larger = eta * cast(self.increase_factor, dtype)
        if self.max_learning_rate is not None:
            larger = jnp.minimum(larger, cast(self.max_learning_rate, dtype))
        stuck = grow & (larger <= eta)  # at the largest step size allowed
        bracket = {
            "lo": _pick(above, prev, point),
            "hi": _pick(above, point, prev),
            "rec": prev[:2],
            "zooming": ~grow,
            "zoom_steps": jnp.zeros((), jnp.int32),
            "prev": point,
            "done": met | stuck,
        }

        # Zooming (Algorithm 3.6): shrink [lo, hi], keeping lo the best point so far.
        lo, hi = carry["lo"], carry["hi"]
        higher = ~decrease | (value >= lo[1])
        flip = ~higher & ~met & (slope * (hi[0] - lo[0]) >= 0)
        new_hi = _pick(higher, point, _pick(flip, lo, hi))
        new_lo = _pick(higher, lo, point)
        zoom = {
            "lo": new_lo,
            "hi": new_hi,
            "rec": _pick(higher | flip, hi[:2], lo[:2]),
            "zooming": jnp.ones((), bool),
            "zoom_steps": carry["zoom_steps"] + 1,
            "prev": carry["prev"],
            "done": met,
        }
        for key, value_ in _pick(carry["zooming"], zoom, bracket).items():
            out[key] = value_
        narrow = jnp.abs(out["hi"][0] - out["lo"][0]) <= cast(self.stepsize_precision, dtype)
        out["done"] = out["done"] | (out["zooming"] & narrow & out["found"])
        out["trial"] = jnp.where(out["zooming"], _next_in_interval(out), larger)
        # Stopping short of both conditions at a later trial than the safe point: one more
        # pass evaluates the safe point's gradient. With no safe point and a last trial that
        # is not finite, the safe point is the start: the search takes no step.
        stopping = out["done"] | (out["step"] >= self.max_linesearch_steps)
        no_step = stopping & ~met & ~out["found"] & ~finite
        refetch = stopping & ~met & ((out["found"] & ~safer) | no_step)
        out["no_step"] = no_step
        out["refetching"] = refetch
        out["trial"] = jnp.where(refetch, out["safe"][0], out["trial"])
        return out


class _Conditions:
    """The sufficient-decrease and curvature conditions along one line."""

    def __init__(self, tx: ScaleByZoomLinesearch, line: Line) -> None:
        dtype = line.dtype
        self.f0, self.slope0 = line.value0, line.slope0
        self.c1, self.c2 = cast(tx.slope_rtol, dtype), cast(tx.curv_rtol, dtype)
        self.tol = cast(tx.tol, dtype)
        self.c3 = None if tx.approx_dec_rtol is None else cast(tx.approx_dec_rtol, dtype)

    def excess(self, eta: jax.Array, value: jax.Array) -> jax.Array:
        """How much `value` exceeds the Armijo bound at `eta` (<= 0 when met)."""
        return value - (self.f0 + self.c1 * eta * self.slope0) - self.tol

    def decrease(self, eta: jax.Array, value: jax.Array, slope: jax.Array) -> jax.Array:
        """Sufficient decrease, or its approximate form (Hager & Zhang) near the minimum."""
        armijo = self.excess(eta, value) <= 0
        if self.c3 is None:
            return armijo
        close = value <= self.f0 + self.c3 * jnp.abs(self.f0)
        approx = close & (slope <= (2 * self.c1 - 1) * self.slope0 + self.tol)
        return armijo | approx

    def curvature_excess(self, slope: jax.Array) -> jax.Array:
        """How much `|slope|` exceeds the strong Wolfe bound (<= 0 when met)."""
        return jnp.abs(slope) - self.c2 * jnp.abs(self.slope0) - self.tol

    def curvature(self, slope: jax.Array) -> jax.Array:
        """The strong Wolfe curvature condition."""
        return self.curvature_excess(slope) <= 0


def scale_by_zoom_linesearch(
    max_linesearch_steps: int,
    max_learning_rate: float | None = None,
    tol: float = 0.0,
    increase_factor: float = 2.0,
    slope_rtol: float = 1e-4,
    curv_rtol: float = 0.9,
    approx_dec_rtol: float | None = 1e-6,
    stepsize_precision: float = 1e-5,
    initial_guess_strategy: str = "keep",
    verbose: bool = False,
) -> ScaleByZoomLinesearch:
    r"""Scale the updates by a step size meeting the strong Wolfe conditions (zoom search).

    With $f$ = `value_fn`, $x$ the params, $u$ the updates, $g$ = `grad` the gradient of $f$
    at $x$ and $\phi(\eta) = f(x + \eta u)$, it looks for a step size $\eta$ with sufficient
    decrease and small curvature:

    $$\phi(\eta) \le \phi(0) + c_1\,\eta\,\phi'(0) + \epsilon,\qquad
      \lvert\phi'(\eta)\rvert \le c_2\,\lvert\phi'(0)\rvert + \epsilon.$$

    It first brackets such a step size, starting from 1 (`initial_guess_strategy="one"`) or
    from the last step size (`"keep"`) and multiplying it by `increase_factor` (Nocedal &
    Wright, Algorithm 3.5), then zooms into the bracket (Algorithm 3.6): each new trial is
    the minimizer of a cubic or quadratic interpolant of the values and slopes seen, kept at
    least 20% (cubic) or 10% (quadratic) of the interval away from its ends, else the
    midpoint. Each trial evaluates `value_fn` and its gradient once.

    Near a minimum, where $\phi$ is flat to rounding, sufficient decrease is also accepted in
    the approximate form of Hager & Zhang: $\phi(\eta) \le \phi(0) + c_3\lvert\phi(0)\rvert$
    and $\phi'(\eta) \le (2c_1 - 1)\,\phi'(0) + \epsilon$ (not with `approx_dec_rtol=None`).
    The search stops when both conditions hold, when the zoom interval is narrower than
    `stepsize_precision` and some trial decreased enough, at the largest step size
    allowed, or after `max_linesearch_steps` trials. Unless both conditions were met (the
    statistic `failed`), it takes the trial with the lowest value among those that decreased
    enough, or else the last trial if its value and slope are finite, or else no step at all
    ($\eta = 0$, as optax): a trial whose value or slope is `inf` or NaN is never taken.
    Taking an earlier point than the last trial, it evaluates `value_fn` and its gradient
    there once more (not counted as a trial), which keeps the search's memory to one
    gradient. The output is $\eta u$; $u$ should be a descent direction.

    Call it as `tx.update(updates, state, params, value=loss, grad=grads,
    value_fn=loss_fn)`; extra keyword arguments that `value_fn` names after the params are
    passed on to it. It is a `lax.while_loop`: it runs under `jit`, `lax.scan` and `vmap`.
    Paths whose update is `None` do not move, are left out of the slopes, and keep their
    stored gradient.

    Args:
        max_linesearch_steps: the most trials (evaluations of `value_fn`).
        max_learning_rate: the largest step size tried, or `None` for no bound.
        tol: $\epsilon$, an absolute tolerance on both conditions.
        increase_factor: the growth of the step size while bracketing.
        slope_rtol: $c_1$, the fraction of the predicted decrease required.
        curv_rtol: $c_2$, the fraction of the initial slope allowed at the step.
        approx_dec_rtol: $c_3$ of the approximate decrease condition, or `None` to use only
            the first condition.
        stepsize_precision: the width of the zoom interval under which the search takes the
            best step size that decreased enough.
        initial_guess_strategy: `"one"` (start from 1, for quasi-Newton directions such as
            L-BFGS's) or `"keep"` (start from the last step size, for gradient directions;
            from 1 again after a search that took no step).
        verbose: print a line (through `jax.debug.callback`) when the conditions were not
            both met.

    State:
        Global, by name: `learning_rate` (the step size taken, 0 for no step; 1 at `init`),
        `value` (the loss there, `inf` at `init`), and `info/num_linesearch_steps` (int32),
        `info/decrease_error`, `info/curvature_error` (how much each condition missed by at
        the step taken: 0 when met, `inf` when no step was taken because the last trial was
        not finite), `info/failed` (bool: the conditions were not both met, and the step is
        one of the fallbacks above); per path, `grad/<path>`: the gradient at the accepted
        point, shaped like the parameter (for `value_and_grad_from_state`). Floats are float32
        (float64 for float64 params). Packed params are refused.

    Examples:
        >>> loss_fn = lambda p: jnp.sum((p["w"] - 1.0) ** 2)
        >>> params = {"w": jnp.zeros(2)}
        >>> tx = gradtx.chain(gradtx.scale(-1.0), gradtx.scale_by_zoom_linesearch(10))
        >>> state = tx.init(params)
        >>> loss, grads = jax.value_and_grad(loss_fn)(params)
        >>> u, state = tx.update(grads, state, params, value=loss, grad=grads, value_fn=loss_fn)
        >>> u["w"]  # eta = 1 overshoots; the quadratic interpolant gives the minimum, 0.5
        Array([1., 1.], dtype=float32)
        >>> gradtx.stats(state)["scale_by_zoom_linesearch/info/num_linesearch_steps"]
        Array(2, dtype=int32)

    References:
        Nocedal & Wright, "Numerical Optimization", 2nd ed., Springer 2006, Algorithms 3.5
        and 3.6; Hager & Zhang, "A new conjugate gradient method with guaranteed descent
        and an efficient line search", SIAM Journal on Optimization 16, 2005.
    """
    return ScaleByZoomLinesearch(
        max_linesearch_steps,
        max_learning_rate,
        tol,
        increase_factor,
        slope_rtol,
        curv_rtol,
        approx_dec_rtol,
        stepsize_precision,
        initial_guess_strategy,
        verbose,
    )
