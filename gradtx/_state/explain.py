"""`explain`: what the optimizer does to each parameter, as a table and as data."""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gradtx._combinators.bucketed import Bucketed
from gradtx._core.protocol import Params
from gradtx._layouts.packed import LARGE_LEAF
from gradtx._optax.wrapped import as_transformation
from gradtx._paths.paths import flatten, is_unit, owning_path
from gradtx._paths.subset import present_paths
from gradtx._state.shardings import slot_layouts
from gradtx._state.state_dict import state_dict

_SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64", "int32": "i32"}


@dataclasses.dataclass(frozen=True)
class ExplainRow:
    """What the optimizer does to one parameter path.

    Attributes:
        path: the parameter's path.
        steps: the transformations applied to it, in order (`[label]` marks a partition
            group, `frozen` a frozen path).
        learning_rate: the effective learning rate (the product of the learning rates and
            `scale` factors applied), or `None` when no step sets one; 0 for a frozen path.
        weight_decay: the decoupled weight decay it receives (0 when none).
        b1: the first-moment decay of its adaptive step, if any.
        b2: the second-moment decay of its adaptive step, if any.
        frozen: True if the path is frozen.
        state_dtypes: `{state key without the path: dtype}` of its optimizer state.
        hyperparams: every hyperparameter of its steps, as `{step/name: value}`.
        state_layout: with `explain(..., shard_over=axis)`, how its state is split over the
            devices (see `gradtx.slot_layouts`); otherwise empty.
    """

    path: str
    steps: tuple[str, ...]
    learning_rate: float | None
    weight_decay: float
    b1: float | None
    b2: float | None
    frozen: bool
    state_dtypes: dict[str, str]
    hyperparams: dict[str, float]
    state_layout: str = ""


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


class Explanation:
    """The rows of `explain`, one per parameter path; `str()` renders them as a table."""

    def __init__(self, rows: tuple[ExplainRow, ...], step: int, hint: str = "") -> None:
        self.rows = rows
        self.step = step
        self.hint = hint

    def __getitem__(self, path: str) -> ExplainRow:
        for row in self.rows:
            if row.path == path:
                return row
        raise KeyError(
            f"explain: no parameter path {path!r}; the paths are {[r.path for r in self.rows][:8]}"
        )

    def __len__(self) -> int:
        return len(self.rows)

    def to_dicts(self) -> list[dict[str, Any]]:
        """The rows as plain dicts (for a DataFrame or JSON)."""
        return [dataclasses.asdict(row) for row in self.rows]

    def __str__(self) -> str:
        header: tuple[str, ...] = ("path", "steps", "lr", "wd", "b1", "b2", "frozen", "state")
        layouts = any(row.state_layout for row in self.rows)
        body = [
            (
                row.path,
                " > ".join(row.steps),
                _fmt(row.learning_rate),
                _fmt(row.weight_decay),
                _fmt(row.b1),
                _fmt(row.b2),
                "yes" if row.frozen else "",
                " ".join(f"{k.rsplit('/', 1)[-1]}:{v}" for k, v in row.state_dtypes.items()),
                *((row.state_layout,) if layouts else ()),
            )
            for row in self.rows
        ]
        if layouts:
            header = (*header, "state layout")
        widths = [max(len(r[i]) for r in (header, *body)) for i in range(len(header))]
        lines = [f"step {self.step}"]
        for r in (header, *body):
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)

    __repr__ = __str__


# From this many small leaves on, `explain` suggests bucketed state: from there it compiles
# much faster than the per-leaf layout (benchmarks/compile_time.py). The step itself
# was faster bucketed on a GPU and slower on a CPU, so it is a hint, not a default.
_MANY_LEAVES = 500


def _layout_hint(tx: Any, params: Params) -> str:
    """A suggestion for trees of many small leaves not already in flat buffers."""
    leaves = [x for x in flatten(params)[1] if x is not None]
    nodes = jax.tree.leaves(tx, is_leaf=lambda n: isinstance(n, Bucketed))
    if any(is_unit(x) for x in leaves) or any(isinstance(n, Bucketed) for n in nodes):
        return ""
    small = sum(1 for x in leaves if math.prod(np.shape(x)) < LARGE_LEAF)
    if small < _MANY_LEAVES:
        return ""
    return (
        f"{small} small leaves: `gradtx.bucketed(tx)` keeps their state in a few flat buffers "
        "and compiles several times faster (the performance page has the figures; time the "
        "step on your hardware)."
    )


