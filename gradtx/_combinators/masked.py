"""`masked`: run a transformation on the paths a selector picks; other updates pass through."""

from __future__ import annotations

from typing import Any

from gradtx._combinators.wrapper import Labelled
from gradtx._core.module import static
from gradtx._core.protocol import Params, State, Transformation, Updates
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.paths import DuplicatePathError, flatten
from gradtx._paths.selectors import as_selector, select
from gradtx._paths.subset import any_present, merge_by_path, restrict


def masked_extra(
    extra: dict[str, Any], updates: Updates, chosen: frozenset[str], owner: str
) -> dict[str, Any]:
    """`extra` with each argument shaped like `updates` (the same paths) restricted to `chosen`.

    What optax's `mask_compatible_extra_args=True` does: a per-parameter extra argument of
    `update` reaches an inner transformation for its group's paths only, as the updates do.
    """
    mine = flatten(updates)[0]
    out = {}
    for key, value in extra.items():
        try:
            shaped_like = flatten(value)[0] == mine
        except DuplicatePathError:  # no tree of paths at all
            shaped_like = False
        out[key] = restrict(value, chosen, owner) if shaped_like else value
    return out


def selection(
    params: Params, updates: Updates, selector: Any, argument: str, strict: bool = False
) -> frozenset[str]:
    """The paths `selector` picks in `params` when given (the full tree), else in `updates`.

    Not strict by default, since a partial update may hold none of them.
    """
    tree = updates if params is None else params
    return frozenset(select(tree, selector, strict=strict, argument=argument))


def step_group(
    tx: Any,
    chosen: frozenset[str],
    updates: Updates,
    state: State,
    params: Params,
    extra: dict[str, Any],
    owner: str,
    mask_extra: bool = False,
) -> tuple[list, Any]:
    """`tx`'s step on the paths `chosen` of `updates`: `([(group, result)], new state)`.

    The pair is a part for `merge_by_path`. A group without a gradient gives `([], state)`:
    its state, counts and schedules included, stays exactly as it was. With `mask_extra`,
    the extra arguments shaped like `updates` are restricted to the group (`masked_extra`).
    """
    group = restrict(updates, chosen, owner)
    if not any_present(group):
        return [], state
    if mask_extra:
        extra = masked_extra(extra, updates, chosen, owner)
    result, state = tx.step(group, state, restrict(params, chosen, owner), **extra)
    return [(group, result)], state


def eval_group(tx: Any, state: State, params: Params, chosen: frozenset[str], owner: str) -> list:
    """`tx`'s eval weights on the paths `chosen` of `params`, as parts for `merge_by_path`."""
    group = restrict(params, chosen, owner)
    return [(group, tx.eval_params(state, group))] if any_present(group) else []


class Masked(Labelled, Transformation):
    """`inner` on the selected paths, identity elsewhere (see `masked`)."""

    inner: Any = None
    mask: Any = static(None)
    label: str = static("masked")
    mask_compatible_extra_args: bool = static(False)

    def _chosen(self, params: Params, updates: Updates = None, strict: bool = False) -> frozenset:
        """The selected paths (see `selection`)."""
        return selection(params, updates, self.mask, f"{self.label}(mask={self.mask!r})", strict)

    def init_state(self, params: Params) -> Any:
        """The inner state for the selected paths only; a mask selecting nothing raises."""
        return self.inner.init_state(
            restrict(params, self._chosen(params, strict=True), self.label)
        )

    def step(self, updates: Updates, state: State, params: Params = None, **extra: Any) -> tuple:
        """The inner update on the selected present paths; others pass through.

        A call without any selected gradient leaves the state untouched. With
        `mask_compatible_extra_args`, an extra argument with the paths of `updates` is
        restricted to the selected paths too.
        """
        chosen = self._chosen(params, updates)
        mask_extra = self.mask_compatible_extra_args
        parts, state = step_group(
            self.inner, chosen, updates, state, params, extra, self.label, mask_extra
        )
        return (merge_by_path(updates, parts) if parts else updates), state

    def frozen_paths(self, params: Params) -> frozenset[str]:
        """The inner's frozen paths among the selected ones."""
        return self.inner.frozen_paths(restrict(params, self._chosen(params), self.label))

    def eval_params(self, state: State, params: Params) -> Any:
        """The inner's eval weights on the selected paths; the other paths' params."""
        parts = eval_group(self.inner, state, params, self._chosen(params), self.label)
        return merge_by_path(params, parts) if parts else params

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """The inner's description of the selected paths (after `[name]` if one was given)."""
        inner = self.inner.describe(restrict(params, self._chosen(params), self.label), step)
        if self.label == "masked":
            return inner
        return {path: [(f"[{self.label}]", {}), *steps] for path, steps in inner.items()}


def masked(
    inner: Any, mask: Any, *, name: str = "masked", mask_compatible_extra_args: bool = False
) -> Masked:
    """Apply `inner` only where `mask` selects; elsewhere updates pass through unchanged.

    The inner state holds the selected paths only (no placeholder nodes), so its memory is
    what `inner` would use on the selected parameters alone. Masks nest:
    `masked(masked(tx, a), b)` applies `tx` where both `a` and `b` select. A gradient update
    that holds none of the selected paths (a partial update of other parameters) leaves the
    inner state, counts and schedules included, exactly as it was.

    Args:
        inner: the transformation to apply (gradtx or optax-style).
        mask: a selector (glob, list of globs, regex, bool tree, `f(path, leaf)` or
            `f(params) -> bool tree`; see `gradtx.paths`). One that selects nothing raises at
            `init`, naming the selector and the tree's paths.
        name: the key of this step's state inside a chain (and the group name that
            `gradtx.hyperparams` shows for hyperparameters injected inside it).
        mask_compatible_extra_args: as in optax, also restrict to the selected paths every
            extra keyword argument of `update` that has the paths of the updates (a
            per-parameter tree), so `inner` gets it for its own paths only (`None`
            elsewhere). Other extra arguments pass through unchanged.

    Returns:
        A transformation whose state is the inner state.

    Examples:
        >>> tx = gradtx.masked(gradtx.adam(0.1), "**/w")
        >>> params = {"w": jnp.ones(2), "b": jnp.ones(2)}
        >>> sorted(gradtx.state_dict(tx.init(params)))
        ['count/w', 'mu/w', 'nu/w']
        >>> u, _ = tx.update({"w": jnp.ones(2), "b": jnp.ones(2)}, tx.init(params))
        >>> u["b"]
        Array([1., 1.], dtype=float32)
    """
    inner = as_transformation(inner, "masked(inner)")
    return Masked(
        inner, as_selector(mask, "masked(mask=...)"), name, bool(mask_compatible_extra_args)
    )
