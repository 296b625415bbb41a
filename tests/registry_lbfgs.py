"""Registry entries of L-BFGS and the line searches (see `registry.Entry`).

The line searches evaluate a loss along the updates, and the contract suite calls `update`
with gradients only, random ones at that. `WithObjective` gives each step a loss that has
those gradients: the model

    m(x) = f(p) + <g, x - p> + |x - p|^2

around the params `p`, with `f` the contract's quadratic (`registry_misc.contract_loss`) and
`g` the gradient given to `update`. It is passed as `value_fn`, with `value=f(p)` and
`grad=g`, the way a training loop calls `tx.update(grads, state, params, value=loss,
grad=grads, value_fn=loss_fn)`. With the contract's real gradients the model is the
quadratic's first-order model plus a curvature of 2 (the quadratic's largest), so the steps it
accepts still decrease the quadratic and the runs converge. Against the random gradients, a
line search on the loss itself would end up deciding on rounding noise. The
model reads a complex leaf as its real view, so a complex leaf sees the same problem as its
stacked real pair (tests/layouts/test_complex.py).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
import references_lbfgs as rl
from registry import Entry, _f
from registry_misc import contract_loss, reference_loss

import gradtx


def _real(x: Any) -> Any:
    return jnp.stack([x.real, x.imag]) if jnp.iscomplexobj(x) else x


def _real32(x: Any) -> Any:
    return _real(x).astype(jnp.float32)


def local_model(params: Any, grads: Any) -> tuple[jax.Array, Any]:
    """`(f(p), m)`: the contract's loss at the params and the model `m` around them."""
    value = contract_loss(jax.tree.map(_real, params))
    by_path = gradtx.paths.leaves(params)
    present = {p: g for p, g in gradtx.paths.leaves(grads).items() if g is not None}

    def model(x: Any) -> jax.Array:
        total = value
        for path, x_ in gradtx.paths.leaves(x).items():
            if path in present:
                dx = _real32(x_) - _real32(by_path[path])
                total = total + jnp.sum(_real32(present[path]) * dx) + jnp.sum(dx * dx)
        return total

    return value, model


def reference_model(params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> Any:
    """The same model in float64, as a `references_lbfgs.Objective`."""
    p0 = {p: np.asarray(x, np.float64) for p, x in params.items()}
    g = {p: np.asarray(x, np.float64) for p, x in grads.items()}
    value = reference_loss(p0)

    def loss(x: dict[str, np.ndarray]) -> float:
        return value + sum(
            float(np.sum(g[p] * (x[p] - p0[p])) + np.sum((x[p] - p0[p]) ** 2)) for p in g
        )

    def grad(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {p: g[p] + 2 * (x[p] - p0[p]) for p in g}

    return rl.Objective(loss, grad, value, g)


class WithObjective(gradtx.Transformation):
    """Runs `inner` with `value`, `grad` and `value_fn` of the model around the params."""

    name: ClassVar[str] = "with_objective"
    inner: Any = None

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        if params is None:
            raise ValueError("a line search in the contract needs the params (for the loss).")
        value, model = local_model(params, updates)
        given = {"value": value, "grad": updates, "value_fn": model}
        return self.inner.update(updates, state, params, **{**extra, **given})


class OptaxWithObjective:
    """The optax oracle, called the same way."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        value, model = local_model(params, updates)
        return self.inner.update(updates, state, params, value=value, grad=updates, value_fn=model)


def _zoom(m: Any) -> Any:
    return gradtx.scale_by_zoom_linesearch(15, max_learning_rate=m)


def _backtracking(d: Any) -> Any:
    return gradtx.scale_by_backtracking_linesearch(15, decrease_factor=d, store_grad=True)


# L-BFGS on the contract's random gradients: about half the pairs (s, y) have <s, y> < 0 or
# near 0, so the inverse-Hessian estimate is indefinite and ill-conditioned, and two float32
# runs that round differently (against float64, optax, or under `lax.scan`) drift apart to
# about 5e-4 in 20 steps. With an indefinite estimate the direction may point uphill: the
# search then fails, and after many trials the step it takes is so small that the next s is
# mostly the params' rounding. The `lbfgs` entry stops its search after 4 trials (the
# smallest step is then about 1/10), which keeps it within the same drift. The tight checks
# against the reference and optax, on real problems, are in tests/transforms/test_lbfgs.py.
LBFGS_RTOL = 2e-3


def _lbfgs_search() -> Any:
    return gradtx.scale_by_zoom_linesearch(4, initial_guess_strategy="one")


LBFGS: tuple[Entry, ...] = (
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
        make=lambda m: WithObjective(gradtx.chain(gradtx.scale(-1.0), _zoom(m))),
        reference=lambda m: rl.with_objective(
            rl.negated(), rl.zoom(15, max_learning_rate=m), reference_model
        ),
        oracle=lambda m: OptaxWithObjective(
            optax.chain(
                optax.scale(-1.0), optax.scale_by_zoom_linesearch(15, max_learning_rate=_f(m))
            )
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
        make=lambda d: WithObjective(gradtx.chain(gradtx.scale(-1.0), _backtracking(d))),
        reference=lambda d: rl.with_objective(
            rl.negated(),
            rl.backtracking(15, decrease_factor=d, store_grad=True),
            reference_model,
        ),
        oracle=lambda d: OptaxWithObjective(
            optax.chain(
                optax.scale(-1.0),
                optax.scale_by_backtracking_linesearch(15, decrease_factor=_f(d), store_grad=True),
            )
        ),
        scalar=0.8,
        sweep=(0.5, 0.7, 0.8),
        converges=True,
        needs_params=True,
        packed=False,
    ),
)
