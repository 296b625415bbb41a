"""Chaining transformations, their states keyed by name."""

from __future__ import annotations

from typing import Any, cast

import jax
import jax.numpy as jnp

from gradtx._combinators.wrapper import Labelled
from gradtx._core.module import static
from gradtx._core.protocol import Params, State, Transformation, Updates, merge_descriptions
from gradtx._core.widening import Widening, is_narrow, widening
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.paths import flatten, is_unit


class ChainState(dict):
    """A chain's state: a dict keyed by name, `{child name: child state}`.

    It is a plain `dict` in every way but one: a key it lacks, a position above all
    (`state[0]`, how an optax chain's tuple is read), raises a `KeyError` that lists its
    names. As a pytree it is keyed like a dict, so `state_dict` keys, key paths and leaf
    order are a dict's; its keys stay in the chain's order. (A flat chain, the optimizers
    such as `adamw`, keeps its children's merged states in a plain dict, `{"mu": ...}`.)

    Examples:
        >>> state = gradtx.chain(gradtx.clip(1.0), gradtx.adam(0.1)).init({"w": jnp.ones(2)})
        >>> list(state)
        ['clip', 'adam']
        >>> state[1]
        Traceback (most recent call last):
        ...
        KeyError: "the state of a chain is keyed by name, not by position: ... state['adam'])."
    """

    __slots__ = ()

    def __missing__(self, key: Any) -> Any:
        names = list(self)
        shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
        if isinstance(key, int) and not isinstance(key, bool) and -len(names) <= key < len(names):
            raise KeyError(
                "the state of a chain is keyed by name, not by position: its keys, in order, "
                f"are {shown} (read one as state[{names[key]!r}])."
            )
        example = f" (read one as state[{names[-1]!r}])" if names else ""
        raise KeyError(
            f"the state of a chain is keyed by name and has no key {key!r}: its keys are "
            f"{shown or 'none'}{example}."
        )


def _flatten_chain_state(state: ChainState) -> tuple[list, tuple]:
    keys = sorted(state)  # a dict's order, so the leaves and key paths are a dict's
    return [(jax.tree_util.DictKey(k), state[k]) for k in keys], tuple(state)


def _unflatten_chain_state(names: tuple, children: Any) -> ChainState:
    by_name = dict(zip(sorted(names), children))
    return ChainState((name, by_name[name]) for name in names)


jax.tree_util.register_pytree_with_keys(
    ChainState,
    _flatten_chain_state,
    _unflatten_chain_state,
    lambda state: ([state[k] for k in sorted(state)], tuple(state)),
)


def _default_names(transforms: tuple[Transformation, ...]) -> tuple[str, ...]:
    counts: dict[str, int] = {}
    names = []
    for tx in transforms:
        counts[tx.name] = counts.get(tx.name, 0) + 1
        names.append(tx.name if counts[tx.name] == 1 else f"{tx.name}_{counts[tx.name]}")
    return tuple(names)


