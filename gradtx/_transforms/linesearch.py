"""Line searches along the updates: the shared plumbing, and reusing what they evaluate.

A line search is called as `tx.update(updates, state, params, value=f(params),
grad=grad_f(params), value_fn=f)`: `updates` is the direction, and the search picks a
step size eta by evaluating `value_fn` at `params + eta * updates` (the very point
`apply_updates` then gives). The value and gradient at the accepted point are kept in the
state, where `value_and_grad_from_state` finds them for the next step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from gradtx._core.apply import apply_updates
from gradtx._core.lift import (
    cast,
    check_state_keys,
    compute_dtype,
    init_slots,
    map_updates,
    split_explicitly,
    update_slots,
    zeros_for,
)
from gradtx._core.protocol import Params, State, Transformation, Updates
from gradtx._core.statistics import KeepsStatistics, statistics
from gradtx._core.widening import promoted
from gradtx._layouts.complex import from_real, is_complex, real_dtype, to_real
from gradtx._layouts.packed import reject_packed
from gradtx._paths.paths import flatten, path_of
from gradtx._transforms.scale import scaled


def scalar_dtype(tree: Any) -> Any:
    """The dtype of global scalars over `tree`: float32, float64 when a leaf is 64-bit."""
    dtypes = []
    for leaf in flatten(tree)[1]:
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jnp.issubdtype(dtype, jnp.inexact):
            dtypes.append(real_dtype(dtype) if is_complex(leaf) else jnp.dtype(dtype))
    return promoted(jnp.float32, *dtypes)


def dot(xs: list, ys: list, dtype: Any) -> jax.Array:
    """`sum_i <xs[i], ys[i]>` over pairs of real arrays, each product in its compute dtype."""
    total = jnp.zeros((), dtype)
    for x, y in zip(xs, ys):
        wide = compute_dtype(x, y)
        x, y = cast(x, wide), cast(y, wide)
        # A split array (explicit axes) has no layout for `vdot`'s flattening: its products
        # summed give the same inner product, reduced across the devices.
        product = jnp.sum(x * y) if split_explicitly(x) or split_explicitly(y) else jnp.vdot(x, y)
        total = total + cast(product, dtype)
    return total


def _real(x: Any) -> Any:
    """A gradient leaf in gradtx's convention, as its real view in its compute dtype."""
    if is_complex(x):
        x = to_real(x)
    return cast(x, compute_dtype(x))


