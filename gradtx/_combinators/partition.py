"""`partition` (optax's `multi_transform`): one transformation per label, one state per label."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from gradtx._combinators.masked import eval_group, step_group
from gradtx._combinators.wrapper import Labelled
from gradtx._core.module import static
from gradtx._core.protocol import Params, Transformation, Updates
from gradtx._core.static_value import StaticValue
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.selectors import LabelError, resolve_labels
from gradtx._paths.subset import merge_by_path, restrict


class Partition(Labelled, Transformation):
    """One inner transformation per label (see `partition`)."""

    transforms: dict = None  # type: ignore[assignment]
    labels: Any = static(None)
    label: str = static("partition")
    mask_compatible_extra_args: bool = static(False)

    def _groups(
        self, params: Params, updates: Updates, strict: bool
    ) -> dict[Hashable, frozenset[str]]:
        tree = updates if params is None else params
        by_path = resolve_labels(
            tree,
            self.labels.value,
            known=tuple(self.transforms),
            argument=f"{self.label}(labels=...)",
            strict=strict,
        )
        return {
            label: frozenset(path for path, mine in by_path.items() if mine == label)
            for label in self.transforms
        }

    def init_state(self, params: Params) -> dict:
        """`{label: inner.init(params of that label)}`; every leaf needs exactly one label.

        Each label's params keep the whole model's paths, `None` outside the label, so the
        masks and selectors of its transformation are checked against the whole model.
        """
        groups = self._groups(params, None, strict=True)
        return {
            label: tx.init_state(restrict(params, groups[label], f"{self.label}[{label!r}]"))
            for label, tx in self.transforms.items()
        }

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Each label's inner update on its present paths.

        A label with no gradient in `updates` keeps its state (counts and schedules included)
        exactly as it was.
        """
        if not isinstance(state, Mapping) or set(state) != set(self.transforms):
            found = list(state) if isinstance(state, Mapping) else type(state).__name__
            raise KeyError(
                f"{self.label}: expected the state made by its init, with one entry per label "
                f"{list(self.transforms)}, got {found}."
            )
        groups = self._groups(params, updates, strict=False)
        new_state, parts = dict(state), []
        mask_extra = self.mask_compatible_extra_args
        for label, tx in self.transforms.items():
            owner = f"{self.label}[{label!r}]"
            part, new_state[label] = step_group(
                tx, groups[label], updates, state[label], params, extra, owner, mask_extra
            )
            parts += part
        return merge_by_path(updates, parts), new_state

    def eval_params(self, state: dict, params: Params) -> Any:
        """Each label's eval weights on its paths, from that label's state."""
        groups = self._groups(params, None, strict=False)
        parts = []
        for label, tx in self.transforms.items():
            parts += eval_group(tx, state[label], params, groups[label], f"{self.label}[{label!r}]")
        return merge_by_path(params, parts)

    def frozen_paths(self, params: Params) -> frozenset[str]:
        """The union of each label's frozen paths."""
        groups = self._groups(params, None, strict=False)
        out: frozenset[str] = frozenset()
        for label, tx in self.transforms.items():
            out |= tx.frozen_paths(restrict(params, groups[label], self.label))
        return out

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """Each path's label, then its label's inner steps."""
        groups = self._groups(params, None, strict=False)
        out: dict[str, list[tuple[str, dict]]] = {}
        for label, tx in self.transforms.items():
            inner = tx.describe(restrict(params, groups[label], self.label), step)
            for path, steps in inner.items():
                out[path] = [(f"[{label}]", {}), *steps]
        return out


def partition(
    transforms: Mapping[Hashable, Any],
    labels: Any,
    *,
    name: str = "partition",
    mask_compatible_extra_args: bool = False,
) -> Partition:
    """Give each parameter group its own transformation and its own state.

    Every leaf gets exactly one label; the transformation of that label updates it, with a
    state holding that label's paths only. Each label's counters and schedules are its own,
    and an update that holds no gradient for a label (a partial update of another model)
    leaves that label's state exactly as it was, so two models in one `partition` updated in
    turn give what two separate optimizers give.

    Args:
        transforms: `{label: transformation}`.
        labels: which label each path gets, in one of these forms (see `gradtx.paths`):
            `{label: selector}` (globs, regex, bool trees, functions); a pytree of labels
            shaped like the params (or a prefix of them); a function `f(path, leaf) -> label`
            (two arguments); or an optax-style `f(params) -> pytree of labels` (one argument).
            A dict is read as whichever of `{label: selector}` and a tree of labels is valid
            (`{"enc": "enc", "head": "head"}` with keys equal to labels included); one valid
            both ways with different labels raises, showing both. An unlabelled or doubly
            labelled path, or a label missing from `transforms`, raises and names the path.
        name: the key of this step's state inside a chain.
        mask_compatible_extra_args: as in optax, also restrict to each label's paths every
            extra keyword argument of `update` that has the paths of the updates (a
            per-parameter tree), so each transformation gets it for its own paths only.

    Returns:
        A transformation whose state is `{label: that label's inner state}`.

    Examples:
        >>> tx = gradtx.partition(
        ...     {"enc": gradtx.adam(1e-3), "head": gradtx.sgd(0.1)},
        ...     {"enc": "encoder/**", "head": "head/**"},
        ... )
        >>> params = {"encoder": {"w": jnp.ones(2)}, "head": {"w": jnp.ones(2)}}
        >>> sorted(gradtx.state_dict(tx.init(params)))
        ['enc/count/encoder/w', 'enc/mu/encoder/w', 'enc/nu/encoder/w']
    """
    if not isinstance(transforms, Mapping) or not transforms:
        raise TypeError(
            f"{name}: `transforms` must be a non-empty dict {{label: transformation}}, "
            f"got {transforms!r}"
        )
    for label in transforms:
        if not isinstance(label, (str, int)):
            raise LabelError(f"{name}: labels must be str or int, got {label!r}")
    txs = {
        label: as_transformation(tx, f"{name}(transforms[{label!r}])")
        for label, tx in transforms.items()
    }
    return Partition(txs, StaticValue(labels), name, bool(mask_compatible_extra_args))


multi_transform = partition
