"""The state of a wrapped optax transformation, keyed by name instead of by position.

optax keeps the states of a chain in a tuple, so `state_dict` would read `chain/0/mu/w` for
Adam's first moment. A wrapped transformation's state (`ForeignTransform` in
`gradtx/_optax/wrapped.py`) keeps every such tuple as `NamedStates` instead: the same states,
in the same order, each under a name (`chain/scale_by_adam/mu/w`). A name is, first found:

1. the transformation that made the entry, when it can be read: the `.name` of a gradtx
   transformation, else the optax factory named by the `__qualname__` of its `update` or
   `init` closure (`scale_by_adam.<locals>.init_fn` gives `scale_by_adam`); optax's `chain`
   keeps its children's closures, so the entries of a chain are named this way;
2. the entry's state type (`ScaleByAdamState` gives `scale_by_adam`, `TraceState` `trace`),
   for tuples whose makers cannot be read (the inner state of `optax.inject_hyperparams`)
   when every entry is a state type of optax's own (or a chain of them);
3. the entry's position, as before.

Any other tuple is kept as it is: optax's moments mirror the params, and where the params
hold a tuple its positions are the params' paths (`mu/0/w`), so they must stay.

A name used twice gets a suffix (`trace`, `trace_2`). NamedTuple fields already have names in
JAX key paths (`mu`, `nu`), and dicts their keys, so they stay as they are. The wrapped
transformation gets its tuples back (`plain`) before each call to optax.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gradtx._core.protocol import State

# `(init, update)` of a transformation, when known.
Maker = tuple[Any, Any]

# Functions whose qualname names no factory: optax's shared init of stateless transformations.
_ANONYMOUS = frozenset({"init_empty_state"})


class NamedStates:
    """A tuple of states (optax's `chain` state) whose entries have names.

    It behaves like the tuple it stands for (`len`, iteration, `states[0]`) and also takes a
    name (`states["scale_by_adam"]`). As a pytree its children are the states, in order, under
    `DictKey(name)`, so `state_dict` shows the names where the tuple showed positions.

    Attributes:
        names: one distinct name per entry.
        states: the entries, in the order of the tuple.

    Examples:
        >>> import optax
        >>> tx = gradtx.chain(optax.adam(1e-3))
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> state["chain"].names
        ('scale_by_adam', 'scale')
        >>> state["chain"]["scale_by_adam"].mu["w"] is state["chain"][0].mu["w"]
        True
    """

    __slots__ = ("names", "states")

    def __init__(self, names: tuple[str, ...], states: tuple) -> None:
        if len(names) != len(states) or len(set(names)) != len(names):
            raise ValueError(
                f"NamedStates: need one distinct name per state, got names {names!r} for "
                f"{len(states)} states."
            )
        self.names = tuple(names)
        self.states = tuple(states)

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            try:
                return self.states[self.names.index(key)]
            except ValueError:
                raise KeyError(
                    f"NamedStates: no state named {key!r}; the names are {list(self.names)}."
                ) from None
        return self.states[key]

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.states)

    # Without a `__hash__` of its own it is unhashable, as the states it holds.
    def __eq__(self, other: object) -> Any:
        if not isinstance(other, NamedStates):
            return NotImplemented
        return self.names == other.names and self.states == other.states

    def items(self) -> list[tuple[str, Any]]:
        """`(name, state)` pairs, in order."""
        return list(zip(self.names, self.states))

    def __repr__(self) -> str:
        inside = ", ".join(f"{name}={state!r}" for name, state in zip(self.names, self.states))
        return f"NamedStates({inside})"


jax.tree_util.register_pytree_with_keys(
    NamedStates,
    lambda node: (tuple((jax.tree_util.DictKey(n), s) for n, s in node.items()), node.names),
    lambda names, states: NamedStates(names, tuple(states)),
    lambda node: (node.states, node.names),
)


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _closure(fn: Any) -> dict[str, Any]:
    """`{name: value}` of the variables a Python closure captured (empty if none)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return {}
    out = {}
    for name, cell in zip(code.co_freevars, cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:  # a cell not yet filled
            continue
    return out


def _unwrapped(fn: Any) -> Any:
    """The update that optax's `with_extra_args_support` wraps, or `fn` itself."""
    if getattr(fn, "__qualname__", "") == "with_extra_args_support.<locals>.update":
        update = getattr(_closure(fn).get("tx"), "update", None)
        if callable(update):
            return update
    return fn


def factory_name(init: Any, update: Any) -> str | None:
    """The name of what made `(init, update)`, or `None` when nothing readable names it.

    A bound method of a gradtx transformation gives its `.name`; a closure made by a factory
    gives the factory's name (`scale_by_adam.<locals>.update_fn` gives `scale_by_adam`), and a
    method of a class the class's name. `update` is read first, since optax's stateless
    transformations share one `init` (`init_empty_state`). Lambdas name nothing.

    Examples:
        >>> import optax
        >>> tx = optax.scale_by_adam()
        >>> factory_name(tx.init, tx.update)
        'scale_by_adam'
    """
    for fn in (update, init):
        fn = _unwrapped(fn)
        owner = getattr(fn, "__self__", None)
        label = getattr(owner, "name", None)
        if isinstance(label, str) and label and callable(getattr(owner, "init", None)):
            return label
        qualname = getattr(fn, "__qualname__", None)
        if not isinstance(qualname, str) or "<lambda>" in qualname:
            continue
        head = qualname.split(".")[0]
        if head and head not in _ANONYMOUS:
            return head
    return None


def _chain_children(maker: Maker | None) -> tuple[Maker, ...] | None:
    """The `(init, update)` of each child of an `optax.chain`, or `None` for anything else."""
    if maker is None:
        return None
    init, update = maker
    module = getattr(init, "__module__", None) or ""
    if module.split(".")[0] != "optax":
        return None
    if getattr(init, "__qualname__", "") != "chain.<locals>.init_fn":
        return None
    inits, updates = _closure(init).get("init_fns"), _closure(update).get("update_fns")
    if not isinstance(inits, tuple) or not isinstance(updates, tuple):
        return None
    if len(inits) != len(updates):
        return None
    return tuple(zip(inits, updates))


def _is_state_type(x: Any) -> bool:
    """A state type: a NamedTuple named `*State` (`ScaleByAdamState`)."""
    return _is_namedtuple(x) and type(x).__name__.endswith("State")


def _is_optax_state(x: Any) -> bool:
    """A state type that optax defines (`optax.ScaleByAdamState`, `optax.EmptyState`)."""
    module = getattr(type(x), "__module__", None) or ""
    return _is_state_type(x) and module.split(".")[0] == "optax"


def _holds_states(entries: tuple) -> bool:
    """Whether a tuple is a chain's states rather than a tuple of the params' own.

    Only a non-empty tuple whose entries are all optax state types (or chains of them)
    counts: a moment that mirrors params held in a tuple keeps the params' positions, which
    are their paths, whatever the types of the params.
    """
    return bool(entries) and all(
        _is_optax_state(s) or isinstance(s, NamedStates) or (type(s) is tuple and _holds_states(s))
        for s in entries
    )


def _type_name(state: State) -> str | None:
    """`ScaleByAdamState` gives `scale_by_adam`: the name of a `*State` NamedTuple type."""
    if not _is_state_type(state):
        return None
    name = type(state).__name__
    if len(name) > len("State"):
        name = name[: -len("State")]
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()
    return snake or None


def _names(states: tuple, makers: tuple[Maker | None, ...]) -> tuple[str, ...]:
    names: list[str] = []
    for position, (state, maker) in enumerate(zip(states, makers)):
        made_by = factory_name(*maker) if maker is not None else None
        name = made_by or _type_name(state) or str(position)
        unique, repeat = name, 1
        while unique in names:
            repeat += 1
            unique = f"{name}_{repeat}"
        names.append(unique)
    return tuple(names)


def keyed(state: State, maker: Maker | None = None) -> State:
    """`state` with every plain tuple in it kept as `NamedStates` (see the module's text).

    Args:
        state: a state made by an optax-style transformation (or any pytree).
        maker: `(init, update)` of the transformation that made `state`, so that the entries
            of an `optax.chain` are named after their transformations; `None` when unknown.

    Returns:
        The same states and leaves (no copy), tuples replaced by `NamedStates`; NamedTuples,
        dicts and lists are rebuilt around their keyed entries; anything else is kept as it is.

    Examples:
        >>> import optax
        >>> tx = optax.chain(optax.trace(0.9), optax.trace(0.5))
        >>> keyed(tx.init({"w": jnp.zeros(1)}), (tx.init, tx.update)).names
        ('trace', 'trace_2')
    """
    if isinstance(state, NamedStates):
        return state
    if type(state) is tuple:
        makers: tuple[Maker | None, ...]
        children = _chain_children(maker)
        if children is not None and len(children) == len(state):
            makers = children
        elif _holds_states(state):
            makers = (None,) * len(state)
        else:  # a tuple of the params' own (optax's moments mirror the params): positions
            return tuple(keyed(s) for s in state)
        return NamedStates(_names(state, makers), tuple(keyed(s, m) for s, m in zip(state, makers)))
    return _rebuilt(state, keyed)


def plain(state: State) -> State:
    """`state` as the wrapped transformation made it: every `NamedStates` back to a tuple.

    Examples:
        >>> plain(NamedStates(("a", "b"), (1, (2,))))
        (1, (2,))
    """
    if isinstance(state, NamedStates) or type(state) is tuple:
        return tuple(plain(s) for s in state)
    return _rebuilt(state, plain)


def _rebuilt(state: State, fn: Any) -> State:
    """A NamedTuple, dict or list rebuilt around `fn` of each entry; anything else as it is."""
    if _is_namedtuple(state):
        return state._make(fn(s) for s in state)
    if type(state) in (dict, OrderedDict):
        return type(state)((k, fn(v)) for k, v in state.items())
    if type(state) is list:
        return [fn(s) for s in state]
    return state


def _injected(state: State) -> list[Mapping]:
    """The `hyperparams` of optax `inject_hyperparams` states at the top or in chain entries."""
    hyper = getattr(state, "hyperparams", None)
    if _is_namedtuple(state) and isinstance(hyper, Mapping):
        return [hyper]
    if type(state) is tuple or isinstance(state, NamedStates):
        return [h for entry in state for h in _injected(entry)]
    return []


def _scalar(value: Any) -> float | int | None:
    if jnp.issubdtype(getattr(value, "dtype", np.float32), jax.dtypes.prng_key):
        return None  # a typed PRNG key is no number
    array = np.asarray(value)
    if array.shape != () or not jnp.issubdtype(array.dtype, np.number):
        return None
    return float(array) if jnp.issubdtype(array.dtype, np.inexact) else int(array)


def injected_hyperparams(inner: Any, step: int = 0) -> dict[str, float | int]:
    """The scalar hyperparameters that optax `inject_hyperparams` inside `inner` use at `step`.

    Read from `inner`'s own state, made on an empty tree (no params are touched): the
    `hyperparams` of an `inject_hyperparams` state that is `inner`'s state or an entry of its
    chain (not one inside `optax.masked` or `multi_transform`, which would hold for some paths
    only). At `step > 0` the empty state first takes `step + 1` updates of the empty tree in
    one compiled loop, after which it holds the values used at `step` (schedules included).
    Best effort: anything that cannot be read gives `{}`, and a name found twice keeps its
    first value.

    Args:
        inner: an optax-style `(init, update)` transformation.
        step: the step whose values are read.

    Examples:
        >>> import optax
        >>> tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.5)
        >>> injected_hyperparams(tx)
        {'learning_rate': 0.5}
    """
    try:
        step = int(step)
        # optax computes with Python scalars and int counts: its own promotion rules.
        with jax.numpy_dtype_promotion("standard"):
            state = inner.init({})
            if not _injected(state):
                return {}
            if step > 0:  # after k updates an injected state holds the values of step k - 1

                def body(_: Any, s: Any) -> Any:
                    return inner.update({}, s, {})[1]

                state = jax.jit(lambda s: jax.lax.fori_loop(0, step + 1, body, s))(state)
            out: dict[str, float | int] = {}
            for hyper in _injected(state):
                for name, value in hyper.items():
                    shown = _scalar(value)
                    if shown is not None:
                        out.setdefault(name, shown)
            return out
    except Exception:  # a transformation that cannot run on an empty tree: nothing to show
        return {}
