"""References of the combinators, over flat dicts `{path: array}`, and of the
transformations made from functions (`stateless`, `stateless_with_tree_map`).

Each combinator node has `init(params) -> state`, `update(grads, state, params, lr) ->
(updates, state)` and `frozen(params) -> set of paths`. `grads` holds only the paths present
in the update; `lr` is the learning rate in force (an `Inject` node sets it for the nodes
below it). The semantics are written from the combinators' documentation, in float64.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any

import numpy as np

from references import Reference, State, _f64

Flat = dict[str, np.ndarray]


def f32(x: float) -> float:
    return float(np.float32(x))


def matches(glob: str, path: str) -> bool:
    """A one-pattern glob with gradtx's rules: `**` spans segments; a prefix selects below."""
    if glob.endswith("/**"):
        glob = glob[:-3]
    if glob.startswith("**/"):
        return fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], glob[3:])
    return path == glob or path.startswith(glob + "/")


def as_reference(node: Any) -> Any:
    """The node as a contract-suite `references.Reference` (no injected learning rate)."""
    import references

    return references.Reference(node.init, lambda g, s, p: node.update(g, s, p, None))


class Adam:
    def __init__(self, lr: float = 0.1, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
        self.lr, self.b1, self.b2, self.eps = f32(lr), f32(b1), f32(b2), f32(eps)

    def init(self, params: Flat) -> dict:
        zeros = {p: np.zeros(np.shape(x)) for p, x in params.items()}
        return {"m": dict(zeros), "v": dict(zeros), "t": {p: 0 for p in params}}

    def update(self, grads: Flat, state: dict, params: Flat, lr: float | None) -> tuple:
        lr = self.lr if lr is None else lr
        m, v, t = dict(state["m"]), dict(state["v"]), dict(state["t"])
        out = {}
        for p, g in grads.items():
            g = np.asarray(g, np.float64)
            m[p] = self.b1 * m[p] + (1 - self.b1) * g
            v[p] = self.b2 * v[p] + (1 - self.b2) * g * g
            t[p] += 1
            mh, vh = m[p] / (1 - self.b1 ** t[p]), v[p] / (1 - self.b2 ** t[p])
            out[p] = -lr * mh / (np.sqrt(vh) + self.eps)
        return out, {"m": m, "v": v, "t": t}

    def frozen(self, params: Flat) -> set:
        return set()


class Sgd:
    def __init__(self, lr: float = 0.1, momentum: float = 0.9):
        self.lr, self.momentum = f32(lr), f32(momentum)

    def init(self, params: Flat) -> dict:
        return {p: np.zeros(np.shape(x)) for p, x in params.items()}

    def update(self, grads: Flat, state: dict, params: Flat, lr: float | None) -> tuple:
        lr = self.lr if lr is None else lr
        trace = dict(state)
        out = {}
        for p, g in grads.items():
            trace[p] = np.asarray(g, np.float64) + self.momentum * trace[p]
            out[p] = -lr * trace[p]
        return out, trace

    def frozen(self, params: Flat) -> set:
        return set()


def _only(flat: Flat, keep: Callable[[str], bool]) -> Flat:
    return {p: x for p, x in flat.items() if keep(p)}


class Masked:
    def __init__(self, inner: Any, glob: str):
        self.inner, self.glob = inner, glob

    def init(self, params: Flat) -> Any:
        return self.inner.init(_only(params, lambda p: matches(self.glob, p)))

    def update(self, grads: Flat, state: Any, params: Flat, lr: float | None) -> tuple:
        group = _only(grads, lambda p: matches(self.glob, p))
        if not group:
            return dict(grads), state
        sub = _only(params, lambda p: matches(self.glob, p))
        out, state = self.inner.update(group, state, sub, lr)
        return {**grads, **out}, state

    def frozen(self, params: Flat) -> set:
        return self.inner.frozen(_only(params, lambda p: matches(self.glob, p)))


class Partition:
    """Label `a` for paths under `glob_a` (the inner), label `b` for the rest (`other`)."""

    def __init__(self, inner: Any, glob_a: str, other: Any):
        self.groups = {"a": inner, "b": other}
        self.glob_a = glob_a

    def _label(self, path: str) -> str:
        return "a" if matches(self.glob_a, path) else "b"

    def init(self, params: Flat) -> dict:
        return {
            label: tx.init(_only(params, lambda p, label=label: self._label(p) == label))
            for label, tx in self.groups.items()
        }

    def update(self, grads: Flat, state: dict, params: Flat, lr: float | None) -> tuple:
        out, new = dict(grads), dict(state)
        for label, tx in self.groups.items():
            group = _only(grads, lambda p, label=label: self._label(p) == label)
            if group:
                sub = _only(params, lambda p, label=label: self._label(p) == label)
                # An injected learning rate reaches the inner transformation, not `other`.
                result, new[label] = tx.update(
                    group, state[label], sub, lr if label == "a" else None
                )
                out.update(result)
        return out, new

    def frozen(self, params: Flat) -> set:
        out = set()
        for label, tx in self.groups.items():
            out |= tx.frozen(_only(params, lambda p, label=label: self._label(p) == label))
        return out


class Freeze:
    """Frozen: the paths `glob` selects (with `invert`, the paths it does not select)."""

    def __init__(self, inner: Any, glob: str, invert: bool = False):
        self.inner, self.invert = inner, invert
        self.glob = glob

    def _frozen(self, path: str) -> bool:
        return matches(self.glob, path) != self.invert

    def init(self, params: Flat) -> Any:
        return self.inner.init(_only(params, lambda p: not self._frozen(p)))

    def update(self, grads: Flat, state: Any, params: Flat, lr: float | None) -> tuple:
        out = {p: np.zeros(np.shape(g)) for p, g in grads.items() if self._frozen(p)}
        group = _only(grads, lambda p: not self._frozen(p))
        if group:
            sub = _only(params, lambda p: not self._frozen(p))
            result, state = self.inner.update(group, state, sub, lr)
            out.update(result)
        return out, state

    def frozen(self, params: Flat) -> set:
        rest = _only(params, lambda p: not self._frozen(p))
        return {p for p in params if self._frozen(p)} | self.inner.frozen(rest)


class Inject:
    """The learning rate follows `schedule(count)`, one count for the whole node."""

    def __init__(self, inner: Any, schedule: Callable[[int], float]):
        self.inner, self.schedule = inner, schedule

    def init(self, params: Flat) -> dict:
        return {"count": 0, "inner": self.inner.init(params)}

    def update(self, grads: Flat, state: dict, params: Flat, lr: float | None) -> tuple:
        lr = f32(self.schedule(state["count"]))
        out, inner = self.inner.update(grads, state["inner"], params, lr)
        return out, {"count": state["count"] + 1, "inner": inner}

    def frozen(self, params: Flat) -> set:
        return self.inner.frozen(params)


class Accumulate:
    def __init__(self, inner: Any, every: int):
        self.inner, self.every = inner, every

    def init(self, params: Flat) -> dict:
        frozen = self.inner.frozen(params)
        acc = {p: np.zeros(np.shape(x)) for p, x in params.items() if p not in frozen}
        return {"micro": 0, "acc": acc, "inner": self.inner.init(params)}

    def update(self, grads: Flat, state: dict, params: Flat, lr: float | None) -> tuple:
        acc = dict(state["acc"])
        for p, g in grads.items():
            if p in acc:
                acc[p] = acc[p] + np.asarray(g, np.float64)
        micro = state["micro"] + 1
        if micro < self.every:
            zeros = {p: np.zeros(np.shape(g)) for p, g in grads.items()}
            return zeros, {"micro": micro, "acc": acc, "inner": state["inner"]}
        mean = {p: (acc[p] / self.every if p in acc else g) for p, g in grads.items()}
        out, inner = self.inner.update(mean, state["inner"], params, lr)
        acc = {p: np.zeros_like(x) for p, x in acc.items()}
        return out, {"micro": 0, "acc": acc, "inner": inner}

    def frozen(self, params: Flat) -> set:
        return self.inner.frozen(params)


class ApplyIfFinite:
    def __init__(self, inner: Any, max_errors: int):
        self.inner, self.max_errors = inner, max_errors

    def init(self, params: Flat) -> dict:
        return {"bad": 0, "inner": self.inner.init(params)}

    def update(self, grads: Flat, state: dict, params: Flat, lr: float | None) -> tuple:
        out, inner = self.inner.update(grads, state["inner"], params, lr)
        finite = all(np.all(np.isfinite(x)) for x in [*grads.values(), *out.values()])
        if finite:
            return out, {"bad": 0, "inner": inner}
        if state["bad"] >= self.max_errors:  # too many in a row: the step goes through
            return out, {"bad": state["bad"] + 1, "inner": inner}
        zeros = {p: np.zeros(np.shape(g)) for p, g in grads.items()}
        return zeros, {"bad": state["bad"] + 1, "inner": state["inner"]}

    def frozen(self, params: Flat) -> set:
        return self.inner.frozen(params)


class Lookahead:
    """The slow weights are the params minus the gap, the sum of this node's own updates since
    the last synchronisation (so updates changed after it move the slow weights along)."""

    def __init__(self, inner: Any, sync_period: int, alpha: float):
        self.inner, self.sync, self.alpha = inner, sync_period, f32(alpha)

    def init(self, params: Flat) -> dict:
        gap = {p: np.zeros(np.shape(x)) for p, x in params.items()}
        return {"count": 0, "gap": gap, "inner": self.inner.init(params)}

    def update(self, grads: Flat, state: dict, params: Flat, lr: float | None) -> tuple:
        out, inner = self.inner.update(grads, state["inner"], params, lr)
        count = state["count"] + 1
        gap = dict(state["gap"])
        for p in out:
            fast = np.asarray(params[p], np.float64)
            slow = fast - gap[p]
            gap[p] = gap[p] + out[p]
            if count % self.sync == 0:
                slow = slow + self.alpha * (fast + out[p] - slow)
                out[p] = slow - fast
                gap[p] = np.zeros_like(gap[p])
        return out, {"count": count, "gap": gap, "inner": inner}

    def frozen(self, params: Flat) -> set:
        return self.inner.frozen(params)


class ClipChain:
    """`chain(clip_by_global_norm(max_norm), inner)`."""

    def __init__(self, inner: Any, max_norm: float):
        self.inner, self.max_norm = inner, f32(max_norm)

    def init(self, params: Flat) -> Any:
        return self.inner.init(params)

    def update(self, grads: Flat, state: Any, params: Flat, lr: float | None) -> tuple:
        norm = np.sqrt(sum(float(np.sum(np.asarray(g, np.float64) ** 2)) for g in grads.values()))
        factor = 1.0 if norm <= self.max_norm else self.max_norm / norm
        clipped = {p: np.asarray(g, np.float64) * factor for p, g in grads.items()}
        return self.inner.update(clipped, state, params, lr)

    def frozen(self, params: Flat) -> set:
        return self.inner.frozen(params)


class ScheduleFree:
    """`schedule_free(inner, lr, b1, weight_lr_power)`: z, the weight sums and rates per path."""

    def __init__(self, inner: Any, lr: float = 0.1, b1: float = 0.9, power: float = 2.0):
        self.inner, self.lr, self.b1, self.power = inner, f32(lr), f32(b1), f32(power)

    def init(self, params: Flat) -> dict:
        per_path = {p: np.asarray(x, np.float64) for p, x in params.items()}
        zeros = {p: 0.0 for p in params}
        return {
            "z": per_path,
            "sum": dict(zeros),
            "max": dict(zeros),
            "inner": self.inner.init(params),
        }

    def update(self, grads: Flat, state: dict, params: Flat, lr: float | None) -> tuple:
        lr = self.lr if lr is None else lr
        base, inner = self.inner.update(grads, state["inner"], params, lr)
        z, total, top = dict(state["z"]), dict(state["sum"]), dict(state["max"])
        out = {}
        for p, u in base.items():
            top[p] = max(top[p], lr)
            weight = top[p] ** self.power
            total[p] += weight
            c = weight / total[p] if total[p] > 0 else 0.0
            z_next = z[p] + u
            # x from y = b1 x + (1 - b1) z; then x' and y' as the paper writes them
            y = np.asarray(params[p], np.float64)
            x = (y - (1 - self.b1) * z[p]) / self.b1
            x_next = (1 - c) * x + c * z_next
            out[p] = self.b1 * x_next + (1 - self.b1) * z_next - y
            z[p] = z_next
        return out, {"z": z, "sum": total, "max": top, "inner": inner}

    def frozen(self, params: Flat) -> set:
        return self.inner.frozen(params)


class EmaParams:
    """`ema_params(inner, decay)`: the inner's updates; a debiased average of the new params."""

    def __init__(self, inner: Any, decay: float):
        self.inner, self.decay = inner, f32(decay)

    def init(self, params: Flat) -> dict:
        zeros = {p: np.zeros(np.shape(x)) for p, x in params.items()}
        return {"ema": zeros, "t": {p: 0 for p in params}, "inner": self.inner.init(params)}

    def update(self, grads: Flat, state: dict, params: Flat, lr: float | None) -> tuple:
        out, inner = self.inner.update(grads, state["inner"], params, lr)
        ema, t = dict(state["ema"]), dict(state["t"])
        for p, u in out.items():
            new = np.asarray(params[p], np.float64) + u
            ema[p] = self.decay * ema[p] + (1 - self.decay) * new
            t[p] += 1
        return out, {"ema": ema, "t": t, "inner": inner}

    def frozen(self, params: Flat) -> set:
        return self.inner.frozen(params)


def stateless(f: Callable[[Flat, Flat], Flat]) -> Reference:
    """`u = f(g, params)` for the whole (flat) tree; no state."""

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        return f({p: _f64(g) for p, g in grads.items()}, params), state

    return Reference(lambda params: {}, update)


def stateless_with_tree_map(f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Reference:
    """`u_p = f(g_p, params_p)` for every present path; no state."""

    def update(grads: Flat, state: State, params: Flat) -> tuple[Flat, State]:
        return {p: f(_f64(g), _f64(params[p])) for p, g in grads.items()}, state

    return Reference(lambda params: {}, update)
