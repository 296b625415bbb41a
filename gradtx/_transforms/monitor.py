"""`monitor`: statistics of the updates at one point of a chain, kept in the state."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import lax

from gradtx._core.lift import compute_dtype
from gradtx._core.module import static
from gradtx._core.protocol import Params, Transformation, Updates
from gradtx._core.statistics import statistics
from gradtx._layouts.complex import is_complex, to_real
from gradtx._layouts.packed import reject_packed
from gradtx._paths.paths import flatten, is_unit

STATISTICS = ("global_norm", "max_abs", "nonfinite_count", "norm", "update_ratio")
_PER_PATH = ("norm", "update_ratio")


def _present(tree: Any) -> dict[str, Any]:
    """`{path: array}` of the non-`None` leaves."""
    paths, leaves, _ = flatten(tree)
    return {p: x for p, x in zip(paths, leaves) if x is not None}


def _observed(x: Any) -> Any:
    """`x` as the statistics read it: a complex leaf as its real view, behind a barrier.

    Without the barrier XLA merges the monitor's `g * g` with the optimizer's own (Adam's
    second moment), and the merged product goes through memory to the reduction: one more
    gradient-sized buffer at the step's peak (76 MB on 20M float32 params).
    """
    return lax.optimization_barrier(to_real(x) if is_complex(x) else x)


def _squared_norm(x: Any) -> Any:
    x = x.astype(compute_dtype(x))
    return jnp.sum(x * x).astype(jnp.float32)


def _read_before_the_apply(updates: Updates, param_squares: dict[str, Any]) -> Any:
    """`updates`, bit for bit, each present leaf computed after its param's sum of squares.

    A donated step writes the new params into the old params' buffers, so XLA must run every
    reader of the old params first. Nothing orders `update_ratio`'s reduction before the
    apply, and XLA's CPU and GPU compilers both copied the params instead (an optimization
    barrier orders it on the GPU only). Subtracting a zero computed from the sum orders it:
    the sum is >= 0 or NaN, so `min(sum, 0)` is +0 after the NaN is replaced, and
    `u - (+0)` is `u` (-0, infinities and NaNs included).
    """
    paths, leaves, treedef = flatten(updates)
    tied = []
    for path, u in zip(paths, leaves):
        if path in param_squares:
            square = param_squares[path]
            zero = jnp.where(jnp.isnan(square), 0.0, jnp.minimum(square, 0.0))
            u = u - zero.astype(u.dtype)
        tied.append(u)
    return treedef.unflatten(tied)


def _ratio(update_norm: Any, param_norm: Any) -> Any:
    """`update_norm / param_norm`; 0 where both are 0, infinity where only the param is."""
    safe = jnp.where(param_norm > 0, param_norm, 1.0)
    unbounded = jnp.where(update_norm > 0, jnp.inf, 0.0).astype(jnp.float32)
    return jnp.where(param_norm > 0, update_norm / safe, unbounded)


def _as_stats(value: Any, name: str) -> tuple[str, ...]:
    """The statistics asked for, as a tuple of known names."""
    chosen = (value,) if isinstance(value, str) else tuple(value)
    unknown = [s for s in chosen if s not in STATISTICS]
    if unknown or not chosen:
        raise ValueError(
            f"monitor: unknown statistics {unknown} in `stats`; choose from {list(STATISTICS)}."
        )
    return chosen


class Monitor(Transformation):
    """Record statistics of the updates passing through (see `monitor`)."""

    label: str = static("monitor")
    stats: tuple[str, ...] | str = static(("global_norm",), converter=_as_stats)

    def __check__(self) -> None:
        if not isinstance(self.label, str) or not self.label or "/" in self.label:
            raise ValueError(
                f"monitor: `name` must be a non-empty string without '/', got {self.label!r}."
            )

    @property
    def name(self) -> str:  # type: ignore[override]
        """The monitor's name: the key of its statistics in a chain's state."""
        return self.label

    def init_state(self, params: Params) -> dict:
        """Zero statistics; per-path ones for every parameter path present in `params`."""
        reject_packed(params, f"monitor({self.label!r})", "keeps statistics per path")

        # A buffer per statistic: a donated step donates each (see gradtx/_core/statistics.py).
        def zero() -> Any:
            return jnp.zeros((), jnp.float32)

        state = {}
        for name in self.stats:
            if name in _PER_PATH:
                state[name] = statistics({p: zero() for p in _present(params)})
            else:
                state[name] = jnp.zeros((), jnp.int32) if name == "nonfinite_count" else zero()
        if "update_ratio" in self.stats:
            state["global_update_ratio"] = zero()
        return statistics(state)

    def step(
        self, updates: Updates, state: dict, params: Params = None, **extra: Any
    ) -> tuple[Any, dict]:
        """Return `updates` unchanged and the statistics of the paths present in them."""
        owner = f"monitor({self.label!r})"
        if not isinstance(state, dict) or any(s not in state for s in self.stats):
            raise KeyError(
                f"{owner}: expected the state made by its init, with {list(self.stats)}."
            )
        if any(is_unit(x) for x in _present(updates).values()):
            reject_packed(updates, owner, "keeps statistics per path")
        present = {p: _observed(u) for p, u in _present(updates).items()}
        squares = {p: _squared_norm(u) for p, u in present.items()}
        total = sum(squares.values(), jnp.zeros((), jnp.float32))
        new = dict(state)
        if "global_norm" in self.stats:
            new["global_norm"] = jnp.sqrt(total)
        if "max_abs" in self.stats:
            peaks = [jnp.max(jnp.abs(u)).astype(jnp.float32) for u in present.values() if u.size]
            new["max_abs"] = jnp.max(jnp.stack(peaks)) if peaks else jnp.zeros((), jnp.float32)
        if "nonfinite_count" in self.stats:
            counts = [jnp.sum(~jnp.isfinite(u), dtype=jnp.int32) for u in present.values()]
            new["nonfinite_count"] = sum(counts, jnp.zeros((), jnp.int32))
        for name in _PER_PATH:
            if name in self.stats:
                unknown = sorted(set(present) - set(state[name]))
                if unknown:
                    raise KeyError(
                        f"{owner}: no statistics for path {unknown[0]!r}; the params changed "
                        "since init (call gradtx.reconcile)."
                    )
        if "norm" in self.stats:
            new["norm"] = statistics(
                {**state["norm"], **{p: jnp.sqrt(s) for p, s in squares.items()}}
            )
        if "update_ratio" in self.stats:
            if params is None:
                raise ValueError(
                    f"{owner}: `update_ratio` needs the params; pass params= to update."
                )
            by_path = _present(params)
            param_squares = {p: _squared_norm(_observed(by_path[p])) for p in present}
            ratios = {p: _ratio(jnp.sqrt(squares[p]), jnp.sqrt(param_squares[p])) for p in present}
            new["update_ratio"] = statistics({**state["update_ratio"], **ratios})
            param_total = sum(param_squares.values(), jnp.zeros((), jnp.float32))
            new["global_update_ratio"] = _ratio(jnp.sqrt(total), jnp.sqrt(param_total))
            updates = _read_before_the_apply(updates, param_squares)
        return updates, statistics(new)


def monitor(name: str, stats: tuple[str, ...] | str = ("global_norm",)) -> Monitor:
    r"""Record statistics of the updates at this point of a chain; pass them on unchanged.

    Placed first in a chain it sees the raw gradients; after a clip, the clipped ones. The
    statistics are computed inside the (jitted) step and kept in the state, so reading them
    costs no extra pass and no host synchronisation until you print them. `gradtx.stats`
    collects them, with the monitor's name in the key (`grad/global_norm`; inside a
    `partition`, the group's label first: `encoder/grad/global_norm`).

    Statistics (over the paths present in the updates; a `None` leaf is left out, and its
    per-path values keep their last value):

    - `global_norm`: $\lVert u \rVert_2$ over every present leaf together (float32).
    - `max_abs`: the largest $|u_i|$ (float32).
    - `nonfinite_count`: how many elements are NaN or infinite (int32).
    - `norm`: $\lVert u_p \rVert_2$ per path `p` (keys `norm/<path>`).
    - `update_ratio`: $\lVert u_p \rVert_2 / \lVert \theta_p \rVert_2$ per path
      (`update_ratio/<path>`) and over all present paths (`global_update_ratio`); it needs the
      params. A zero param gives 0 for a zero update and infinity otherwise.

    Memory (XLA's CPU backend, `benchmarks/memory.py`): before the optimizer, `global_norm`,
    `max_abs`, `norm` and `update_ratio` add nothing to the compiled step's peak, and
    `nonfinite_count` (a reduction that does not fuse) adds a temporary up to the gradients'
    size. After the optimizer, any statistic keeps the updates in memory until the apply
    reads them, as a norm of optax's updates does. `update_ratio` hands on updates computed
    after its reduction of the params, so that a donated step writes the params in place.

    Args:
        name: the monitor's name, the key of its state in a chain (no `/`).
        stats: which statistics to record (a name or a tuple of names, from the list above).

    State:
        One entry per statistic (a statistics dict): `global_norm`, `max_abs`,
        `nonfinite_count`, `norm/<path>`, `update_ratio/<path>` and `global_update_ratio`.

    Examples:
        >>> tx = gradtx.chain(
        ...     gradtx.monitor("grad", ("global_norm", "max_abs")),
        ...     gradtx.clip_by_global_norm(1.0),
        ...     gradtx.monitor("clipped"),
        ...     gradtx.sgd(0.1),
        ... )
        >>> params = {"w": jnp.zeros(2)}
        >>> _, state = tx.update({"w": jnp.array([3.0, -4.0])}, tx.init(params), params)
        >>> for key, value in gradtx.stats(state).items():
        ...     print(key, value)
        clip_by_global_norm/clipped True
        clip_by_global_norm/global_norm 5.0
        clipped/global_norm 1.0
        grad/global_norm 5.0
        grad/max_abs 4.0
    """
    return Monitor(name, stats)
