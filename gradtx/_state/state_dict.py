"""State tools: flat `{key: array}` views of optimizer state, loading and reconciling."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gradtx._core.protocol import Params, State
from gradtx._layouts.packed import Packed, join_leaves
from gradtx._layouts.step_counts import StepCounts, group_counts
from gradtx._paths.paths import flatten, is_unit, owning_path
from gradtx._paths.subset import present_paths
from gradtx._state.renaming import apply_rename, check_rename, old_paths
from gradtx._state.restore_report import listing


@dataclasses.dataclass(frozen=True)
class LoadReport:
    """What `load_state_dict` or `reconcile` did not take over as it was.

    Attributes:
        missing: keys the transformation needs that the loaded state lacks (initialised anew).
        unexpected: keys in the loaded state that the transformation does not use (dropped).
        mismatched: keys present in both whose shape or dtype changed (initialised anew),
            as `{key: (loaded (shape, dtype), expected (shape, dtype))}`.
        reinitialised: parameter paths whose state was initialised anew as a whole (every
            slot and its step count) because a key of theirs changed shape or dtype.
    """

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: dict[str, tuple] = dataclasses.field(default_factory=dict)
    reinitialised: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        """True if every key matched."""
        return not (self.missing or self.unexpected or self.mismatched or self.reinitialised)

    def __str__(self) -> str:
        lines = listing("missing", self.missing) + listing("unexpected", self.unexpected)
        for key, (got, want) in list(self.mismatched.items())[:10]:
            lines.append(f"changed: {key}: loaded {got}, expected {want}")
        lines += listing("re-initialised, every slot and count", self.reinitialised)
        return "\n".join(lines) or "all keys matched"


_LOAD_HINT = (
    "Use strict=False to initialise missing/changed keys and drop unexpected ones (the report "
    "is returned), or gradtx.reconcile after editing the model."
)


class StateMismatchError(KeyError):
    """A loaded state does not fit the transformation; `.report` says how.

    `.report` is a `LoadReport` (from `load_state_dict`) or a `RestoreReport` (from
    `gradtx.restore`, which also covers the params and the transformation's fingerprint).
    """

    def __init__(
        self,
        report: Any,
        *,
        intro: str = "the state does not match the transformation and params",
        hint: str = _LOAD_HINT,
    ) -> None:
        super().__init__(f"{intro}:\n{report}\n{hint}")
        self.report = report

    def __str__(self) -> str:
        return str(self.args[0])


def state_dict(state: State) -> dict[str, Any]:
    """Flatten an optimizer state into `{key: array}` with readable keys.

    Keys join the names of combinators, slots and parameter paths with `/`, for example
    `adamw/mu/enc/layers/0/w` for the first moment of `enc/layers/0/w` in the `adamw` step of
    a chain. Arrays are returned as they are (no copy), except that the state of packed
    params (`gradtx.pack`) is sliced into one entry per parameter path, so packed and unpacked
    models have the same keys.

    Args:
        state: the state of any gradtx transformation (other pytrees work too).

    Examples:
        >>> tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(1e-3))
        >>> sorted(gradtx.state_dict(tx.init({"w": jnp.zeros(2)})))[:2]
        ['adamw/count/w', 'adamw/mu/w']
    """
    paths, leaves, _ = flatten(state)
    out: dict[str, Any] = {}
    for path, leaf in zip(paths, leaves):
        if is_unit(leaf):  # packed: one key per parameter path, as for unpacked params
            out.update(leaf.items(unit_prefix(path)))
        elif leaf is not None:
            out[path] = leaf
    return out


def unit_prefix(path: str) -> str:
    """The prefix of a packed unit's keys: its path without the trailing `/` of a root unit.

    Packed params at the root of the params sit under the key "" of each slot (`mu/`).
    """
    return path[:-1] if path.endswith("/") else path


def _signature(x: Any) -> tuple[tuple[int, ...], str]:
    return tuple(np.shape(x)), str(jnp.result_type(x))


def _as_array(value: Any, like: Any) -> Any:
    return value if isinstance(value, jax.Array) else jnp.asarray(value)


class _Filling:
    """Entries of a flat `{key: array}` taken into a template, and what did not fit."""

    def __init__(self, flat: dict[str, Any], place: Callable[[Any, Any], Any]) -> None:
        self.flat, self.place = flat, place
        self.missing: list[str] = []
        self.mismatched: dict[str, tuple] = {}

    def take(self, key: str, default: Any) -> Any:
        """The entry `key` as it was loaded, or `default` (reported) when it does not fit."""
        if key not in self.flat:
            self.missing.append(key)
        elif _signature(self.flat[key]) != _signature(default):
            self.mismatched[key] = (_signature(self.flat[key]), _signature(default))
        else:
            return self.flat[key]
        return default

    def fit(self, key: str, default: Any) -> Any:
        """`take`, placed as `place(value, default)` says."""
        value = self.take(key, default)
        return default if value is default else self.place(value, default)

    def unit(self, path: str, template: Any) -> Any:
        """Assemble a packed unit's buffers from per-path entries (template where absent)."""
        if isinstance(template, StepCounts):  # paths with equal loaded counts share one
            counts = {
                name: self.fit(key, d) for (key, d), name in zip(template.items(path), template)
            }
            return group_counts(counts, like=template)
        if not isinstance(template, Packed):  # a unit without per-path state (bucket offsets)
            return template
        by_group: list[list] = [[] for _ in template.buffers]
        for spec, (key, default) in zip(template.layout.specs, template.items(path)):
            by_group[spec.group].append((key, self.take(key, default)))
        return template.replace(
            tuple(self._buffer(path, e, old) for e, old in zip(by_group, template.buffers))
        )

    def _buffer(self, path: str, entries: list[tuple[str, Any]], old: Any) -> Any:
        parts = [v for _, v in entries]
        if not parts or any(isinstance(p, jax.ShapeDtypeStruct) for p in parts):
            return old  # nothing to fill, or no value for some path (the caller says so)
        if np.ndim(old) == 0:  # one value shared by the buffer's paths: they must agree
            values = {key: np.asarray(v).item() for key, v in entries}
            if len(set(values.values())) > 1:
                example = {v: k for k, v in values.items()}  # one key per distinct value
                raise ValueError(
                    f"load_state_dict: the packed state at {path!r} keeps one value for all "
                    f"of its {len(values)} paths, but the loaded values differ, for example "
                    f"{ {k: v for v, k in list(example.items())[:4]} } (a step count cannot "
                    "differ between the leaves of one buffer)."
                )
            return self.place(jnp.asarray(parts[0], old.dtype), old)
        if all(isinstance(p, np.ndarray) for p in parts):
            # Joined on the host: one transfer per buffer, the bytes exactly as loaded.
            joined = np.concatenate([np.ravel(p) for p in parts]).reshape(np.shape(old))
        else:
            joined = join_leaves(parts, np.shape(old))
        return self.place(joined, old)


