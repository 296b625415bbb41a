"""Armijo backtracking along the updates."""

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


class ScaleByBacktrackingLinesearch(Linesearch):
    """Armijo backtracking along the updates (see `scale_by_backtracking_linesearch`)."""

    name: ClassVar[str] = "scale_by_backtracking_linesearch"
    max_backtracking_steps: int = static(15)
    slope_rtol: Any = hyperparam(1e-4)
    decrease_factor: Any = hyperparam(0.8)
    increase_factor: Any = hyperparam(1.5)
    max_learning_rate: Any = hyperparam(1.0)
    atol: Any = hyperparam(0.0)
    rtol: Any = hyperparam(0.0)
    store_grad: bool = static(False)
    verbose: bool = static(False)
    keep_statistics: bool = static(True)

    def __check__(self) -> None:
        check_steps(self.max_backtracking_steps, "max_backtracking_steps")

    def keeps_grad(self) -> bool:
        """Only with `store_grad`."""
        return self.store_grad

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Shrink the step size from the last one (grown) until the value decreases enough."""
        line = self.line(updates, state, params, extra)
        dtype = line.dtype
        f0, slope0 = line.value0, line.slope0
        c1, shrink = cast(self.slope_rtol, dtype), cast(self.decrease_factor, dtype)
        grow, top = cast(self.increase_factor, dtype), cast(self.max_learning_rate, dtype)
        allowance = cast(self.atol, dtype) + cast(self.rtol, dtype) * jnp.abs(f0)

        def evaluate(eta: jax.Array) -> tuple[jax.Array, jax.Array, list | None]:
            """The value, whether it (and the slope, when evaluated) is finite, the gradients."""
            if self.store_grad:
                value, slope, grads = line.value_and_grad(eta)
                return value, jnp.isfinite(value) & jnp.isfinite(slope), grads
            value = line.value(eta)
            return value, jnp.isfinite(value), None

        def excess(eta: jax.Array, value: jax.Array) -> jax.Array:
            return value - (f0 + c1 * eta * slope0) - allowance

        def body(carry: dict) -> dict:
            eta = carry["trial"]
            value, finite, grads = evaluate(eta)
            if grads is not None and carry["grads"] is not None:  # explicit axes: one layout
                grads = jax.tree.map(like, grads, carry["grads"])
            step = carry["step"] + 1
            accepted = (excess(eta, value) <= 0) & finite
            # Out of reductions at a point that is not finite: one more pass evaluates the
            # start (eta = 0), which the condition accepts, so the search takes no step.
            retreat = ~accepted & ~finite & (step > self.max_backtracking_steps) & (eta != 0)
            return {
                "step": step,
                "trial": jnp.where(retreat, jnp.zeros_like(eta), eta * shrink),
                "eta": eta,
                "value": value,
                "grads": grads,
                "accepted": accepted,
                "retreat": retreat,
                "no_step": carry["no_step"] | retreat,
            }

        def keep_going(carry: dict) -> jax.Array:
            more = (carry["step"] <= self.max_backtracking_steps) | carry["retreat"]
            return ~carry["accepted"] & more

        # After a search that took no step, start over from the largest step size.
        last_rate = state["learning_rate"]
        start = jnp.where(last_rate > 0, jnp.minimum(last_rate * grow, top), top)
        carry = {
            "step": jnp.zeros((), jnp.int32),
            "trial": start,
            "eta": start,
            "value": f0,
            "grads": _overwritten_grads(line, state) if self.store_grad else None,
            "accepted": jnp.zeros((), bool),
            "retreat": jnp.zeros((), bool),
            "no_step": jnp.zeros((), bool),
        }
        carry = lax.while_loop(keep_going, body, carry)
        failed = carry["no_step"] | ~carry["accepted"]
        error = missed(jnp.maximum(excess(carry["eta"], carry["value"]), 0), carry["no_step"])
        if self.verbose:
            report(self.name, failed, carry["eta"], error)
        info = {"num_linesearch_steps": carry["step"], "decrease_error": error, "failed": failed}
        return self.finish(line, state, carry["eta"], carry["value"], carry["grads"], info)


def _overwritten_grads(line: Line, state: dict) -> list:
    """The loop's first gradients: the stored ones, which its first trial always replaces.

    The loop writes its gradients in place. Started from the incoming gradients, which the
    step does not own, XLA copied them into the loop; the stored gradients are the state's,
    so a donated step hands their buffers to the loop. A path the state lacks, or holds in
    another shape, starts from its incoming gradient; `finish` then names it.
    """
    stored = state["grad"]
    return [
        cast(stored[p], d.dtype) if p in stored and jnp.shape(stored[p]) == d.shape else g
        for p, d, g in zip(line.paths, line.directions, line.grad0)
    ]


def scale_by_backtracking_linesearch(
    max_backtracking_steps: int,
    slope_rtol: float = 1e-4,
    decrease_factor: float = 0.8,
    increase_factor: float = 1.5,
    max_learning_rate: float = 1.0,
    atol: float = 0.0,
    rtol: float = 0.0,
    store_grad: bool = False,
    verbose: bool = False,
) -> ScaleByBacktrackingLinesearch:
    r"""Scale the updates by a step size that decreases the loss enough (Armijo backtracking).

    With $f$ = `value_fn`, $x$ the params, $u$ the updates and $g$ = `grad` the gradient of
    $f$ at $x$, the step size starts at $\eta_0 = \min(\eta_{prev}\,\gamma_{inc}, \eta_{max})$
    (the last step's grown) and is multiplied by $\gamma_{dec}$ until

    $$f(x + \eta u) \le f(x) + c_1\,\eta\,\langle g, u\rangle + \epsilon_a
      + \epsilon_r\,\lvert f(x)\rvert$$

    (Nocedal & Wright, Algorithm 3.1), or `max_backtracking_steps` reductions were made;
    the last step size tried is then taken anyway (the statistic `failed`), unless its value
    (or, with `store_grad`, its slope) is `inf` or NaN: a non-finite value is never taken, and
    the search then evaluates the start once more and takes no step ($\eta = 0$); the next
    search starts over from $\eta_{max}$. The output is $\eta u$, so $u$ should be a descent
    direction ($\langle g, u\rangle < 0$, e.g. after `scale_by_learning_rate`).

    Call it as `tx.update(updates, state, params, value=loss, grad=grads,
    value_fn=loss_fn)`. Extra keyword arguments of `update` that `value_fn` names after the
    params (a batch, say) are passed on to it. Without `value`, `grad` or `value_fn` it
    raises a `TypeError` that says so. The search is a `lax.while_loop`: it compiles once
    and runs under `jit`, `lax.scan` and `vmap`.

    Partial updates: paths whose update is `None` do not move and are left out of
    $\langle g, u\rangle$; with `store_grad`, their stored gradient does not move either.

    Args:
        max_backtracking_steps: the most reductions of the step size (the loss is evaluated
            at most once more than that).
        slope_rtol: $c_1$, the fraction of the predicted decrease required.
        decrease_factor: $\gamma_{dec}$, the factor of each reduction.
        increase_factor: $\gamma_{inc}$, how much the last step size grows to start.
        max_learning_rate: $\eta_{max}$, the largest step size tried.
        atol: $\epsilon_a$, an absolute tolerance on the decrease.
        rtol: $\epsilon_r$, a tolerance on the decrease relative to $\lvert f(x)\rvert$.
        store_grad: evaluate the gradient with each value and keep the accepted one in the
            state, for `value_and_grad_from_state`.
        verbose: print a line (through `jax.debug.callback`) when no step size met the
            condition.

    State:
        Global, by name: `learning_rate` (the step size taken, 0 for no step; 1 at `init`),
        `value` (the loss there; `inf` at `init`) and `info/num_linesearch_steps` (int32, the
        number of evaluations), `info/decrease_error` (how much the condition missed by, 0
        when met, `inf` when no step was taken), `info/failed` (bool: no step size met the
        condition);
        with `store_grad`, `grad/<path>` (the gradient at the accepted point, shaped like the
        parameter). Floats are float32 (float64 for float64 params). Packed params are
        refused.

    Examples:
        >>> loss_fn = lambda p: jnp.sum((p["w"] - 1.0) ** 2)
        >>> params = {"w": jnp.zeros(2)}
        >>> tx = gradtx.chain(gradtx.scale(-1.0), gradtx.scale_by_backtracking_linesearch(15))
        >>> state = tx.init(params)
        >>> loss, grads = jax.value_and_grad(loss_fn)(params)
        >>> u, state = tx.update(grads, state, params, value=loss, grad=grads, value_fn=loss_fn)
        >>> u["w"]  # eta = 1 jumps to w = 2, no lower than w = 0; eta = 0.8 decreases enough
        Array([1.6, 1.6], dtype=float32)

    References:
        Armijo, "Minimization of functions having Lipschitz continuous first partial
        derivatives", Pacific Journal of Mathematics 16, 1966; Nocedal & Wright, "Numerical
        Optimization", 2nd ed., Springer 2006, Algorithm 3.1.
    """
    return ScaleByBacktrackingLinesearch(
        max_backtracking_steps,
        slope_rtol,
        decrease_factor,
        increase_factor,
        max_learning_rate,
        atol,
        rtol,
        store_grad,
        verbose,
    )