def _value_fn_kwargs(value_fn: Callable, extra: dict[str, Any]) -> dict[str, Any]:
    """The extra `update` arguments that `value_fn` names (after the params), passed on."""
    try:
        parameters = list(inspect.signature(value_fn).parameters.values())
    except (TypeError, ValueError):
        return {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = {p.name for p in parameters[1:] if p.kind in kinds}
    return {k: v for k, v in extra.items() if k in names}


def _missing(owner: str, name: str) -> TypeError:
    return TypeError(
        f"{owner} needs `{name}`: call `tx.update(updates, state, params, value=loss, "
        "grad=grads, value_fn=loss_fn)`, with the loss and its gradient at `params` (from "
        "`jax.value_and_grad(loss_fn)(params)`, or `gradtx.value_and_grad_from_state`) and "
        "the function `loss_fn(params)` it evaluates at the trial points."
    )


class Line:
    """The line `params + eta * updates` over the paths present in `updates`.

    Built from `update`'s arguments, which it checks: the params, and in `extra` the `value`
    and `grad` at `params` and the `value_fn` (with the other entries it names).
    `directions` and the gradients it returns are the real views of those paths, in their
    compute dtypes; scalars (the values `value0`, the slopes `slope0`) are in `dtype`.
    """

    def __init__(
        self, owner: str, updates: Updates, params: Params, extra: dict, dtype: Any
    ) -> None:
        reject_packed(updates, owner, "evaluates the loss at points along the updates")
        if params is None:
            raise ValueError(
                f"{owner} needs the params: call `tx.update(updates, state, params, "
                "value=..., grad=..., value_fn=...)`."
            )
        rest = dict(extra)
        value, grad, value_fn = (rest.pop(k, None) for k in ("value", "grad", "value_fn"))
        for name, given in (("value_fn", value_fn), ("value", value), ("grad", grad)):
            if given is None:
                raise _missing(owner, name)
        if not callable(value_fn):
            raise TypeError(f"{owner}: `value_fn` must be a function of the params.")
        self.owner, self.updates, self.params, self.dtype = owner, updates, params, dtype
        self.value_fn, self.fn_kwargs = value_fn, _value_fn_kwargs(value_fn, rest)
        paths, leaves, _ = flatten(updates)
        self.paths = tuple(p for p, u in zip(paths, leaves) if u is not None)
        self.directions = [_real(u) for u in leaves if u is not None]
        if jnp.shape(value) != ():
            raise TypeError(
                f"{owner}: `value` must be the scalar loss at `params`, got shape "
                f"{jnp.shape(value)}."
            )
        self.value0 = cast(jnp.asarray(value), dtype)
        self.grad0 = self._present(grad, "grad", conjugate=False)
        self.slope0 = dot(self.grad0, self.directions, dtype)

    def _present(self, tree: Any, what: str, *, conjugate: bool) -> list:
        """The leaves of `tree` at the present paths, as real views (conjugated if asked)."""
        by_path = dict(zip(*flatten(tree)[:2]))
        out = []
        for path, direction in zip(self.paths, self.directions):
            leaf = by_path.get(path)
            if leaf is None:
                raise ValueError(
                    f"{self.owner}: `{what}` has no leaf at path {path!r}, where the updates "
                    "have one; it must be the gradient of the loss at `params`, with the "
                    "params' structure."
                )
            if conjugate and is_complex(leaf):  # jax.grad's convention -> gradtx's
                leaf = jnp.conj(leaf)
            real = _real(leaf)
            if real.shape != direction.shape:
                raise ValueError(
                    f"{self.owner}: at path {path!r} `{what}` has shape "
                    f"{jnp.shape(leaf)}, but the update has another shape."
                )
            out.append(cast(real, direction.dtype))
        return out

    def step(self, eta: jax.Array, params: Params = None) -> Any:
        """The updates times `eta` (each in its own dtype); `params` checks their paths."""
        return map_updates(lambda u, _: scaled(u, eta), self.updates, params, owner=self.owner)

    def value(self, eta: jax.Array) -> jax.Array:
        """`value_fn` at `params + eta * updates`, in `dtype`."""
        value = self.value_fn(apply_updates(self.params, self.step(eta)), **self.fn_kwargs)
        return self._scalar(value)

    def value_and_grad(self, eta: jax.Array) -> tuple[jax.Array, jax.Array, list]:
        """`(value, slope, gradients)` at `params + eta * updates`."""
        trial = apply_updates(self.params, self.step(eta))

        def scalar_fn(params: Params) -> jax.Array:  # says so before `jax.grad` does
            value = jnp.asarray(self.value_fn(params, **self.fn_kwargs))
            self._scalar(value)
            return value

        value, grad = jax.value_and_grad(scalar_fn)(trial)
        grads = self._present(grad, "the gradient of value_fn", conjugate=True)
        return self._scalar(value), dot(grads, self.directions, self.dtype), grads

    def _scalar(self, value: Any) -> jax.Array:
        value = jnp.asarray(value)
        if value.shape != ():
            raise TypeError(
                f"{self.owner}: `value_fn` must return a scalar loss, got shape {value.shape}."
            )
        return cast(value, self.dtype)


class Linesearch(Transformation, KeepsStatistics):
    """Shared `init` and bookkeeping of the line searches (see their factories).

    Subclasses declare the static field `keep_statistics`; without statistics, the state
    holds no `info`.
    """

    name: ClassVar[str] = "linesearch"
    info_keys: ClassVar[tuple[str, ...]] = ("num_linesearch_steps", "decrease_error", "failed")

    def keeps_grad(self) -> bool:
        """Whether the state keeps the gradient at the accepted point."""
        return True

    def state_keys(self) -> tuple[str, ...]:
        """The last step size and value, the gradient per path, and the search's `info`."""
        info = ("info",) if self.keep_statistics else ()
        return ("learning_rate", "value", *(("grad",) if self.keeps_grad() else ()), *info)

    def init_state(self, params: Params) -> dict:
        """Step size 1, value `inf` (nothing evaluated yet), zero gradients."""
        reject_packed(params, self.name, "evaluates the loss at points along the updates")
        dtype = scalar_dtype(params)
        state: dict[str, Any] = {}
        if self.keeps_grad():
            state = init_slots(params, lambda p: {"grad": zeros_for(p)}, ("grad",))
        state["learning_rate"] = jnp.ones((), dtype)
        state["value"] = jnp.full((), jnp.inf, dtype)
        if not self.keep_statistics:
            return state
        start = {"num_linesearch_steps": jnp.zeros((), jnp.int32), "failed": jnp.zeros((), bool)}
        state["info"] = statistics(
            {k: start[k] if k in start else jnp.full((), jnp.inf, dtype) for k in self.info_keys}
        )
        return state

    def line(self, updates: Updates, state: dict, params: Params, extra: dict[str, Any]) -> Line:
        """The checked arguments of `update`, as the line to search along."""
        check_state_keys(self.name, state, self.state_keys())
        return Line(self.name, updates, params, extra, state["value"].dtype)

    def finish(
        self, line: Line, state: dict, eta: Any, value: Any, grads: list | None, info: dict
    ) -> tuple[Any, dict]:
        """The updates times `eta`, and the state holding `eta`, the value and gradients."""
        new_state = {"learning_rate": eta, "value": value}
        if self.keep_statistics:
            new_state["info"] = statistics(info)
        if grads is None:
            return line.step(eta, line.params), new_state
        found = iter(grads)

        def emit(u: Any, slots: dict, _: Any) -> tuple[Any, dict]:
            return scaled(u, eta), {"grad": next(found)}

        new_updates, slots = update_slots(
            emit, line.updates, {"grad": state["grad"]}, line.params, owner=self.name
        )
        return new_updates, {**slots, **new_state}


def check_steps(value: Any, name: str) -> None:
    """Raise unless `value` (the argument `name`) is a positive integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}")


def missed(error: jax.Array, no_step: jax.Array) -> jax.Array:
    """How much a condition missed by (0 when met); `inf` when no step was taken, or for NaN."""
    return jnp.where(jnp.isnan(error) | no_step, jnp.full((), jnp.inf, error.dtype), error)


def report(owner: str, failed: jax.Array, eta: jax.Array, error: jax.Array) -> None:
    """Print a line when the search failed (`verbose=True`)."""

    def say(failed: Any, eta: Any, error: Any) -> None:
        if failed:
            print(f"{owner}: no step size met the conditions; took {eta} (error {error}).")

    jax.debug.callback(say, failed, eta, error)


# --- reusing the value and gradient the search kept ----------------------------------------------


def _holds_both(node: Any) -> bool:
    return isinstance(node, Mapping) and "value" in node and "grad" in node


def _searches(state: State) -> list[tuple[str, Mapping]]:
    """`(key, node)` for every part of `state` keeping a line search's value and gradient."""
    found = jax.tree_util.tree_flatten_with_path(state, is_leaf=_holds_both)[0]
    return [(path_of(kp), node) for kp, node in found if _holds_both(node)]


def _stored_grad(found: Mapping, params: Params) -> Any:
    """The kept gradient as a tree shaped like `params`, in `jax.grad`'s convention."""
    paths, leaves, treedef = flatten(params)
    kept = found["grad"]
    out = []
    for path, param in zip(paths, leaves):
        if param is None:
            out.append(None)
            continue
        if path not in kept:
            raise KeyError(
                f"value_and_grad_from_state: the line search's state has no gradient for path "
                f"{path!r} (it keeps {list(kept)[:6]}); pass the params its transformation "
                "was initialised with, in the same structure."
            )
        grad = kept[path]
        if is_complex(param):  # kept as the real view, in gradtx's (conjugate) convention
            grad = jnp.conj(from_real(grad, param.dtype))
        out.append(cast(grad, param.dtype))
    return treedef.unflatten(out)


def value_and_grad_from_state(
    value_fn: Callable[..., Any],
) -> Callable[..., tuple[jax.Array, Any]]:
    r"""`jax.value_and_grad(value_fn)` that reuses what a line search kept in the state.

    A line search (`scale_by_zoom_linesearch`, `scale_by_backtracking_linesearch` with
    `store_grad=True`, or `lbfgs`) evaluates the loss and its gradient at the point it
    accepts, which are the loss and gradient at the next params. The returned function
    `f(params, *args, state, **kwargs) -> (value, grad)` reads them from `state` instead of
    computing them again, and computes `jax.value_and_grad(value_fn)(params, *args,
    **kwargs)` when the kept value is not finite (after `init`, or a loss that was `inf`).

    It assumes that `params` are those the last update moved to (`apply_updates(params,
    updates)` with that update) and that `value_fn` is the one the search evaluated. The
    search's state is found by name anywhere in `state` (inside a `chain` or `partition`
    too), as the entries `value` and `grad`; exactly one search must keep them. The gradient
    is returned as `jax.grad` gives it: for a complex parameter, the conjugate of the
    gradient gradtx takes (see the numerics page), so conjugate it before `update` as you
    would `jax.grad`'s. A path that had no update at the last step keeps the gradient of an
    earlier step.

    Args:
        value_fn: the loss, `value_fn(params, *args, **kwargs) -> scalar`.

    Returns:
        `f(params, *args, state, **kwargs) -> (value, grad)`, usable under `jit`.

    Raises:
        ValueError: `state` keeps no line search's value and gradient, or several do.

    Examples:
        >>> loss_fn = lambda p: jnp.sum((p["w"] - 1.0) ** 2)
        >>> value_and_grad = gradtx.value_and_grad_from_state(loss_fn)
        >>> tx, params = gradtx.lbfgs(), {"w": jnp.zeros(2)}
        >>> state = tx.init(params)
        >>> for _ in range(2):
        ...     loss, grads = value_and_grad(params, state=state)
        ...     u, state = tx.update(
        ...         grads, state, params, value=loss, grad=grads, value_fn=loss_fn
        ...     )
        ...     params = gradtx.apply_updates(params, u)
        >>> params["w"]
        Array([1., 1.], dtype=float32)
    """

    def value_and_grad(params: Params, *args: Any, state: State, **kwargs: Any) -> tuple:
        found = _searches(state)
        if len(found) != 1:
            where = [key or "(the state itself)" for key, _ in found]
            at = f" at {where}" if where else ""
            raise ValueError(
                "value_and_grad_from_state: expected the state of exactly one line search "
                f"(entries `value` and `grad`), found {len(found)}{at}. "
                "Pass the state of `lbfgs` or of a chain with `scale_by_zoom_linesearch` (or "
                "`scale_by_backtracking_linesearch(..., store_grad=True)`)."
            )
        _, search = found[0]
        kept = _stored_grad(search, params)

        def compute() -> tuple:
            return jax.value_and_grad(value_fn)(params, *args, **kwargs)

        shapes = jax.eval_shape(compute)

        def reuse() -> tuple:
            return cast(search["value"], shapes[0].dtype), kept

        return lax.cond(jnp.isfinite(search["value"]), reuse, compute)

    return value_and_grad