def merge_flat(
    template: Any, flat: dict[str, Any], place: Callable[[Any, Any], Any] = _as_array
) -> tuple[Any, LoadReport]:
    """`template` with each entry of `flat` that fits its key's shape and dtype.

    Keys are `state_dict`'s. A taken entry is put in as `place(value, template's leaf)`
    gives it; the report lists the keys left as in `template` and the entries not used.
    """
    paths, leaves, treedef = flatten(template)
    filling = _Filling(flat, place)
    expected = {p for p, x in zip(paths, leaves) if x is not None and not is_unit(x)}
    out = []
    for path, leaf in zip(paths, leaves):
        if is_unit(leaf):
            expected.update(leaf.paths(unit_prefix(path)))
            out.append(filling.unit(unit_prefix(path), leaf))
        else:
            out.append(None if leaf is None else filling.fit(path, leaf))
    unexpected = tuple(k for k in flat if k not in expected)
    report = LoadReport(tuple(filling.missing), unexpected, filling.mismatched)
    return treedef.unflatten(out), report


def load_state_dict(
    tx: Any,
    params: Params,
    flat: dict[str, Any],
    *,
    strict: bool = True,
    rename: dict[str, str] | None = None,
) -> tuple[Any, LoadReport]:
    """Build `tx`'s state for `params` from a flat `{key: array}` (as made by `state_dict`).

    A parameter path with a key whose shape or dtype changed is initialised anew as a whole,
    its step count included (bias correction restarts with its moments), and the report lists
    it under `reinitialised`.

    Args:
        tx: the transformation the state is for.
        params: the params (arrays or `jax.ShapeDtypeStruct` leaves).
        flat: `{key: array}`, e.g. a checkpoint read back from disk (NumPy arrays are fine).
        strict: raise `StateMismatchError` on any missing, unexpected or changed key. With
            `strict=False`, missing and changed keys are initialised by `tx.init(params)` and
            unexpected keys are dropped.
        rename: `{"old/prefix": "new/prefix"}` for subtrees that moved or were re-indexed
            since `flat` was saved (a layer inserted into a list shifts the later indices):
            their state is read under the new paths, the longest matching prefix first.

    Returns:
        `(state, report)`: the state, and a `LoadReport` of what did not match.

    Examples:
        >>> tx, params = gradtx.adam(1e-3), {"w": jnp.zeros(2)}
        >>> flat = gradtx.state_dict(tx.init(params))
        >>> state, report = gradtx.load_state_dict(tx, params, flat)
        >>> report.clean
        True
    """
    _check_flat(flat)
    param_paths = set(present_paths(params))
    flat = dict(flat)
    moves = check_rename(rename, "load_state_dict")
    if moves:
        unused = [old for old in moves if not any(f"/{old}/" in f"/{k}/" for k in flat)]
        if unused:
            raise ValueError(
                f"load_state_dict: `rename` prefixes {unused} match no path of the state's keys "
                f"(they include {list(flat)[:5]}); check them for typos."
            )
        saved = dict.fromkeys(old_paths(moves, sorted(param_paths)))
        _, flat = apply_rename("the state", moves, saved, flat, "load_state_dict")
    template = tx.init(params)
    state, report = merge_flat(template, flat)
    if report.mismatched:
        owners = (owning_path(k, param_paths) for k in report.mismatched)
        changed = {owner for owner in owners if owner is not None}
        if changed:  # every slot of a changed path anew, its count too
            kept = {k: v for k, v in flat.items() if owning_path(k, param_paths) not in changed}
            state, again = merge_flat(template, kept)
            missing = tuple(k for k in again.missing if owning_path(k, param_paths) not in changed)
            report = LoadReport(
                missing, report.unexpected, report.mismatched, tuple(sorted(changed))
            )
    if strict and not report.clean:
        raise StateMismatchError(report)
    return state, report


