"""Registry entries of L-BFGS and the line searches (see `registry.entry.Entry`).

The line searches evaluate a loss along the updates, and the contract suite calls `update`
with gradients only, random ones at that. `WithObjective` gives each step a loss that has
those gradients: the model

    m(x) = f(p) + <g, x - p> + |x - p|^2 + q |x - p|^4

around the params `p`, with `f` the contract's quadratic (`registry.quadratic.contract_loss`) and
`g` the gradient given to `update`. It is passed as `value_fn`, with `value=f(p)` and
`grad=g`, the way a training loop calls `tx.update(grads, state, params, value=loss,
grad=grads, value_fn=loss_fn)`. With the contract's real gradients the model is the
quadratic's first-order model plus a curvature of 2 (the quadratic's largest) and a quartic
term, so it lies above the quadratic: the steps it accepts still decrease the quadratic and
the runs converge. Against the random gradients, a line search on the loss itself would end
up deciding on rounding noise. The model reads a complex leaf as its real view, so a complex
leaf sees the same problem as its stacked real pair (tests/layouts/test_complex.py).

For the line searches `q = 1/4` and the model is taken relative to `f(p)` (`quartic_model`,
`value=0`): the differences of values that the search interpolates are then not rounded to
the size of `f(p)`, which made float32 runs under `jit`, `lax.scan` and `vmap` drift apart.
Along the line the model is then no parabola, which an
interpolating search would land on exactly at its second trial, with every condition met at
once. The entries also ask for strict conditions and allow few trials, so over the 20 steps
the searches grow, bracket, zoom with cubic steps, reject trials on the curvature condition
alone and run out of trials (zoom), and reject trials on the decrease condition and run out
of reductions (backtracking): a wrong sign in a condition or a trial left out changes the
steps taken. L-BFGS keeps `q = 0` (see `LBFGS_RTOL`).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
import references.lbfgs as rl

import gradtx
from registry.entry import Entry, _f
from registry.quadratic import contract_loss, reference_loss


def _real(x: Any) -> Any:
    return jnp.stack([x.real, x.imag]) if jnp.iscomplexobj(x) else x


def _real32(x: Any) -> Any:
    return _real(x).astype(jnp.float32)


# q of the line searches' model.
QUARTIC = 0.25


def local_model(params: Any, grads: Any, quartic: float = 0.0) -> tuple[jax.Array, Any]:
    """`(f(p), m)`: the contract's loss at the params and the model `m` around them; with a
    quartic term, `(0, m - f(p))`."""
    if quartic:
        value = jnp.zeros((), jnp.float32)
    else:
        value = contract_loss(jax.tree.map(_real, params))
    by_path = gradtx.paths.leaves(params)
    present = {p: g for p, g in gradtx.paths.leaves(grads).items() if g is not None}

    def model(x: Any) -> jax.Array:
        total, square = value, jnp.zeros((), jnp.float32)
        for path, x_ in gradtx.paths.leaves(x).items():
            if path in present:
                dx = _real32(x_) - _real32(by_path[path])
                total = total + jnp.sum(_real32(present[path]) * dx)
                square = square + jnp.sum(dx * dx)
        return total + square + quartic * square * square

    return value, model


def quartic_model(params: Any, grads: Any) -> tuple[jax.Array, Any]:
    """`local_model` with `q = QUARTIC` (one function, so equal entries stay equal)."""
    return local_model(params, grads, QUARTIC)


def reference_model(
    params: dict[str, np.ndarray], grads: dict[str, np.ndarray], quartic: float = 0.0
) -> Any:
    """The same model in float64, as a `references.lbfgs.Objective`."""
    p0 = {p: np.asarray(x, np.float64) for p, x in params.items()}
    g = {p: np.asarray(x, np.float64) for p, x in grads.items()}
    value = 0.0 if quartic else reference_loss(p0)

    def square(x: dict[str, np.ndarray]) -> float:
        return sum(float(np.sum((x[p] - p0[p]) ** 2)) for p in g)

    def loss(x: dict[str, np.ndarray]) -> float:
        linear = sum(float(np.sum(g[p] * (x[p] - p0[p]))) for p in g)
        return value + linear + square(x) + quartic * square(x) ** 2

    def grad(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # d/dx of |dx|^2 + q |dx|^4 is (2 + 4 q |dx|^2) dx.
        factor = 2.0 + 4.0 * quartic * square(x)
        return {p: g[p] + factor * (x[p] - p0[p]) for p in g}

    return rl.Objective(loss, grad, value, g)


def reference_quartic_model(params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> Any:
    """`reference_model` with `q = QUARTIC`."""
    return reference_model(params, grads, QUARTIC)


class WithObjective(gradtx.Transformation):
    """Runs `inner` with `value`, `grad` and `value_fn` of the model around the params."""

    name: ClassVar[str] = "with_objective"
    inner: Any = None
    model: Any = local_model  # a function: static structure

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        if params is None:
            raise ValueError("a line search in the contract needs the params (for the loss).")
        value, model = self.model(params, updates)
        given = {"value": value, "grad": updates, "value_fn": model}
        return self.inner.update(updates, state, params, **{**extra, **given})


class OptaxWithObjective:
    """The optax oracle, called the same way."""

    def __init__(self, inner: Any, model: Any = local_model) -> None:
        self.inner, self.model = inner, model

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        value, model = self.model(params, updates)
        return self.inner.update(updates, state, params, value=value, grad=updates, value_fn=model)


# Few trials and strict conditions, so that each trial and each condition counts (see the
# module's docstring): 4 of the 20 zoom searches stop at the limit short of both conditions,
# and 2 of the backtracking searches. A stricter curvature condition or more zoom trials
# made the float32 step sizes too sensitive to rounding for the `lax.scan` and `vmap` checks.
ZOOM_STEPS, ZOOM_CURV_RTOL = 3, 0.1


BACKTRACKING_STEPS, BACKTRACKING_SLOPE_RTOL = 3, 0.3


def _zoom(m: Any) -> Any:
    return gradtx.scale_by_zoom_linesearch(
        ZOOM_STEPS, max_learning_rate=m, curv_rtol=ZOOM_CURV_RTOL
    )


def _backtracking(d: Any) -> Any:
    return gradtx.scale_by_backtracking_linesearch(
        BACKTRACKING_STEPS,
        decrease_factor=d,
        slope_rtol=BACKTRACKING_SLOPE_RTOL,
        store_grad=True,
    )


# L-BFGS on the contract's random gradients: about half the pairs (s, y) have <s, y> < 0 or
# near 0, so the inverse-Hessian estimate is indefinite and ill-conditioned, and two float32
# runs that round differently (against float64, optax, or under `lax.scan`) drift apart to
# about 5e-4 in 20 steps. With an indefinite estimate the direction may point uphill: the
# search then fails, and after many trials the step it takes is so small that the next s is
# mostly the params' rounding. The `lbfgs` entry stops its search after 4 trials (the
# smallest step is then about 1/10), which keeps it within the same drift. The tight checks
# against the reference and optax, on real problems, are in tests/transforms/test_lbfgs.py.
LBFGS_RTOL = 2e-3


# The factor on the gradients of the `scale_by_lbfgs-small-gradients` entry.
SMALL = 0.1


def _lbfgs_search() -> Any:
    return gradtx.scale_by_zoom_linesearch(4, initial_guess_strategy="one")


ENTRIES: tuple[Entry, ...] = (
    Entry(
        id="scale_by_lbfgs",
        name="scale_by_lbfgs",
        make=lambda s: gradtx.scale_by_lbfgs(),
        reference=lambda s: rl.scale_by_lbfgs(),
        oracle=lambda s: optax.scale_by_lbfgs(),
        scalar=0.1,
        sweep=(0.02, 0.05, 0.1),
        converges=False,
        needs_params=True,
        uses_scalar=False,
        packed=False,
        reference_rtol=LBFGS_RTOL,
        oracle_rtol=LBFGS_RTOL,
        scan_rtol=LBFGS_RTOL,
    ),
    # The gradients scaled down to a norm under 1, where the first step is the gradient itself
    # (`min(1, 1 / |g|) = 1`); the contract's gradients have norms of about 5.
    Entry(
        id="scale_by_lbfgs-small-gradients",
        name="scale_by_lbfgs",
        make=lambda s: gradtx.chain(gradtx.scale(SMALL), gradtx.scale_by_lbfgs(memory_size=4)),
        reference=lambda s: rl.prescaled(SMALL, rl.scale_by_lbfgs(memory_size=4)),
        oracle=lambda s: optax.chain(optax.scale(_f(SMALL)), optax.scale_by_lbfgs(memory_size=4)),
        scalar=0.1,
        sweep=(0.02, 0.05, 0.1),
        converges=False,
        needs_params=True,
        uses_scalar=False,
        packed=False,
        reference_rtol=LBFGS_RTOL,
        oracle_rtol=LBFGS_RTOL,
        scan_rtol=LBFGS_RTOL,
    ),
    Entry(
        id="lbfgs",
        name="lbfgs",
        make=lambda lr: WithObjective(gradtx.lbfgs(lr, linesearch=_lbfgs_search())),
        reference=lambda lr: rl.with_objective(
            rl.lbfgs_direction(lr), rl.zoom(4, initial_guess_strategy="one"), reference_model
        ),
        oracle=lambda lr: OptaxWithObjective(
            optax.lbfgs(
                _f(lr), linesearch=optax.scale_by_zoom_linesearch(4, initial_guess_strategy="one")
            )
        ),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=True,
        needs_params=True,
        packed=False,
        reference_rtol=LBFGS_RTOL,
        oracle_rtol=LBFGS_RTOL,
        scan_rtol=LBFGS_RTOL,
    ),
    Entry(
        id="scale_by_zoom_linesearch",
        name="scale_by_zoom_linesearch",
        make=lambda m: WithObjective(gradtx.chain(gradtx.scale(-1.0), _zoom(m)), quartic_model),
        reference=lambda m: rl.with_objective(
            rl.negated(),
            rl.zoom(ZOOM_STEPS, max_learning_rate=m, curv_rtol=ZOOM_CURV_RTOL),
            reference_quartic_model,
        ),
        oracle=lambda m: OptaxWithObjective(
            optax.chain(
                optax.scale(-1.0),
                optax.scale_by_zoom_linesearch(
                    ZOOM_STEPS, max_learning_rate=_f(m), curv_rtol=_f(ZOOM_CURV_RTOL)
                ),
            ),
            quartic_model,
        ),
        scalar=1.0,
        sweep=(0.1, 0.3, 1.0),
        converges=True,
        needs_params=True,
        packed=False,
    ),
    Entry(
        id="scale_by_backtracking_linesearch",
        name="scale_by_backtracking_linesearch",
        make=lambda d: WithObjective(
            gradtx.chain(gradtx.scale(-1.0), _backtracking(d)), quartic_model
        ),
        reference=lambda d: rl.with_objective(
            rl.negated(),
            rl.backtracking(
                BACKTRACKING_STEPS,
                decrease_factor=d,
                slope_rtol=BACKTRACKING_SLOPE_RTOL,
                store_grad=True,
            ),
            reference_quartic_model,
        ),
        oracle=lambda d: OptaxWithObjective(
            optax.chain(
                optax.scale(-1.0),
                optax.scale_by_backtracking_linesearch(
                    BACKTRACKING_STEPS,
                    decrease_factor=_f(d),
                    slope_rtol=_f(BACKTRACKING_SLOPE_RTOL),
                    store_grad=True,
                ),
            ),
            quartic_model,
        ),
        scalar=0.8,
        sweep=(0.5, 0.7, 0.8),
        converges=True,
        needs_params=True,
        packed=False,
    ),
)
