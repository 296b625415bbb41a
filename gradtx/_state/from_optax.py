"""`from_optax`: an optax optimizer's state as the state of its gradtx equivalent, by path.

optax keeps state as positional NamedTuples (a chain is a tuple, Adam's moments are trees
shaped like the params); gradtx keeps it by name and path. The walk here pairs the two
structures step by step, turns optax's moments into `{slot/path: array}` entries and its
global step counts into one count per path, and hands the flat result to `load_state_dict`.

optax is never imported: its states are recognised by their type names and fields, so gradtx
keeps no dependency on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from gradtx._combinators.chain import Chain
from gradtx._combinators.inject import InjectHyperparams
from gradtx._combinators.partition import Partition
from gradtx._core.protocol import Params, State
from gradtx._layouts.packed import join_path
from gradtx._paths.paths import leaves
from gradtx._schedules.base import Schedule
from gradtx._schedules.stateful import StatefulSchedule, WrappedSchedule
from gradtx._state.state_dict import (
    LoadReport,
    StateMismatchError,
    load_state_dict,
    state_dict,
)
from gradtx._state.stats import statistics_in

# optax's per-transformation states that from_optax reads, by type name: which fields hold
# a tree shaped like the params (`{optax field: gradtx slot}`, one entry per path), which hold
# a global step count that gradtx keeps per path (`{optax field: gradtx slot}`), and which
# fields the math never reads (dropped: lion's count only advances). A field named in none of
# the three (a newer optax's addition) is refused rather than lost.
_RULES: dict[str, tuple[dict[str, str], dict[str, str], tuple[str, ...]]] = {
    "ScaleByAdamState": ({"mu": "mu", "nu": "nu"}, {"count": "count"}, ()),
    "TraceState": ({"trace": "trace"}, {}, ()),
    "ScaleByLionState": ({"mu": "mu"}, {}, ("count",)),
    "ScaleByScheduleState": ({}, {"count": "schedule_count"}, ()),
}
_STATELESS = ("EmptyState", "MaskedNode")
_SHOWN = 8  # keys named in a message before "..."


def _fields(x: Any) -> tuple[str, ...] | None:
    """The fields of a NamedTuple, or None for anything else."""
    fields = getattr(type(x), "_fields", None)
    return fields if isinstance(x, tuple) and isinstance(fields, tuple) else None


def _is_chain_state(x: Any) -> bool:
    """An optax chain's state: a plain tuple of its steps' states."""
    return isinstance(x, tuple) and _fields(x) is None


def _describe(x: Any) -> str:
    if _is_chain_state(x):
        return f"a tuple of {len(x)} states ({', '.join(_describe(s) for s in x)})"
    return type(x).__name__


def _name(tx: Any) -> str:
    return str(getattr(tx, "name", type(tx).__name__))


def _steps(n: int) -> str:
    return f"{n} step" + ("" if n == 1 else "s")


def _has_arrays(x: Any) -> bool:
    return bool(jax.tree_util.tree_leaves(x))


def _shown(keys: list[str] | tuple[str, ...]) -> str:
    keys = list(keys)
    if not keys:
        return "none"
    return ", ".join(keys[:_SHOWN]) + (f", ... ({len(keys)} in all)" if len(keys) > _SHOWN else "")


@dataclasses.dataclass
class _Walk:
    """The flat entries gathered so far, against the template's keys."""

    template: dict[str, Any]
    flat: dict[str, Any] = dataclasses.field(default_factory=dict)
    # (optax position and type, the gradtx-style keys it would fill): optax data with no place.
    unplaced: list[tuple[str, list[str]]] = dataclasses.field(default_factory=list)

    def under(self, prefix: str) -> list[str]:
        """The template keys in the namespace `prefix` that have no value yet."""
        start = f"{prefix}/" if prefix else ""
        return [k for k in self.template if k.startswith(start) and k not in self.flat]

    def put(self, key: str, value: Any, where: str) -> None:
        if key in self.flat:
            raise ValueError(
                f"from_optax: two parts of optax's state give a value for the gradtx key "
                f"{key!r} (the second at {where}); the optax and gradtx transformations differ."
            )
        self.flat[key] = value

    def offer(self, key: str, value: Any, where: str, unplaced: list[str]) -> None:
        """`put` where the template has `key`; else keep it under `key`, listed in `unplaced`."""
        if key in self.template:
            self.put(key, value, where)
        else:
            unplaced.append(key)
            self.flat[key] = value

    def put_count(self, key: str, value: Any, where: str) -> None:
        """`put` a step count, in gradtx's dtype where the template has `key`."""
        value = jnp.asarray(value)
        if key in self.template:  # both count steps in an integer: take gradtx's dtype
            value = value.astype(jnp.result_type(self.template[key]))
        self.put(key, value, where)

    def mismatch(self, where: str, ostate: Any, prefix: str, expected: str) -> ValueError:
        return ValueError(
            f"from_optax: optax's state at {where} ({_describe(ostate)}) does not match "
            f"{expected}. gradtx keys left without a value: {_shown(self.under(prefix))}. "
            "Build the gradtx transformation with the same steps, in the same order, as the "
            "optax one."
        )


