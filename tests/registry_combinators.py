"""Registry entries of the combinators (see `registry.Entry`), each around adam or sgd, with
the per-group NumPy references of tests/references_combinators.py.

The contract params have `enc/w`, `enc/b`, `layers/0/w`, `layers/1/w`, `layers/1/s` and a
`None` leaf. Selections that split packed params are refused (a packed buffer belongs to one
group), so those entries say `packed=False`.
"""

from __future__ import annotations

import optax
import references_combinators as rc
from registry import Entry, _f, optax_w_mask

import gradtx
from gradtx import schedules

LR_SWEEP = (0.02, 0.05, 0.1)


def _ref_linear(lr: float):
    v0, v1 = rc.f32(lr), rc.f32(0.5 * rc.f32(lr))

    def schedule(t: int) -> float:
        return v0 + (v1 - v0) * min(t, 10) / 10

    return schedule


def _optax_labels(params):
    return {"enc": "a", "layers": ["b", {"w": "b", "s": "b"}], "frozen": None}


COMBINATORS: tuple[Entry, ...] = (
    Entry(
        id="masked-adam",
        name="masked",
        make=lambda lr: gradtx.masked(gradtx.adam(lr), "**/w"),
        reference=lambda lr: rc.as_reference(rc.Masked(rc.Adam(lr), "**/w")),
        oracle=lambda lr: optax.masked(
            optax.adam(_f(lr), _f(0.9), _f(0.999), _f(1e-8)), optax_w_mask
        ),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,  # unselected paths get the raw gradient, an ascent direction
        packed=False,
    ),
    Entry(
        id="partition-adam-sgd",
        name="partition",
        make=lambda lr: gradtx.partition(
            {"a": gradtx.adam(lr), "b": gradtx.sgd(lr, momentum=0.9)},
            {"a": "enc", "b": "layers"},
        ),
        reference=lambda lr: rc.as_reference(rc.Partition(rc.Adam(lr), "enc", rc.Sgd(lr, 0.9))),
        oracle=None,
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        packed=False,
    ),
    Entry(
        id="multi_transform-label-tree",
        name="multi_transform",
        make=lambda lr: gradtx.multi_transform(
            {"a": gradtx.adam(lr), "b": gradtx.sgd(lr, momentum=0.9)},
            {"enc": "a", "layers": "b"},
        ),
        reference=lambda lr: rc.as_reference(rc.Partition(rc.Adam(lr), "enc", rc.Sgd(lr, 0.9))),
        oracle=lambda lr: optax.multi_transform(
            {
                "a": optax.adam(_f(lr), _f(0.9), _f(0.999), _f(1e-8)),
                "b": optax.sgd(_f(lr), momentum=_f(0.9)),
            },
            _optax_labels,
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        packed=False,
    ),
    Entry(
        id="freeze-adam",
        name="freeze",
        make=lambda lr: gradtx.freeze(gradtx.adam(lr), "layers/1"),
        reference=lambda lr: rc.as_reference(rc.Freeze(rc.Adam(lr), "layers/1")),
        oracle=None,
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,  # the frozen leaves keep their share of the loss
        packed=False,
    ),
    Entry(
        id="trainable-sgd",
        name="trainable",
        make=lambda lr: gradtx.trainable(gradtx.sgd(lr, momentum=0.9), "enc"),
        reference=lambda lr: rc.as_reference(rc.Freeze(rc.Sgd(lr, 0.9), "enc", invert=True)),
        oracle=None,
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=False,
        packed=False,
    ),
    Entry(
        id="selective_transform-sgd",
        name="selective_transform",
        make=lambda lr: gradtx.selective_transform(gradtx.sgd(lr), freeze_mask="**/s"),
        reference=lambda lr: rc.as_reference(rc.Freeze(rc.Sgd(lr, 0.0), "**/s")),
        oracle=None,
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        packed=False,
    ),
    Entry(
        id="inject_hyperparams-adam",
        name="inject_hyperparams",
        make=lambda lr: gradtx.inject_hyperparams(gradtx.adam)(learning_rate=lr),
        reference=lambda lr: rc.as_reference(rc.Adam(lr)),
        oracle=lambda lr: optax.inject_hyperparams(optax.adam)(
            learning_rate=_f(lr), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8)
        ),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
        # The injected value lives in the state from `init` on (where set_hyperparams changes
        # it), so a transformation built with another value does not change a running state.
        uses_scalar=False,
    ),
    Entry(
        id="inject_hyperparams-schedule-sgd",
        name="inject_hyperparams",
        make=lambda lr: gradtx.inject_hyperparams(gradtx.sgd)(
            learning_rate=schedules.linear(lr, 0.5 * lr, 10), momentum=0.9
        ),
        reference=lambda lr: rc.as_reference(rc.Inject(rc.Sgd(lr, 0.9), _ref_linear(lr))),
        oracle=None,
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
    ),
)