def _check_flat(flat: Any) -> None:
    """Raise if `flat` is not `state_dict`'s `{key: array}` (a nested state, say)."""
    if not isinstance(flat, Mapping):
        raise TypeError(
            f"load_state_dict: `flat` must be the dict `gradtx.state_dict(state)` gives, got "
            f"{type(flat).__name__}."
        )
    for key, value in flat.items():
        number = isinstance(value, (bool, int, float, np.generic))
        if not isinstance(key, str) or not (hasattr(value, "shape") or number):
            raise TypeError(
                f"load_state_dict: `flat` must be flat, `{{key: array}}`, but its entry {key!r} "
                f"is a {type(value).__name__}: this looks like the nested state itself. Pass "
                "`gradtx.state_dict(state)` instead."
            )


def reconcile(
    tx: Any, state: State, new_params: Params, *, rename: dict[str, str] | None = None
) -> tuple[Any, LoadReport]:
    """Carry `state` over to `new_params` after the model changed (layers added or removed).

    The state of every surviving path (same key, shape and dtype) is kept bit-for-bit; new
    paths are initialised by `tx.init(new_params)`; the keys of removed paths are reported as
    `unexpected` and dropped.

    Args:
        tx: the transformation.
        state: the state made for the old params.
        new_params: the new params.
        rename: `{"old/prefix": "new/prefix"}` for subtrees that moved or were re-indexed
            (see `load_state_dict`).

    Returns:
        `(new_state, report)`.

    Examples:
        >>> tx = gradtx.adam(1e-3)
        >>> state = tx.init({"w": jnp.ones(2)})
        >>> state, report = gradtx.reconcile(tx, state, {"w": jnp.ones(2), "b": jnp.ones(1)})
        >>> report.missing
        ('count/b', 'mu/b', 'nu/b')
    """
    return load_state_dict(tx, new_params, state_dict(state), strict=False, rename=rename)