def _unmask(ostate: Any, where: str) -> tuple[Any, str]:
    """Look through optax's `MaskedState` wrappers (their masked-out leaves hold no arrays)."""
    while type(ostate).__name__ == "MaskedState" and _fields(ostate) == ("inner_state",):
        ostate, where = ostate.inner_state, f"{where}.inner_state"
    return ostate, where


def _match(walk: _Walk, tx: Any, ostate: Any, prefix: str, where: str) -> None:
    """Pair optax's state `ostate` (at `where`) with `tx`'s state (under the keys `prefix/`)."""
    ostate, where = _unmask(ostate, where)
    if isinstance(tx, Chain) and not tx.flat:
        _match_chain(walk, tx, ostate, prefix, where)
    elif isinstance(tx, Partition):
        _match_partition(walk, tx, ostate, prefix, where)
    elif isinstance(tx, InjectHyperparams):
        _match_inject(walk, tx, ostate, prefix, where)
    else:  # one transformation, or an optimizer's flat chain: one namespace of slots
        _pool(walk, tx, ostate, prefix, where)


def _match_chain(walk: _Walk, tx: Chain, ostate: Any, prefix: str, where: str) -> None:
    steps = ostate if _is_chain_state(ostate) else (ostate,)
    if len(steps) != len(tx.transforms):
        raise walk.mismatch(
            where,
            ostate,
            prefix,
            f"gradtx's {tx.label} of {_steps(len(tx.transforms))} {list(tx.names)}",
        )
    for i, (name, child) in enumerate(zip(tx.names, tx.transforms)):
        _match(walk, child, steps[i], join_path(prefix, name), f"{where}[{i}]")


def _match_partition(walk: _Walk, tx: Partition, ostate: Any, prefix: str, where: str) -> None:
    inner = getattr(ostate, "inner_states", None) if _fields(ostate) else None
    labels = list(tx.transforms)
    if not isinstance(inner, Mapping) or set(inner) != set(labels):
        found = f" with the labels {list(inner)}" if isinstance(inner, Mapping) else ""
        raise walk.mismatch(
            where,
            ostate,
            prefix,
            f"gradtx's {tx.label} with the labels {labels} (optax's multi_transform state "
            f"has one inner state per label{found})",
        )
    for label, child in tx.transforms.items():
        here = f"{where}.inner_states[{label!r}]"
        _match(walk, child, inner[label], join_path(prefix, str(label)), here)


