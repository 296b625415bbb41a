"""SAM: sharpness-aware minimisation, adversarial ascent steps between descent steps."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from gradtx._combinators.accumulate import check_count
from gradtx._core.apply import apply_updates
from gradtx._core.lift import check_state_keys, compute_dtype, update_slots
from gradtx._core.module import static
from gradtx._core.protocol import Params, Transformation, Updates, merge_descriptions
from gradtx._core.update_sharding import like
from gradtx._layouts.complex import from_real, is_complex
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.paths import flatten
from gradtx._paths.subset import present_paths
from gradtx.contrib._reductions import copies_of, needs_params_error


def _select(cond: Any, if_true: Any, if_false: Any) -> Any:
    """`if_true` where `cond`, else `if_false`, leaf by leaf (`None` leaves stay `None`)."""

    def pick(a: Any, b: Any) -> Any:
        return None if a is None else jnp.where(cond, a, like(b, a))  # one layout, explicitly

    return jax.tree.map(pick, if_true, if_false, is_leaf=lambda x: x is None)


def _outer(cache: dict, params: Params) -> Any:
    """The cached outer params, each in its parameter's own form.

    A complex parameter is cached as its real view, like all per-path state.
    """
    paths, leaves, treedef = flatten(params)

    def own_form(path: str, x: Any) -> Any:
        return from_real(cache[path], x.dtype) if is_complex(x) else cache[path]

    return treedef.unflatten([None if x is None else own_form(p, x) for p, x in zip(paths, leaves)])


def _negate(updates: Updates) -> Any:
    return jax.tree.map(lambda u: -u, updates)


def _sync_period(value: Any, name: str) -> int:
    check_count(value, "sync_period", 1)
    return value


class Sam(Transformation):
    """Sharpness-aware minimisation around two inner optimizers (see `sam`)."""

    name: ClassVar[str] = "sam"
    optimizer: Any = None
    adv_optimizer: Any = None
    sync_period: int = static(2, converter=_sync_period)
    reset_state: bool = static(True)
    opaque_mode: bool = static(False)
    batch_axis_name: Any = static(None)

    def state_keys(self) -> tuple[str, ...]:
        """The step within the cycle, both inner states, and the outer params (`cache`)."""
        keys = ("steps_since_sync", "optimizer", "adv_optimizer")
        return keys if self.opaque_mode else (*keys, "cache")

    def init_state(self, params: Params) -> dict:
        """The inner optimizers' states, and a copy of the params (transparent mode)."""
        state = {
            "steps_since_sync": jnp.zeros((), jnp.int32),
            "optimizer": self.optimizer.init_state(params),
            "adv_optimizer": self.adv_optimizer.init_state(params),
        }
        if not self.opaque_mode:
            state["cache"] = copies_of(params)
        return state

    def frozen_paths(self, params: Params) -> frozenset[str]:
        """Paths that neither the outer nor the adversarial optimizer moves."""
        return self.optimizer.frozen_paths(params) & self.adv_optimizer.frozen_paths(params)

    def eval_params(self, state: dict, params: Params) -> Any:
        """The outer optimizer's eval weights of the outer params.

        Inside a cycle (transparent mode) the params are an adversarial point and the outer
        params are those cached at the cycle's start; between cycles they are the params.
        """
        check_state_keys(self.name, state, self.state_keys())
        outer = params
        if not self.opaque_mode:
            between = state["steps_since_sync"] == 0
            outer = _select(between, params, _outer(state["cache"], params))
        return self.optimizer.eval_params(state["optimizer"], outer)

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """The outer optimizer's steps, after a `sam` entry with the cycle length."""
        entry = {
            path: [(self.name, {"sync_period": self.sync_period})] for path in present_paths(params)
        }
        return merge_descriptions(entry, self.optimizer.describe(params, step))

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """An adversarial (ascent) step, or, at the end of each cycle, the outer step."""
        check_state_keys(self.name, state, self.state_keys())
        if params is None:
            raise needs_params_error(self.name)
        if self.opaque_mode:
            return self._opaque(updates, state, params, extra.get("grad_fn"))
        steps = state["steps_since_sync"]
        first, last = steps == 0, steps == self.sync_period - 1

        adv_updates, adv_state = self.adv_optimizer.step(updates, state["adv_optimizer"], params)
        adv_updates = _negate(adv_updates)

        cache = state["cache"]
        opt_updates, opt_state = self.optimizer.step(
            updates, state["optimizer"], _outer(cache, params)
        )

        def back_to_outer(u: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            # From the adversarial point back to the outer params, then the outer step; at the
            # first step of a cycle the outer params are the current ones.
            dtype = compute_dtype(u, param, slots["cache"])
            c, p = slots["cache"].astype(dtype), param.astype(dtype)
            new_cache = jnp.where(first, param, slots["cache"])
            return ((c - p) + u.astype(dtype)).astype(u.dtype), {"cache": new_cache}

        opt_updates, new_cache = update_slots(
            back_to_outer, opt_updates, {"cache": cache}, params, owner=self.name, needs_params=True
        )
        new_updates = _select(last, opt_updates, adv_updates)
        if self.reset_state:
            adv_state = _select(last, self.adv_optimizer.init_state(params), adv_state)
        else:
            adv_state = _select(last, state["adv_optimizer"], adv_state)
        return new_updates, {
            "steps_since_sync": (steps + 1) % self.sync_period,
            "optimizer": _select(last, opt_state, state["optimizer"]),
            "adv_optimizer": adv_state,
            "cache": new_cache["cache"],
        }

    def _opaque(self, updates: Updates, state: dict, params: Params, grad_fn: Any) -> tuple:
        if grad_fn is None:
            raise ValueError(
                "sam(opaque_mode=True) needs the gradient function: call "
                "`tx.update(grads, state, params, grad_fn=grad_fn)` with "
                "`grad_fn(params, i) -> grads` (i: the adversarial step, 0 to sync_period - 2)."
            )
        adv_params, adv_updates, adv_state = params, updates, state["adv_optimizer"]
        for i in range(self.sync_period - 1):
            step, adv_state = self.adv_optimizer.step(adv_updates, adv_state, adv_params)
            adv_params = apply_updates(adv_params, _negate(step))
            adv_updates = grad_fn(adv_params, i)
            if self.batch_axis_name is not None:
                adv_updates = jax.lax.pmean(adv_updates, axis_name=self.batch_axis_name)
        if self.reset_state:
            adv_state = self.adv_optimizer.init_state(params)
        new_updates, opt_state = self.optimizer.step(adv_updates, state["optimizer"], params)
        return new_updates, {
            "steps_since_sync": jnp.zeros((), jnp.int32),
            "optimizer": opt_state,
            "adv_optimizer": adv_state,
        }


def sam(
    optimizer: Any,
    adv_optimizer: Any,
    sync_period: int = 2,
    reset_state: bool = True,
    opaque_mode: bool = False,
    batch_axis_name: str | None = None,
) -> Sam:
    r"""Sharpness-aware minimisation (SAM) around an outer and an adversarial optimizer.

    Each cycle of `sync_period` calls makes `sync_period - 1` adversarial *ascent* steps from
    the outer params $\theta$, then one outer step taken with the gradient at the
    adversarial point but applied to $\theta$. With `adv_optimizer = chain(
    normalize_by_update_norm(), sgd(rho))` and `sync_period=2` this is SAM as published:

    $$\tilde\theta_t = \theta_t + \rho\,\frac{\nabla f(\theta_t)}{\lVert\nabla f(\theta_t)
      \rVert},\qquad \theta_{t+1} = \theta_t + \mathrm{opt}\big(\nabla f(\tilde\theta_t)\big)$$

    In the default *transparent* mode each `update` call is one of these steps and its
    update is applied as usual: an adversarial call returns the negated `adv_optimizer`
    update (ascent); the last call of a cycle returns $\theta - \tilde\theta +
    \mathrm{opt}(g)$, which lands on the outer params plus the outer step. The outer params
    are kept in the state (`cache`), and the outer optimizer sees them as its params. Both
    inner optimizers run at every call and the results are selected, so the step compiles
    once. With `reset_state`, the adversarial state is re-initialised after each cycle.

    With `opaque_mode=True`, one call runs the whole cycle: call it as
    `tx.update(grads, state, params, grad_fn=grad_fn)` with `grad_fn(params, i) -> grads`
    (called `sync_period - 1` times, `i` the adversarial step); the returned update is the
    outer step, so side effects such as batch-norm statistics only see the outer params.
    `batch_axis_name` averages the adversarial gradients over that axis (`jax.lax.pmean`).

    Args:
        optimizer: the outer optimizer (descent).
        adv_optimizer: the adversarial optimizer; its update is negated (ascent).
        sync_period: the cycle length: `sync_period - 1` adversarial steps, then one outer.
        reset_state: re-initialise the adversarial state after each cycle.
        opaque_mode: run the whole cycle inside one `update` (needs `grad_fn`).
        batch_axis_name: the axis to average adversarial gradients over (opaque mode).

    State:
        `steps_since_sync` (int32), `optimizer/...` and `adv_optimizer/...` (the inner
        states), and in transparent mode `cache/<path>`, the outer params.

    Examples:
        >>> opt = gradtx.sgd(0.1)
        >>> adv = gradtx.chain(gradtx.normalize_by_update_norm(eps=0.0), gradtx.sgd(0.05))
        >>> tx = gradtx.contrib.sam(opt, adv)
        >>> params = {"w": jnp.array([3.0, 4.0])}
        >>> state = tx.init(params)
        >>> u, state = tx.update({"w": jnp.array([3.0, 4.0])}, state, params)
        >>> u["w"]  # ascent: rho * g / ||g||
        Array([0.03, 0.04], dtype=float32)
        >>> params = gradtx.apply_updates(params, u)
        >>> u, state = tx.update({"w": jnp.array([1.0, 1.0])}, state, params)
        >>> gradtx.apply_updates(params, u)["w"]  # the outer params minus 0.1 * g
        Array([2.9, 3.9], dtype=float32)

    References:
        Foret et al., "Sharpness-Aware Minimization for Efficiently Improving
        Generalization", ICLR 2021.
    """
    return Sam(
        as_transformation(optimizer, "sam(optimizer=...)"),
        as_transformation(adv_optimizer, "sam(adv_optimizer=...)"),
        sync_period,
        reset_state,
        opaque_mode,
        batch_axis_name,
    )
