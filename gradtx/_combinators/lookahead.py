"""Lookahead (Zhang et al., 2019): slow weights that follow the fast ones every k steps."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from gradtx._combinators.accumulate import check_count, check_flag
from gradtx._core.lift import (
    check_state_keys,
    compute_dtype,
    dtype_or_none,
    init_slots,
    update_slots,
    zeros_for,
)
from gradtx._core.module import field, hyperparam, static
from gradtx._core.protocol import Params, State, Transformation, Updates, own_hyperparams
from gradtx._core.update_sharding import like
from gradtx._layouts.packed import reject_packed
from gradtx._layouts.step_counts import StepCounts, next_count
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.paths import flatten, leaves, owning_path
from gradtx._paths.subset import present_paths


class Lookahead(Transformation):
    """Fast steps by an inner transformation, pulled back to slow weights (see `lookahead`)."""

    name: ClassVar[str] = "lookahead"
    fast: Any = field(converter=as_transformation)
    sync_period: int = static()
    alpha: Any = hyperparam()
    accumulator_dtype: Any = static(None, converter=dtype_or_none)
    reset_state: bool = static(False)

    def __check__(self) -> None:
        check_count(self.sync_period, "lookahead: sync_period", 1)
        check_flag(self.reset_state, "reset_state", "lookahead")

    def state_keys(self) -> tuple[str, ...]:
        """The fast state `fast`, the gap `fast_minus_slow` and the step `count`."""
        return ("fast", "fast_minus_slow", "count")

    def frozen_paths(self, params: Params) -> frozenset[str]:
        """The fast transformation's frozen paths."""
        return self.fast.frozen_paths(params)

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """The fast transformation's steps, then this one with `sync_period` and `alpha`."""
        entry = (self.name, {"sync_period": self.sync_period, **own_hyperparams(self, step)})
        fast = self.fast.describe(params, step)
        return {path: [*fast.get(path, []), entry] for path in present_paths(params)}

    def init_state(self, params: Params) -> dict:
        """The fast state, a zero gap (the slow weights are the params) and zero counts."""
        if self.reset_state:
            reject_packed(
                params, f"{self.name}(reset_state=True)", "restarts the fast state path by path"
            )

        def leaf_init(param: Any) -> dict[str, Any]:
            gap = zeros_for(param, self.accumulator_dtype)
            return {"fast_minus_slow": gap, "count": jnp.zeros((), jnp.int32)}

        slots = init_slots(params, leaf_init, ("fast_minus_slow", "count"), step_counts=("count",))
        return {"fast": self.fast.init_state(params), **slots}

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """A fast step; every `sync_period`-th step of a path, move it to the new slow weight."""
        check_state_keys(self.name, state, self.state_keys())
        if self.reset_state and params is None:
            raise ValueError(
                f"{self.name}(reset_state=True) needs the params, to restart the fast state "
                "from `fast.init(params)`: call `tx.update(updates, state, params)`."
            )
        fast_updates, fast_state = self.fast.step(updates, state["fast"], params, **extra)
        keep = 1 - self.alpha

        def sync(u: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            count = next_count(slots["count"])
            at_sync = count % jnp.int32(self.sync_period) == 0
            dtype = compute_dtype(u, slots["fast_minus_slow"])
            step = u.astype(dtype)
            gap = slots["fast_minus_slow"].astype(dtype) + step  # theta + u - phi
            # u' = phi + alpha * gap - theta = u - (1 - alpha) * gap: no weights involved
            out = jnp.where(at_sync, step - keep.astype(dtype) * gap, step)
            new_gap = jnp.where(at_sync, jnp.zeros_like(gap), gap)
            return out.astype(u.dtype), {"fast_minus_slow": new_gap, "count": count}

        slots = {"fast_minus_slow": state["fast_minus_slow"], "count": state["count"]}
        new_updates, slots = update_slots(sync, fast_updates, slots, owner=self.name)
        if self.reset_state:
            synced = _synced(slots["count"], present_paths(fast_updates), self.sync_period)
            with warnings.catch_warnings():  # `init`'s warnings were given at the user's own
                warnings.simplefilter("ignore")
                fresh = self.fast.init_state(params)
            fast_state = _restart(fast_state, fresh, synced, set(present_paths(params)))
        return new_updates, {"fast": fast_state, **slots}

    def eval_params(self, state: dict, params: Params) -> Any:
        """The slow weights (see `slow_params`), which lookahead evaluates.

        The fast transformation's own eval weights are a view of the fast weights, which
        the slow weights replace, so they are not used.
        """
        return self.slow_params(params, state)

    def slow_params(self, params: Params, state: dict) -> Any:
        """The slow weights, `params - fast_minus_slow`, shaped like `params`.

        Args:
            params: the params (the fast weights) after the last update was applied.
            state: this transformation's state after that update.

        Examples:
            >>> tx = gradtx.lookahead(gradtx.sgd(1.0), sync_period=3)
            >>> params = {"w": jnp.zeros(1)}
            >>> state = tx.init(params)
            >>> u, state = tx.update({"w": jnp.array([-1.0])}, state)
            >>> params = gradtx.apply_updates(params, u)
            >>> params["w"], tx.slow_params(params, state)["w"]
            (Array([1.], dtype=float32), Array([0.], dtype=float32))
        """
        check_state_keys(self.name, state, self.state_keys())

        def slow(param: Any, slots: dict, _: Any) -> tuple[Any, dict]:
            gap = slots["fast_minus_slow"]
            dtype = compute_dtype(param, gap)
            return (param.astype(dtype) - gap.astype(dtype)).astype(param.dtype), {}

        gaps = {"fast_minus_slow": state["fast_minus_slow"]}
        owner = f"{self.name}.slow_params"
        slow_params, _ = update_slots(slow, params, gaps, owner=owner, element_slots=())
        return slow_params  # in the params' own dtypes


def _synced(counts: Any, present: list[str], period: int) -> dict[str, tuple[Any, Any]]:
    """`{path: (group, synchronised)}` for the paths a step took, from their new counts.

    Paths of one `group` (a shared count of `counts`) synchronise together.
    """
    out: dict[str, tuple[Any, Any]] = {}
    flags: dict[Any, Any] = {}
    for path in present:
        group = counts.layout.index[path] if isinstance(counts, StepCounts) else path
        if group not in flags:
            flags[group] = counts[path] % jnp.int32(period) == 0
        out[path] = (group, flags[group])
    return out


def _restart(state: State, fresh: Any, synced: dict[str, tuple[Any, Any]], paths: Any) -> Any:
    """`state` with the entries of the synchronised paths taken from the `fresh` state.

    An entry belongs to the parameter path that ends its key (`adam/mu/enc/w`: `enc/w`, among
    `paths`); entries of no path (global scalars, injected hyperparameters) are kept.
    """
    if not synced:
        return state
    by_key = leaves(fresh)
    keys, old, treedef = flatten(state)
    out = []
    for key, leaf in zip(keys, old):
        new = by_key.get(key)
        if isinstance(leaf, StepCounts) and isinstance(new, StepCounts):
            leaf = _restart_counts(leaf, new, synced)
        elif isinstance(leaf, jax.Array) and isinstance(new, jax.Array):
            path = owning_path(key, paths)
            if path in synced and new.shape == leaf.shape:
                leaf = jnp.where(synced[path][1], like(new.astype(leaf.dtype), leaf), leaf)
        out.append(leaf)
    return treedef.unflatten(out)


def _restart_counts(counts: StepCounts, fresh: StepCounts, synced: dict) -> StepCounts:
    """`counts` with those of the synchronised paths taken from `fresh`.

    A shared count restarts as one when its paths synchronise together (they share one count
    of lookahead's too); otherwise the counts are kept one per path first.
    """

    def sources(paths: tuple[str, ...]) -> set:
        return {synced[p][0] if p in synced else None for p in paths}

    if any(len(sources(paths)) > 1 for paths in counts.layout.groups):
        counts = counts.per_path()
    values = []
    for paths, value in zip(counts.layout.groups, counts.scalars):
        first = paths[0]
        if first in synced and first in fresh:
            value = jnp.where(synced[first][1], fresh[first].astype(value.dtype), value)
        values.append(value)
    return StepCounts(counts.layout, values)


def lookahead(
    fast: Any,
    sync_period: int,
    alpha: float = 0.5,
    *,
    reset_state: bool = False,
    accumulator_dtype: Any = None,
) -> Lookahead:
    r"""Lookahead: take fast steps, and every `sync_period` steps pull back to slow weights.

    The params are the fast weights $\theta$; the slow weights $\phi$ start equal to the
    params. Every step takes the fast transformation's update $u_t$. At every
    `sync_period`-th step of a path ($k$ = `sync_period`, $\alpha$ = `alpha`) the slow weight
    moves towards the fast one and the params jump to it:

    $$\phi \leftarrow \phi + \alpha\,(\theta_t + u_t - \phi),\qquad
      u'_t = \phi_{\text{new}} - \theta_t = u_t - (1 - \alpha)\,(\theta_t + u_t - \phi)$$

    so after `apply_updates` the params are the new slow weights and the next $k$ fast steps
    start from them; at other steps $u'_t = u_t$. The fast transformation's state is kept
    across synchronisations, unless `reset_state=True` (optax's option): then, at each
    synchronisation, the fast state of the synchronised paths restarts from
    `fast.init(params)` (`params` those given to this `update`), as `gradtx.reset` restarts
    it: moments and step counts, a learning-rate schedule's count included, while entries of
    no path (injected hyperparameters, global estimates) are kept.

    The state keeps the gap $\theta - \phi$ (the sum of the fast updates since the last
    synchronisation) rather than $\phi$ itself, so the update is computed from the fast
    updates alone: $u'_t$ keeps their relative precision (a difference of nearby weights
    would carry the weights' rounding errors into it), `update` does not need the params,
    and right after a synchronisation the params *are* the slow weights, exactly. Read the
    slow weights, to evaluate with them, with `tx.slow_params(params, state)`.

    Each path counts its own steps, so a path without a gradient at a step (`None`) neither
    moves nor counts that step. Apply the updates as they are: changing them after
    `lookahead` (clipping them, say) moves the slow weights along.

    Args:
        fast: the inner ("fast") transformation, for example `gradtx.adam(1e-3)`.
        sync_period: $k \ge 1$, the number of fast steps between synchronisations.
        alpha: the slow step size $\alpha$ (a float32 hyperparameter leaf).
        reset_state: restart the fast state of each path when it synchronises (then
            `update` needs the params; packed params are refused).
        accumulator_dtype: dtype of the gap (default: the parameter's dtype).

    State:
        `fast/...` (the fast transformation's state), `fast_minus_slow/<path>` (the gap
        $\theta - \phi$) and `count/<path>` (int32, the path's number of steps).

    Examples:
        >>> tx = gradtx.lookahead(gradtx.sgd(1.0), sync_period=2, alpha=0.5)
        >>> params = {"w": jnp.zeros(1)}
        >>> state = tx.init(params)
        >>> for _ in range(2):
        ...     u, state = tx.update({"w": jnp.array([-1.0])}, state)
        ...     params = gradtx.apply_updates(params, u)
        ...     print(params["w"], tx.slow_params(params, state)["w"])
        [1.] [0.]
        [1.] [1.]

    References:
        Zhang, Lucas, Hinton & Ba, "Lookahead Optimizer: k steps forward, 1 step back", 2019.
    """
    return Lookahead(fast, sync_period, alpha, accumulator_dtype, reset_state)
