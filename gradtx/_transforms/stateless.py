"""Transformations without state made from a function: `stateless`, `stateless_with_tree_map`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from gradtx._core.lift import check_state_keys
from gradtx._core.module import field
from gradtx._core.per_array import PerArrayTransform
from gradtx._core.protocol import Params, Transformation, Updates
from gradtx._layouts.packed import reject_packed
from gradtx._paths.paths import flatten
from gradtx._paths.subset import present_paths


def _check_function(f: Any, name: str) -> None:
    if not callable(f):
        raise TypeError(f"{name}: `f` must be a function, got {type(f).__name__}: {f!r}")


def _described(name: str, params: Params) -> dict[str, list[tuple[str, dict]]]:
    """One step without hyperparameters on every present path (`f` is not called)."""
    return {path: [(name, {})] for path in present_paths(params)}


class Stateless(Transformation):
    """`f(updates, params) -> updates` as a transformation (see `stateless`)."""

    name: ClassVar[str] = "stateless"
    # A plain function is static structure; a callable pytree (`jax.tree_util.Partial`, a
    # gradtx schedule-like module) keeps its numbers as leaves.
    f: Any = field()

    def __check__(self) -> None:
        _check_function(self.f, "stateless")

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """`stateless` on every present path."""
        return _described(self.name, params)

    def init_state(self, params: Params) -> dict:
        """No state (`{}`); packed params are refused, since `f` sees the whole tree."""
        reject_packed(params, self.name, "passes the whole updates tree to `f`")
        return {}

    def step(
        self, updates: Updates, state: dict, params: Params = None, **extra: Any
    ) -> tuple[Any, dict]:
        """`f(updates, params)`; its result must have the paths of `updates`."""
        check_state_keys(self.name, state, ())
        reject_packed(updates, self.name, "passes the whole updates tree to `f`")
        out = self.f(updates, params)
        got, want = flatten(out)[0], flatten(updates)[0]
        if set(got) != set(want):
            lost = [p for p in want if p not in set(got)]
            detail = (
                f"path {lost[0]!r} is missing"
                if lost
                else f"it has the extra path {[p for p in got if p not in set(want)][0]!r}"
            )
            raise ValueError(
                f"stateless: `f` must return a tree with the paths of the updates, but {detail} "
                f"(updates: {list(want)[:6]}; result: {list(got)[:6]})."
            )
        return out, state


def stateless(f: Callable[[Any, Any], Any]) -> Stateless:
    r"""A transformation without state from a function of the whole tree: $u = f(g, \theta)$.

    `update(updates, state, params)` returns `f(updates, params)` (`params` may be `None`)
    and the empty state `{}`. `f` sees the tree as it is, `None` leaves included: the
    functions of `gradtx.tree` match leaves by path and keep `None`, so they make such an `f`
    in a line. The result must have the paths of `updates`.

    `f` is structure: a plain function is static (pass the same object to reuse a compiled
    step), while a callable pytree such as `jax.tree_util.Partial(fn, learning_rate)` keeps
    its arguments as leaves, so a new value neither recompiles nor stops `jax.vmap` from
    sweeping it. Packed params (`gradtx.pack`) are refused; `stateless_with_tree_map` runs
    on them.

    Args:
        f: `f(updates, params) -> updates`.

    State:
        None: `{}`.

    Examples:
        >>> tx = gradtx.stateless(lambda g, p: gradtx.tree.scale(-0.1, g))
        >>> u, state = tx.update({"w": jnp.array([1.0, 2.0]), "b": None}, tx.init({}))
        >>> u, state
        ({'b': None, 'w': Array([-0.1, -0.2], dtype=float32)}, {})
    """
    return Stateless(f)


class StatelessWithTreeMap(PerArrayTransform):
    """`f(g, param) -> u` on every present path (see `stateless_with_tree_map`)."""

    name: ClassVar[str] = "stateless_with_tree_map"
    # Each leaf in its own shape: on packed params `f` is called per parameter, not per buffer.
    per_leaf_structure: ClassVar[bool] = True
    f: Any = field()

    def __check__(self) -> None:
        _check_function(self.f, "stateless_with_tree_map")

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """`stateless_with_tree_map` on every present path."""
        return _described(self.name, params)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = f(g, param)`, with `param` None when the params were not given."""
        return self.f(g, param), {}


def stateless_with_tree_map(f: Callable[[Any, Any], Any]) -> StatelessWithTreeMap:
    r"""A transformation without state from a function of one array: $u_p = f(g_p, \theta_p)$.

    `f(g, param)` is called for every path `p` present in the updates with that path's
    gradient and parameter (`None` when `update` gets no params); a `None` gradient leaf
    stays `None` and `f` is not called for it. Updates and params are matched by path, so
    their containers may differ; on packed params `f` still sees each parameter in its own
    shape. As in `stateless`, a plain `f` is static and a callable pytree
    (`jax.tree_util.Partial`) keeps its arguments as leaves.

    Args:
        f: `f(g, param) -> u`, for one array (`param` may be `None`).

    State:
        None: `{}`.

    Examples:
        >>> tx = gradtx.stateless_with_tree_map(lambda g, p: g + 0.5 * p)
        >>> params = {"w": jnp.array([2.0, 4.0]), "b": jnp.zeros(1)}
        >>> u, _ = tx.update({"w": jnp.ones(2), "b": None}, tx.init(params), params)
        >>> u
        {'b': None, 'w': Array([2., 3.], dtype=float32)}
    """
    return StatelessWithTreeMap(f)