def _match_inject(walk: _Walk, tx: InjectHyperparams, ostate: Any, prefix: str, where: str) -> None:
    fields = _fields(ostate) or ()
    if not {"count", "hyperparams", "inner_state"} <= set(fields):
        raise walk.mismatch(where, ostate, prefix, f"gradtx's inject_hyperparams({tx.label})")
    walk.put_count(join_path(prefix, "count"), ostate.count, f"{where}.count")
    schedule_states = getattr(ostate, "hyperparams_states", {})
    if _has_arrays(schedule_states):
        for name, own in schedule_states.items():
            _match_schedule_state(walk, tx, ostate, name, own, prefix, where)
    names: list[str] = []
    for name, value in ostate.hyperparams.items():
        key = join_path(prefix, f"hyperparams/{name}")
        own = walk.template.get(key, value)
        walk.offer(key, _hyperparameter(value, own), f"{where}.hyperparams", names)
    if names:
        walk.unplaced.append((f"{where}.hyperparams ({_describe(ostate)})", names))
    # The inner transformation as built at step 0: its structure is all the walk needs.
    inner = tx.build(tx._values(jnp.zeros((), jnp.int32), None))
    _match(walk, inner, ostate.inner_state, join_path(prefix, "inner"), f"{where}.inner_state")


def _is_wrapped_schedule_state(x: Any) -> bool:
    """True for the state optax keeps for a schedule of the step: its own count."""
    return type(x).__name__ == "WrappedScheduleState" and _fields(x) == ("count",)


def _match_schedule_state(
    walk: _Walk, tx: InjectHyperparams, ostate: Any, name: str, own: Any, prefix: str, where: str
) -> None:
    """Carry over the state optax keeps for the schedule of the hyperparameter `name`.

    optax's `inject_hyperparams` wraps a schedule of the step in a `WrappedSchedule`, whose
    state is its own count, advanced with the injected count. A gradtx schedule of the step
    reads the injected count itself, so the count carries it over (once checked equal); a
    gradtx `WrappedSchedule` keeps its count under `schedule_states/<name>`.
    """
    here = f"{where}.hyperparams_states[{name!r}]"
    schedule = tx.hparams.get(name)
    if _is_wrapped_schedule_state(own) and isinstance(schedule, Schedule):
        if isinstance(own.count, Tracer) or isinstance(ostate.count, Tracer):
            return  # traced (from_optax inside jit): not comparable here
        counts = np.asarray(own.count), np.asarray(ostate.count)
        if not np.array_equal(*counts):
            raise ValueError(
                f"from_optax: optax's schedule for {name!r} has taken {int(counts[0])} steps "
                f"({here}) but the injected count is {int(counts[1])}; gradtx's schedule "
                f"of the step reads the injected count. Use "
                "`gradtx.schedules.WrappedSchedule(schedule)` for a schedule that keeps a "
                "count of its own."
            )
        return
    if _is_wrapped_schedule_state(own) and isinstance(schedule, WrappedSchedule):
        walk.put_count(join_path(prefix, f"schedule_states/{name}"), own.count, here)
        return
    kind = "a number" if schedule is not None else "no such hyperparameter"
    if isinstance(schedule, (Schedule, StatefulSchedule)):
        kind = f"a {type(schedule).__name__}"
    raise ValueError(
        f"from_optax: optax's state at {here} ({_describe(own)}) is the state of a schedule; "
        f"gradtx's inject_hyperparams({tx.label}) has {kind} as {name!r}. A schedule of the "
        "step (optax's WrappedScheduleState) is carried over to a gradtx schedule or "
        "`WrappedSchedule`; the state of another stateful schedule is laid out as it "
        "chooses: load it by hand into gradtx's `schedule_states/<name>` keys "
        "(gradtx.load_state_dict)."
    )


def _hyperparameter(value: Any, own: Any) -> Any:
    """The value optax stored, in gradtx's dtype; gradtx's own where optax's is its rounding.

    optax stores injected hyperparameters in the params' dtype, so a bfloat16 model's
    `b2=0.999` is kept as 1.0 there; gradtx keeps float32 and should not inherit the rounding.
    """
    value, own = jnp.asarray(value), jnp.asarray(own)
    if value.dtype == own.dtype:
        return value
    return jnp.where(own.astype(value.dtype) == value, own, value.astype(own.dtype))


