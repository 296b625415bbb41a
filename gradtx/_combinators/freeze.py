"""`freeze` and `trainable`: frozen paths get a zero update and keep no optimizer state."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from gradtx._combinators.masked import eval_group, selection, step_group
from gradtx._combinators.wrapper import Labelled
from gradtx._core.module import static
from gradtx._core.protocol import Params, State, Transformation, Updates
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.paths import is_unit
from gradtx._paths.selectors import as_selector
from gradtx._paths.subset import merge_by_path, present_paths, restrict


def _zeros(leaf: Any) -> Any:
    return leaf.map(jnp.zeros_like) if is_unit(leaf) else jnp.zeros_like(leaf)


class Freeze(Labelled, Transformation):
    """`inner` on the trainable paths, exact zeros on the frozen ones (see `freeze`)."""

    inner: Any = None
    where: Any = static(None)
    invert: bool = static(False)  # True for `trainable`: `where` selects what trains
    label: str = static("freeze")

    def _split(
        self, params: Params, updates: Updates = None, strict: bool = False
    ) -> tuple[frozenset[str], frozenset[str]]:
        """`(frozen, trainable)` paths of `params` when given (the full tree), else `updates`."""
        chosen = selection(
            params, updates, self.where, f"{self.label}(where={self.where!r})", strict
        )
        present = frozenset(present_paths(updates if params is None else params))
        frozen = present - chosen if self.invert else chosen
        return frozen, present - frozen

    def init_state(self, params: Params) -> Any:
        """The inner state for the trainable paths only: frozen paths allocate nothing."""
        train = self._split(params, strict=True)[1]
        return self.inner.init_state(restrict(params, train, self.label))

    def step(self, updates: Updates, state: State, params: Params = None, **extra: Any) -> tuple:
        """Zeros on the frozen paths, the inner update on the others.

        The inner transformation never sees the frozen paths, so they are out of its global
        norms and weight decay.
        """
        frozen, train = self._split(params, updates)
        parts, state = step_group(self.inner, train, updates, state, params, extra, self.label)
        still = restrict(updates, frozen, self.label)
        zeros = (still, jax.tree.map(_zeros, still, is_leaf=is_unit))
        return merge_by_path(updates, [zeros, *parts]), state

    def eval_params(self, state: State, params: Params) -> Any:
        """The inner's eval weights on the trainable paths; the frozen ones as they are."""
        parts = eval_group(self.inner, state, params, self._split(params)[1], self.label)
        return merge_by_path(params, parts) if parts else params

    def frozen_paths(self, params: Params) -> frozenset[str]:
        """The frozen paths, and those the inner transformation freezes."""
        frozen, train = self._split(params)
        return frozen | self.inner.frozen_paths(restrict(params, train, self.label))

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """`frozen` for the frozen paths, the inner's steps for the others."""
        frozen, train = self._split(params)
        out = self.inner.describe(restrict(params, train, self.label), step)
        out.update({path: [("frozen", {})] for path in present_paths(params) if path in frozen})
        return out


def _checked(inner: Any, where: Any, name: str, what: str) -> tuple[Any, Any]:
    """`(inner as a transformation, where as a selector)`, or an error saying what to write.

    optax's `freeze(mask)` takes only the mask (and zeroes those updates inside a chain);
    here the optimizer of the trainable paths comes first.
    """
    if not (callable(getattr(inner, "init", None)) and callable(getattr(inner, "update", None))):
        example = repr(inner) if isinstance(inner, str) else '"enc/**"'
        optax_form = (
            " For optax's `freeze(mask)`, which sits in a chain beside the optimizer, wrap the "
            "optimizer instead (`gradtx.freeze(tx, mask)`), or give the frozen paths "
            '`gradtx.set_to_zero()` in a `partition({"train": tx, "frozen": '
            "gradtx.set_to_zero()}, labels)`."
            if what == "trainable"
            else ""
        )
        raise TypeError(
            f"{name}(inner, where): `inner` must be the optimizer of the {what} paths, got "
            f"{type(inner).__name__} {inner!r}. gradtx's {name} wraps an optimizer and takes "
            f"the selector second: `gradtx.{name}(gradtx.adamw(1e-3), {example})`.{optax_form}"
        )
    if where is None:
        raise TypeError(
            f"{name}(inner, where): `where` is missing: pass a selector of the paths to "
            f"{'freeze' if what == 'trainable' else 'train'} (see `gradtx.paths`), for "
            f'example `gradtx.{name}(tx, "enc/**")`.'
        )
    return as_transformation(inner, f"{name}(inner)"), as_selector(where, f"{name}(where=...)")


def freeze(inner: Any, where: Any = None, *, name: str = "freeze") -> Freeze:
    """Freeze the selected paths: exactly zero update, no optimizer state, no weight decay.

    `inner` runs on the other (trainable) paths only and never sees the frozen ones, so they
    allocate no state (the state's memory equals that of `inner` on the trainable parameters
    alone), receive no weight decay, and are left out of global norms such as
    `clip_by_global_norm`'s. `accumulate` keeps no buffer for them.

    Args:
        inner: the optimizer of the trainable paths.
        where: a selector of the paths to freeze (see `gradtx.paths`); one that selects nothing
            raises at `init`, as does a glob of it, including or excluding, that matches no
            path. Passing the selector alone (optax's `freeze(mask)`) raises, showing this
            form.
        name: the key of this step's state inside a chain.

    Returns:
        A transformation whose state is `inner`'s state for the trainable paths.

    Examples:
        >>> tx = gradtx.freeze(gradtx.adamw(0.1), "encoder")
        >>> params = {"encoder": {"w": jnp.ones(2)}, "head": jnp.ones(2)}
        >>> sorted(gradtx.state_dict(tx.init(params)))
        ['count/head', 'mu/head', 'nu/head']
        >>> u, _ = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
        >>> u["encoder"]["w"]
        Array([0., 0.], dtype=float32)
    """
    inner, where = _checked(inner, where, name, "trainable")
    return Freeze(inner, where, False, name)


def trainable(inner: Any, where: Any = None, *, name: str = "trainable") -> Freeze:
    """Train only the selected paths with `inner`; freeze every other path (see `freeze`).

    Args:
        inner: the optimizer of the selected paths.
        where: a selector of the trainable paths; one that selects nothing raises at `init`.
        name: the key of this step's state inside a chain.

    Examples:
        >>> tx = gradtx.trainable(gradtx.sgd(0.1, momentum=0.9), "head")
        >>> params = {"encoder": {"w": jnp.ones(2)}, "head": jnp.ones(2)}
        >>> list(gradtx.state_dict(tx.init(params)))
        ['trace/head']
    """
    inner, where = _checked(inner, where, name, "selected")
    return Freeze(inner, where, True, name)


def selective_transform(optimizer: Any, *, freeze_mask: Any) -> Freeze:
    """The optax name for `freeze`: `optimizer` on the paths `freeze_mask` does not select.

    Args:
        optimizer: the optimizer of the trainable paths.
        freeze_mask: a selector of the frozen paths.

    Examples:
        >>> tx = gradtx.selective_transform(gradtx.sgd(0.1), freeze_mask="**/b")
        >>> u, _ = tx.update({"w": jnp.ones(1), "b": jnp.ones(1)}, {})
        >>> u["b"], u["w"]
        (Array([0.], dtype=float32), Array([-0.1], dtype=float32))
    """
    return freeze(optimizer, freeze_mask, name="selective_transform")