def _row(path: str, steps: list[tuple[str, dict]], dtypes: dict[str, str]) -> ExplainRow:
    frozen = any(name == "frozen" for name, _ in steps)
    flat = {f"{name}/{key}": value for name, values in steps for key, value in values.items()}
    wd = sum((values.get("weight_decay", 0.0) for _, values in steps), 0.0)
    b1 = next((values["b1"] for _, values in steps if "b1" in values), None)
    b2 = next((values["b2"] for _, values in steps if "b2" in values), None)
    lr: float | None = None
    for name, values in steps:
        if "learning_rate" in values:
            lr = (1.0 if lr is None else lr) * values["learning_rate"]
        if name == "scale" and "step_size" in values:
            lr = (1.0 if lr is None else lr) * values["step_size"]
    if frozen:
        lr, wd = 0.0, 0.0
    return ExplainRow(path, tuple(n for n, _ in steps), lr, wd, b1, b2, frozen, dtypes, flat)


def _layout_notes(tx: Any, params: Params, axis: str) -> dict[str, str]:
    """`{param path: how its state is laid out}`, one note per path (per slot if they differ)."""
    notes: dict[str, dict[str, str]] = {}
    for slot in slot_layouts(tx, params, shard_over=axis):
        if slot.param is not None:
            name = slot.key[: -len(slot.param)].rstrip("/").rsplit("/", 1)[-1]
            notes.setdefault(slot.param, {})[name] = slot.note
    out = {}
    for path, by_slot in notes.items():
        joined = "; ".join(f"{name}: {note}" for name, note in by_slot.items())
        out[path] = joined if len(set(by_slot.values())) > 1 else next(iter(by_slot.values()))
    return out


def explain(
    tx: Any, params: Params, step: int = 0, *, shard_over: str | None = None
) -> Explanation:
    """Describe, for every parameter path, what the optimizer does to it at `step`.

    One row per path: the chain of transformations applied to it, the effective learning
    rate (schedules evaluated at `step`), its weight decay, its betas, whether it is frozen,
    and the dtypes of its state. Nothing is computed on the params' values: the state is
    traced abstractly. Hyperparameters injected in a dtype that cannot represent them warn.

    Args:
        tx: the transformation (an optimizer, a chain, a partition, ...).
        params: the params (arrays or `jax.ShapeDtypeStruct`s).
        step: the step at which schedules are evaluated.
        shard_over: a mesh axis (ZeRO-1, see `gradtx.state_shardings`): adds a column that
            says, per path, whether its state is split over that axis and on which
            dimension, or why it stays as its parameter. The params need shardings.

    Returns:
        An `Explanation`: `str()`/`print()` give a table; `.rows` (one `ExplainRow` per path),
        `explanation[path]` and `.to_dicts()` give the data. On a tree of 500 or more small
        leaves whose state is kept per leaf, `.hint` (printed last) suggests `gradtx.bucketed`.

    Examples:
        >>> tx = gradtx.partition(
        ...     {"body": gradtx.adamw(1e-3, weight_decay=0.1), "head": gradtx.sgd(0.1)},
        ...     {"body": "body", "head": "head"},
        ... )
        >>> table = gradtx.explain(tx, {"body": jnp.ones(2), "head": jnp.ones(2)})
        >>> table["body"].learning_rate, table["body"].weight_decay, table["head"].b1
        (0.0010000000474974513, 0.10000000149011612, None)
        >>> print(table)  # doctest: +NORMALIZE_WHITESPACE
        step 0
        path  steps                                                                    lr     wd   b1   b2     frozen  state
        body  [body] > scale_by_adam > add_decayed_weights > scale_by_learning_rate  0.001  0.1  0.9  0.999          count:i32 mu:f32 nu:f32
        head  [head] > scale_by_learning_rate                                          0.1    0    -    -
    """  # noqa: E501
    tx = as_transformation(tx, "explain(tx)")
    described = tx.describe(params, step)
    paths = present_paths(params)
    with warnings.catch_warnings(record=True) as caught:  # shown in the table's hints
        warnings.simplefilter("always")
        abstract = jax.eval_shape(tx.init, params)
    dtypes: dict[str, dict[str, str]] = {p: {} for p in paths}
    for key, value in state_dict(abstract).items():
        owner = owning_path(key, dtypes)
        if owner is not None:
            slot = key[: -len(owner)].rstrip("/")
            name: str = jnp.dtype(value.dtype).name
            dtypes[owner][slot] = _SHORT.get(name, name)
    rows = tuple(_row(p, described.get(p, []), dtypes[p]) for p in paths)
    if shard_over is not None:
        notes = _layout_notes(tx, params, shard_over)
        rows = tuple(dataclasses.replace(r, state_layout=notes.get(r.path, "")) for r in rows)
    hints = [str(w.message) for w in caught] + [_layout_hint(tx, params)]
    return Explanation(rows, step, "\nhint: ".join(h for h in hints if h))