def _pool(
    walk: _Walk, tx: Any, ostate: Any, prefix: str, where: str, *, inner: bool = False
) -> None:
    """Place each optax per-transformation state of `ostate` in the one namespace `prefix`.

    `ostate` is one step's state or an optax optimizer's chain of them (`inner` for its
    steps): the steps of one optimizer share one namespace of slots in gradtx.
    """
    ostate, where = _unmask(ostate, where)
    if ostate is None or type(ostate).__name__ in _STATELESS:
        return
    if _is_chain_state(ostate):
        if inner:  # a chain of chains: clipping chained before adamw is not adamw alone
            raise walk.mismatch(
                where,
                ostate,
                prefix,
                f"gradtx's {_name(tx)}, one optimizer (optax has a chain inside a chain here)",
            )
        for i, step in enumerate(ostate):
            _pool(walk, tx, step, prefix, f"{where}[{i}]", inner=True)
        return
    kind = type(ostate).__name__
    if kind not in _RULES:
        if not _has_arrays(ostate):
            return  # holds nothing to carry over (a stateless step's own empty state)
        covered = ", ".join(sorted(_RULES))
        raise ValueError(
            f"from_optax: optax's state at {where} ({kind}) is not supported (the per-step "
            f"states read are {covered}, and chains (tuples), MaskedState, EmptyState, "
            "inject_hyperparams and multi_transform states). gradtx keys left without a "
            f"value: {_shown(walk.under(prefix))}."
        )
    per_path, counts, dropped = _RULES[kind]
    unknown = [f for f in _fields(ostate) or () if f not in {*per_path, *counts, *dropped}]
    if unknown:
        raise ValueError(
            f"from_optax: optax's state at {where} ({kind}) has the fields {unknown}, which "
            "from_optax does not know; this optax version's state is not supported."
        )
    unplaced: list[str] = []
    for field, slot in per_path.items():
        for path, value in leaves(getattr(ostate, field)).items():
            if value is None:
                continue
            walk.offer(join_path(prefix, f"{slot}/{path}"), value, f"{where}.{field}", unplaced)
    for field, slot in counts.items():
        count = jnp.asarray(getattr(ostate, field))
        keys = walk.under(join_path(prefix, slot))
        for key in keys:
            walk.put_count(key, count, f"{where}.{field}")
        if not keys:
            key = join_path(prefix, slot)
            unplaced.append(key)
            walk.flat[key] = count
    if unplaced:
        walk.unplaced.append((f"{where} ({kind})", unplaced))


