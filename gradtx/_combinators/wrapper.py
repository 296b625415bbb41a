"""Bases of the combinators: `Wrapper` (around one transformation) and `Labelled`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gradtx._core.lift import check_state_keys
from gradtx._core.module import field
from gradtx._core.protocol import Params, Transformation
from gradtx._optax.wrapped import as_transformation


class Wrapper(Transformation):
    """A transformation around `inner` (optax ones are wrapped), whose state it keeps there.

    It freezes what `inner` freezes and evaluates what `inner` evaluates, from
    `state["inner"]`; a subclass that changes the weights, or keeps the inner state under
    another key, overrides `eval_params`.
    """

    inner: Any = field(converter=as_transformation)
    if TYPE_CHECKING:  # each subclass names its state's keys (`inner` among them)

        def state_keys(self) -> tuple[str, ...]: ...

    def frozen_paths(self, params: Params) -> frozenset[str]:
        """The inner transformation's frozen paths."""
        return self.inner.frozen_paths(params)

    def eval_params(self, state: dict, params: Params) -> Any:
        """The inner transformation's eval weights, from its state."""
        check_state_keys(self.name, state, self.state_keys())
        return self.inner.eval_params(state["inner"], params)


class Labelled:
    """A mixin for transformations named by their `label` field, as the caller chose."""

    label: str

    @property
    def name(self) -> str:
        """The key of this step's state inside a chain."""
        return self.label
