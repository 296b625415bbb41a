"""L-BFGS: the two-loop recursion over a memory of past steps, with global inner products."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gradtx._core.lift import (
    cast,
    check_state_keys,
    compute_dtype,
    init_slots,
    update_slots,
    zeros_for,
)
from gradtx._core.module import static
from gradtx._core.protocol import Params, Transformation, Updates
from gradtx._core.widening import promoted
from gradtx._layouts.packed import reject_packed
from gradtx._layouts.step_counts import next_count
from gradtx._transforms.linesearch import dot, scalar_dtype

# Per path: the params and gradient of the last update, and the memory of past differences.
_PREVIOUS = ("params", "updates")
_MEMORIES = ("diff_params_memory", "diff_updates_memory")


def _memory_size(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`memory_size` must be a positive integer, got {value!r}")
    return int(value)


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name.rsplit('.', 1)[-1]}` must be True or False, got {value!r}")
    return bool(value)


class ScaleByLbfgs(Transformation):
    """Precondition the updates by the L-BFGS inverse-Hessian estimate (see `scale_by_lbfgs`)."""

    name: ClassVar[str] = "scale_by_lbfgs"
    memory_size: int = static(10, converter=_memory_size)
    scale_init_precond: bool = static(True, converter=_flag)

    def state_keys(self) -> tuple[str, ...]:
        """Per-path previous values and memories; the global weights and step count."""
        return ("count", *_PREVIOUS, *_MEMORIES, "weights_memory")

    def init_state(self, params: Params) -> dict:
        """Zero previous values and memories for every non-`None` leaf, zero weights."""
        reject_packed(params, self.name, "keeps a memory of past steps for each array")
        m = self.memory_size

        def leaf_init(param: Any) -> dict[str, Any]:
            memory = (m, *param.shape)
            return {
                "params": zeros_for(param),
                "updates": zeros_for(param),
                "diff_params_memory": jnp.zeros(memory, param.dtype),
                "diff_updates_memory": jnp.zeros(memory, param.dtype),
            }

        state: dict[str, Any] = init_slots(params, leaf_init, (*_PREVIOUS, *_MEMORIES))
        state["weights_memory"] = jnp.zeros((m,), scalar_dtype(params))
        state["count"] = jnp.zeros((), jnp.int32)
        return state

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """One two-loop recursion over the present paths, with the newest pair stored first."""
        check_state_keys(self.name, state, self.state_keys())
        reject_packed(updates, self.name, "keeps a memory of past steps for each array")
        m = self.memory_size
        count, weights = state["count"], state["weights_memory"]
        dtype = weights.dtype
        first = count == 0

        # Pass 1: per present path, the gradient, the differences with the last step and the
        # memories as they were.
        grads, diff_params, diff_updates = [], [], []
        old_memory: dict[str, list] = {k: [] for k in _MEMORIES}

        def differences(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            wide = compute_dtype(g, param, slots["params"], slots["updates"])
            grad = cast(g, wide)
            grads.append(grad)
            diff_params.append(cast(param, wide) - cast(slots["params"], wide))
            diff_updates.append(grad - cast(slots["updates"], wide))
            for k in _MEMORIES:
                old_memory[k].append(slots[k])
            return g, {"params": param, "updates": g}

        _, kept = update_slots(
            differences,
            updates,
            {k: state[k] for k in (*_PREVIOUS, *_MEMORIES)},
            params,
            owner=self.name,
            needs_params=True,
        )

        # The new pair (s, y) goes in the row of step count - 1 (none at the first step).
        sy = dot(diff_params, diff_updates, dtype)
        yy = dot(diff_updates, diff_updates, dtype)
        newest = (count - 1) % m
        rho = jnp.where(sy == 0, jnp.zeros((), dtype), 1 / sy)
        weights = jnp.where(first, weights, weights.at[newest].set(rho))
        if self.scale_init_precond:
            # gamma = <s, y> / <y, y>; the very first step is at most of unit length.
            later = jnp.where(yy > 0, sy / yy, jnp.ones((), dtype))
            first_scale = jnp.minimum(1, 1 / jnp.sqrt(dot(grads, grads, dtype)))
            gamma = jnp.where(first, first_scale, later)
        else:
            gamma = jnp.ones((), dtype)

        def stored(memory: Any, new: Any) -> Any:
            # One row written in place (the row as it was at the first step).
            old = lax.dynamic_index_in_dim(memory, newest, 0, keepdims=False)
            row = jnp.where(first, old, cast(new, memory.dtype))
            return lax.dynamic_update_index_in_dim(memory, row, newest, 0)

        s_memory = [stored(x, s) for x, s in zip(old_memory["diff_params_memory"], diff_params)]
        y_memory = [stored(x, y) for x, y in zip(old_memory["diff_updates_memory"], diff_updates)]
        directions = _two_loops(grads, s_memory, y_memory, weights, gamma, count % m)

        # Pass 2: the preconditioned updates and the new memories, path by path.
        results = iter(zip(directions, s_memory, y_memory))

        def emit(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            direction, s, y = next(results)
            # In the promoted dtype of the gradient and the state read (bf16 for bf16 both).
            out = cast(direction, promoted(g.dtype, slots["diff_params_memory"].dtype))
            return out, {"diff_params_memory": s, "diff_updates_memory": y}

        memories = {k: kept[k] for k in _MEMORIES}
        new_updates, memories = update_slots(emit, updates, memories, None, owner=self.name)
        return new_updates, {
            "count": next_count(count),
            **{k: kept[k] for k in _PREVIOUS},
            **memories,
            "weights_memory": weights,
        }


def _two_loops(
    grads: list,
    s_memory: list,
    y_memory: list,
    weights: jax.Array,
    gamma: jax.Array,
    oldest: jax.Array,
) -> list:
    """`H g` by the two-loop recursion (Nocedal & Wright, Algorithm 7.4), path by path.

    Rows are visited from the newest pair to the oldest and back; the inner products are
    sums over every present path. A row of weight 0 (unused, or `<s, y> = 0`) changes nothing.
    """
    m = weights.shape[0]
    dtype = weights.dtype
    rows = (jnp.arange(m, dtype=jnp.int32) + oldest) % m  # oldest first

    def row(memory: list, i: jax.Array, like: list) -> list:
        return [
            cast(lax.dynamic_index_in_dim(x, i, 0, keepdims=False), q.dtype)
            for x, q in zip(memory, like)
        ]

    def backward(q: list, i: jax.Array) -> tuple[list, jax.Array]:
        alpha = weights[i] * dot(row(s_memory, i, q), q, dtype)
        ys = row(y_memory, i, q)
        return [qi - cast(alpha, qi.dtype) * yi for qi, yi in zip(q, ys)], alpha

    def forward(r: list, step: tuple) -> tuple[list, None]:
        i, alpha = step
        beta = weights[i] * dot(row(y_memory, i, r), r, dtype)
        ss = row(s_memory, i, r)
        return [ri + cast(alpha - beta, ri.dtype) * si for ri, si in zip(r, ss)], None

    q, alphas = lax.scan(backward, list(grads), rows, reverse=True)
    r = [cast(gamma, qi.dtype) * qi for qi in q]
    r, _ = lax.scan(forward, r, (rows, alphas))
    return r


def scale_by_lbfgs(memory_size: int = 10, scale_init_precond: bool = True) -> ScaleByLbfgs:
    r"""Precondition the updates by the limited-memory BFGS estimate of the inverse Hessian.

    With $s_k = x_k - x_{k-1}$ and $y_k = g_k - g_{k-1}$ the last `memory_size` differences
    of params and gradients, $\rho_k = 1 / \langle s_k, y_k\rangle$ (0 when the product is
    0) and $\gamma_k = \langle s_k, y_k\rangle / \langle y_k, y_k\rangle$ (1 when
    $y_k = 0$), the two-loop recursion (Nocedal & Wright, Algorithm 7.4) computes

    $$u_k = H_k g_k,\qquad H_k = V_k^\top H_{k-1} V_k + \rho_k s_k s_k^\top,\quad
      V_k = I - \rho_k y_k s_k^\top,$$

    starting from $H^0 = \gamma_k I$ ($I$ with `scale_init_precond=False`). At the first step
    there is no pair yet: $u_0 = \min(1, 1/\lVert g_0\rVert)\, g_0$ ($g_0$ without
    `scale_init_precond`). The inner products are sums over every present path, so the
    estimate couples all parameters. The update keeps the gradient's direction (`lbfgs`
    negates it and searches a step size along it).

    Call it as `tx.update(grads, state, params)`: the differences need the params.

    Partial updates: a path whose gradient is `None` gets no update, is left out of the
    inner products, and its previous values and memory do not move, while the step count
    and the weights $\rho$ (shared by all paths) advance. When it is present again, its
    $s$ and $y$ span the steps it missed, and its memory rows hold pairs of other steps than
    the other paths' rows. L-BFGS builds one curvature model of all parameters together: to
    train two models in turns, give each its own `scale_by_lbfgs` (with `gradtx.partition`).

    Args:
        memory_size: the number of past pairs $(s, y)$ kept.
        scale_init_precond: start the recursion from $\gamma_k I$ rather than $I$.

    State:
        Per path: `params/<path>` and `updates/<path>` (the params and gradient of the last
        update, shaped like the parameter) and `diff_params_memory/<path>`,
        `diff_updates_memory/<path>` (the memories of $s$ and $y$, of shape
        `(memory_size, *param.shape)`), all in the parameter's dtype. Global, by name:
        `weights_memory` (the $\rho$ of each memory row, float32, float64 for float64 params)
        and `count` (int32), whose value modulo `memory_size` is the row the next pair goes
        in. Packed params (`gradtx.pack`) are refused.

    Examples:
        >>> grad_fn = jax.grad(lambda p: jnp.sum((p["w"] - 3.0) ** 2))
        >>> tx, params = gradtx.scale_by_lbfgs(), {"w": jnp.zeros(1)}
        >>> state = tx.init(params)
        >>> u, state = tx.update(grad_fn(params), state, params)
        >>> u["w"]  # the first step: g / ||g||
        Array([-1.], dtype=float32)
        >>> params = {"w": params["w"] - u["w"]}
        >>> u, state = tx.update(grad_fn(params), state, params)
        >>> params["w"] - u["w"]  # s = 1, y = 2: on a parabola the secant step is exact
        Array([3.], dtype=float32)

    References:
        Nocedal & Wright, "Numerical Optimization", 2nd ed., Springer 2006, Algorithm 7.4;
        Liu & Nocedal, "On the limited memory BFGS method for large scale optimization",
        Mathematical Programming 45, 1989.
    """
    return ScaleByLbfgs(memory_size, scale_init_precond)