def from_optax(
    opt_state: State, tx: Any, params: Params, *, strict: bool = True
) -> tuple[Any, LoadReport]:
    """Carry an optax optimizer's state over to the equivalent gradtx transformation.

    For switching libraries mid-training from an optax checkpoint: build the gradtx
    transformation that matches the optax one, then convert the state. optax's positional
    state is matched step by step with `tx`'s state, its moments are placed by parameter path
    (`mu/<path>`, `nu/<path>`, `trace/<path>`), its global step counts become one count per
    path, injected hyperparameters are matched by name, and the result is loaded with
    `gradtx.load_state_dict`. Continuing with gradtx then gives the same steps optax would
    have taken.

    Covered (the optax state on the left, the gradtx transformation on the right):

    - `optax.adam`, `optax.adamw` (`mask=` too): `gradtx.adam`, `gradtx.adamw`.
    - `optax.sgd`, with or without (Nesterov) momentum: `gradtx.sgd`.
    - `optax.lion`: `gradtx.lion` (optax's lion step count, which its math never reads, is
      dropped).
    - a schedule as the learning rate: the count of `scale_by_schedule` becomes
      `schedule_count/<path>`.
    - `optax.chain(...)`: `gradtx.chain(...)` with the same steps in the same order, for
      example `chain(clip_by_global_norm(c), adamw(...))` in both. gradtx's statistics
      (such as the last `global_norm` of `clip_by_global_norm`), which optax does not keep,
      start from their `init` values.
    - `optax.multi_transform` (its `MaskedState` groups included): `gradtx.partition` with
      the same labels.
    - `optax.inject_hyperparams(f)(...)`: `gradtx.inject_hyperparams(g)(...)`, its step count
      and hyperparameters carried over by name. optax stores them in the params' dtype;
      where its value is gradtx's own float32 value rounded to that dtype (a bfloat16
      model's `b2=0.999` stored as 1.0), gradtx keeps its own value. A schedule of the step
      (`learning_rate=optax.linear_schedule(...)`, whose state optax keeps as a
      `WrappedScheduleState`) goes to a gradtx schedule (`gradtx.schedules.linear(...)`),
      which reads the injected count, or to a `gradtx.schedules.WrappedSchedule`, which
      keeps the count under `schedule_states/<name>`. The state of another stateful
      schedule is refused: it is laid out as each schedule chooses.

    Everything else raises: another optax state type (its position and type are named), or
    a gradtx transformation whose structure differs from the optax one (another number of
    chain steps, other partition labels: the gradtx keys left without a value are named).
    Stateless optax steps (`EmptyState`) carry nothing, so which stateless steps each side
    has (clipping, weight decay, a constant learning rate) is not checked: give `tx` the same
    hyperparameters as the optax optimizer.

    Args:
        opt_state: the optax optimizer's state (from `optimizer.init` and `update`, or a
            checkpoint of it).
        tx: the gradtx transformation to continue with.
        params: the params (arrays or `jax.ShapeDtypeStruct` leaves), as given to optax.
        strict: raise `gradtx.StateMismatchError` when a gradtx key gets no value from optax,
            a value from optax has no place in `tx`'s state, or a shape or dtype differs (a
            moment kept in another dtype, say). With `strict=False` such keys are initialised
            by `tx.init(params)`, the values without a place are dropped, and the report
            lists both. A structure that cannot be matched at all raises either way.

    Returns:
        `(state, report)`: `tx`'s state, and the `LoadReport` of `load_state_dict`: the keys
        initialised anew (`missing`), the optax values dropped, under the key they would have
        (`unexpected`), and the keys whose shape or dtype differed (`mismatched`).

    Raises:
        ValueError: the structures cannot be paired; the message names optax's state type
            and position and the gradtx keys left without a value.
        gradtx.StateMismatchError: with `strict=True`, the report is not clean; the message
            names the optax parts that found no place.

    Examples:
        >>> import optax
        >>> params = {"w": jnp.ones(2)}
        >>> grads = {"w": jnp.array([0.5, -1.0])}
        >>> opt = optax.sgd(0.1, momentum=0.9)
        >>> opt_state = opt.init(params)
        >>> for _ in range(2):
        ...     _, opt_state = opt.update(grads, opt_state)
        >>> tx = gradtx.sgd(0.1, momentum=0.9)
        >>> state, report = gradtx.from_optax(opt_state, tx, params)
        >>> report.clean
        True
        >>> gradtx.state_dict(state)
        {'trace/w': Array([ 0.95, -1.9 ], dtype=float32)}

        A transformation whose state does not match is refused, naming what is left over:

        >>> try:
        ...     gradtx.from_optax(opt_state, gradtx.adam(0.1), params)
        ... except gradtx.StateMismatchError as error:
        ...     print(error.report)
        missing (3): count/w, mu/w, nu/w
        unexpected (1): trace/w
    """
    template_state = tx.init(params)
    walk = _Walk(state_dict(template_state))
    _match(walk, tx, opt_state, "", "opt_state")
    # Statistics are readings of the last step, which optax does not keep: they start anew.
    for key in statistics_in(template_state):
        walk.flat.setdefault(key, walk.template[key])
    state, report = load_state_dict(tx, params, walk.flat, strict=False)
    if strict and not report.clean:
        intro = (
            f"from_optax: optax's state does not fit the state of gradtx's {_name(tx)} "
            "(missing: the gradtx keys left without a value; unexpected: optax's values with "
            "no place, under the key each would have)"
        )
        placed = "".join(f"\n  {where}: {_shown(keys)}" for where, keys in walk.unplaced)
        hint = (
            (f"optax's values with no place in it, by position:{placed}\n" if placed else "")
            + "Build the gradtx transformation that matches the optax one (same steps, labels "
            "and dtypes), or pass strict=False to initialise the missing keys and drop the "
            "rest (the report lists them)."
        )
        raise StateMismatchError(report, intro=intro, hint=hint)
    return state, report
