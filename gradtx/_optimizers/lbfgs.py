"""The L-BFGS optimizer: the two-loop direction, a learning rate and a line search along it."""

from __future__ import annotations

from gradtx._combinators.chain import Chain, optimizer
from gradtx._core.protocol import Transformation
from gradtx._transforms.lbfgs import scale_by_lbfgs
from gradtx._transforms.scale import ScalarOrSchedule, scale_by_learning_rate
from gradtx._transforms.zoom_linesearch import scale_by_zoom_linesearch

_DEFAULT_LINESEARCH = scale_by_zoom_linesearch(
    max_linesearch_steps=20, initial_guess_strategy="one"
)


def lbfgs(
    learning_rate: ScalarOrSchedule | None = None,
    memory_size: int = 10,
    scale_init_precond: bool = True,
    linesearch: Transformation | None = _DEFAULT_LINESEARCH,
) -> Chain:
    r"""L-BFGS with a line search: call `update(grads, state, params, value=, grad=, value_fn=)`.

    `chain(scale_by_lbfgs(memory_size, scale_init_precond),
    scale_by_learning_rate(learning_rate), linesearch)`, with a learning rate of 1 for `None`
    (optax's `scale(-1)`):

    $$x_{k+1} = x_k - \eta_k\,\gamma\, H_k g_k$$

    with $H_k$ the limited-memory BFGS inverse-Hessian estimate (see `scale_by_lbfgs`),
    $\gamma$ the learning rate (1 by default) and $\eta_k$ the step size the line search
    picks along $-\gamma H_k g_k$. The default line search is
    `scale_by_zoom_linesearch(max_linesearch_steps=20, initial_guess_strategy="one")`
    (strong Wolfe conditions, the first trial at $\eta = 1$); any line search of gradtx fits,
    or `None` for fixed steps $-\gamma H_k g_k$.

    With a line search, call `update` with the loss and its gradient at `params` and the
    loss function: `tx.update(grads, state, params, value=loss, grad=grads,
    value_fn=loss_fn)`. The search evaluates the loss and gradient at the point it accepts;
    `gradtx.value_and_grad_from_state(loss_fn)(params, state=state)` reads them back for the
    next step instead of computing them again. A search never takes a point where the loss
    or its slope is `inf` or NaN: when every trial overflows, the step is 0 (as in optax), and
    `gradtx.stats(state)` shows `info/failed`. Everything runs under `jit` and `lax.scan`.
    Paths whose gradient is `None` do not move and are left out of every inner product (see
    `scale_by_lbfgs`).

    Args:
        learning_rate: a factor on the direction (a number or a schedule), or `None` for 1.
        memory_size: the number of past pairs kept (see `scale_by_lbfgs`).
        scale_init_precond: start the recursion from the scaled identity.
        linesearch: a gradtx line search (`scale_by_zoom_linesearch`,
            `scale_by_backtracking_linesearch`) or `None`.

    State:
        One namespace (`state_dict` keys such as `diff_params_memory/<path>`): the state of
        `scale_by_lbfgs` (`count`, `params`, `updates`, `diff_params_memory`,
        `diff_updates_memory`, `weights_memory`), with a schedule `schedule_count` and
        `scheduled/learning_rate`, and the line search's (`learning_rate`, `value`, `grad`,
        `info`).

    Examples:
        >>> def loss_fn(p):  # Rosenbrock's function, minimum at (1, 1)
        ...     return (1 - p["x"]) ** 2 + 100 * (p["y"] - p["x"] ** 2) ** 2
        >>> params = {"x": jnp.array(-1.2), "y": jnp.array(1.0)}
        >>> tx = gradtx.lbfgs()
        >>> value_and_grad = gradtx.value_and_grad_from_state(loss_fn)
        >>> @jax.jit
        ... def step(params, state):
        ...     loss, grads = value_and_grad(params, state=state)
        ...     u, state = tx.update(grads, state, params, value=loss, grad=grads, value_fn=loss_fn)
        ...     return gradtx.apply_updates(params, u), state
        >>> state = tx.init(params)
        >>> for _ in range(40):
        ...     params, state = step(params, state)
        >>> round(float(params["x"]), 4), round(float(params["y"]), 4)
        (1.0, 1.0)

    References:
        Nocedal & Wright, "Numerical Optimization", 2nd ed., Springer 2006, Chapters 3 and 7;
        Liu & Nocedal, "On the limited memory BFGS method for large scale optimization",
        Mathematical Programming 45, 1989.
    """
    if linesearch is not None and not isinstance(linesearch, Transformation):
        raise TypeError(
            "lbfgs: `linesearch` must be a gradtx line search (`scale_by_zoom_linesearch`, "
            f"`scale_by_backtracking_linesearch`) or None, got {type(linesearch).__name__}."
        )
    steps: list[Transformation] = [scale_by_lbfgs(memory_size, scale_init_precond)]
    # `None` is optax's `scale(-1)`: the same step, shown by `explain` as a learning rate of 1.
    steps.append(scale_by_learning_rate(1.0 if learning_rate is None else learning_rate))
    if linesearch is not None:
        steps.append(linesearch)
    return optimizer("lbfgs", *steps)