class Chain(Labelled, Transformation):
    """Transformations applied in sequence; each child's state is keyed by its name.

    With `flat=True` (how optimizers such as `adamw` are built) the children's states are
    merged into one namespace, so `state_dict` keys read `adamw/mu/<path>` rather than
    `adamw/scale_by_adam/mu/<path>`; the children's state keys must then be distinct.
    """

    transforms: tuple[Transformation, ...] = ()
    names: tuple[str, ...] = static(())
    label: str = static("chain")
    flat: bool = static(False)

    def __check__(self) -> None:
        if len(set(self.names)) != len(self.names):
            dupes = sorted({n for n in self.names if self.names.count(n) > 1})
            raise ValueError(f"{self.label}: the names {dupes} are used more than once.")
        if self.flat:
            seen: dict[str, str] = {}
            for name, tx in zip(self.names, self.transforms):
                keys = getattr(tx, "state_keys", None)
                if keys is None:
                    raise TypeError(
                        f"{self.label}: a flat chain needs {name} to declare state_keys"
                    )
                for key in keys():
                    if key in seen:
                        raise ValueError(
                            f"{self.label}: {seen[key]} and {name} both keep state {key!r}."
                        )
                    seen[key] = name

    def state_keys(self) -> tuple[str, ...]:
        """The keys of this chain's state."""
        if self.flat:
            return tuple(k for tx in self.transforms for k in cast(Any, tx).state_keys())
        return self.names

    def _child_state(self, state: State, name: str, tx: Transformation) -> Any:
        if not isinstance(state, dict):
            raise TypeError(
                f"{self.label}: expected the state made by this chain's init (a dict with keys "
                f"{list(self.state_keys())}), got {type(state).__name__}."
            )
        # a flat chain holds only children that name their state keys
        keys = cast(Any, tx).state_keys() if self.flat else (name,)
        missing = [k for k in keys if k not in state]
        if missing:
            raise KeyError(
                f"{self.label}: the state has no {missing[0]!r} entry (it has {list(state)}); "
                "was it made by another transformation's init?"
            )
        return {k: state[k] for k in keys} if self.flat else state[name]

    def _put(self, state: dict, name: str, child: Any) -> None:
        """Store a child's state: merged into `state` if the chain is flat, else under `name`."""
        if self.flat:
            state.update(child)
        else:
            state[name] = child

    def init_state(self, params: Params) -> dict:
        """`{name: child.init(params)}` (a `ChainState`), or the children's merged states if `flat`.

        A flat chain's state is a plain dict, as its stateful step's own state is.
        """
        state: dict = {} if self.flat else ChainState()
        for name, tx in zip(self.names, self.transforms):
            self._put(state, name, tx.init_state(params))
        return state

    def frozen_paths(self, params: Params) -> frozenset[str]:
        """The last child's frozen paths (a later child could add to a frozen update)."""
        return self.transforms[-1].frozen_paths(params) if self.transforms else frozenset()

    def eval_params(self, state: State, params: Params) -> Any:
        """Each child's eval weights, in order, each child given the previous one's."""
        for name, tx in zip(self.names, self.transforms):
            params = tx.eval_params(self._child_state(state, name, tx), params)
        return params

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """The children's steps, in order, for each path."""
        return merge_descriptions(*(tx.describe(params, step) for tx in self.transforms))

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Run each child's update in order, passing `params` and `**extra` along.

        Updates narrower than float32 (bfloat16, float16) travel between the children in
        float32 and are rounded once, at the end, to the promoted dtype of the gradient and
        the state the children read for that path.
        """
        # a new dict of the same kind: the state keeps its structure from step to step
        new_state = type(state)(state) if isinstance(state, dict) else state
        given = updates
        with widening() as block:
            if len(self.transforms) > 1:  # see gradtx/_core/widening.py
                updates = jax.tree.map(block.widen, updates)
            for name, tx in zip(self.names, self.transforms):
                child = self._child_state(state, name, tx)
                updates, child = tx.step(updates, child, params, **extra)
                self._put(new_state, name, child)
            if updates is not given:
                updates = _narrowed_back(updates, given, block)
        return updates, new_state


def _narrowed_back(updates: Updates, given: Any, block: Widening) -> Any:
    """`updates`, each leaf that was narrow in `given` rounded once.

    It is rounded to the promoted dtype of its gradient and the state read for its path: its
    own dtype when that state is narrow too, or none was read.
    """
    paths, leaves, treedef = flatten(updates)
    g_paths, before, before_def = flatten(given)
    if treedef != before_def or paths != g_paths:  # a child changed the structure
        return updates
    out = []
    for path, u, g in zip(paths, leaves, before):
        if is_unit(g) and is_unit(u):
            buffers = tuple(
                _rounded(ub, gb, block.update_dtype((path, i), gb))
                for i, (ub, gb) in enumerate(zip(u.buffers, g.buffers))
            )
            out.append(u.replace(buffers))
        else:
            out.append(_rounded(u, g, None if g is None else block.update_dtype(path, g)))
    return treedef.unflatten(out)


def _rounded(u: Any, g: Any, dtype: Any) -> Any:
    """`u` rounded to `dtype` when its gradient `g` was narrow and the chain widened it."""
    if is_narrow(g) and getattr(u, "dtype", None) == jnp.float32 and dtype != u.dtype:
        return u.astype(dtype)
    return u


def chain(*transforms: Any) -> Chain:
    """Apply transformations in sequence, each child's state keyed by a readable name.

    Names are the transformations' names (`clip_by_global_norm`, `adamw`, ...) with a suffix
    on repeats (`scale`, `scale_2`). optax transformations are accepted and wrapped.

    Updates narrower than float32 (bfloat16, float16) pass between the transformations in
    float32 and come out rounded to their own dtype once, so a chain rounds like one
    transformation, not once per step.

    Args:
        *transforms: the transformations, applied first to last.

    Returns:
        A `Chain` whose state is `{name: state_of_that_child}` (a `ChainState`: a dict that
        says so when read by position, `state[0]`).

    Examples:
        >>> tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(1e-3))
        >>> list(tx.init({"w": jnp.zeros(2)}))
        ['clip_by_global_norm', 'adam']
    """
    txs = tuple(as_transformation(t, f"chain argument {i}") for i, t in enumerate(transforms))
    return Chain(txs, _default_names(txs))


def named_chain(*named: tuple[str, Any]) -> Chain:
    """Apply transformations in sequence, each child's state keyed by the name given.

    Args:
        *named: `(name, transformation)` pairs, applied first to last.

    Examples:
        >>> tx = gradtx.named_chain(("clip", gradtx.clip(1.0)), ("opt", gradtx.sgd(0.1)))
        >>> list(tx.init({"w": jnp.zeros(2)}))
        ['clip', 'opt']
    """
    for i, pair in enumerate(named):
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise TypeError(
                f"named_chain: argument {i} must be a (name, transformation) pair, got {pair!r}"
            )
    txs = tuple(as_transformation(t, f"named_chain[{n!r}]") for n, t in named)
    return Chain(txs, tuple(n for n, _ in named))


def optimizer(label: str, *transforms: Transformation) -> Chain:
    """A named optimizer: a chain whose children's states share one namespace."""
    return Chain(tuple(transforms), tuple(t.name for t in transforms), label, flat=True)
