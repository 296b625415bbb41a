"""Registry entries of the combinators (`chain`, `named_chain`, `masked`, `partition`,
`multi_transform`, `freeze`, `trainable`, `selective_transform`, `inject_hyperparams`) and of
the transformations made from functions (`stateless`, `stateless_with_tree_map`).

The contract params have `enc/w`, `enc/b`, `layers/0/w`, `layers/1/w`, `layers/1/s` and a
`None` leaf. Selections that split packed params are refused (a packed buffer belongs to one
group), so those entries say `packed=False`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import references as ref
import references.combinators as rc

import gradtx
from gradtx import schedules
from registry.entry import LR_SWEEP, Entry, _f, optax_w_mask


def _ref_linear(lr: float):
    v0, v1 = ref.f32(lr), ref.f32(0.5 * ref.f32(lr))

    def schedule(t: int) -> float:
        return v0 + (v1 - v0) * min(t, 10) / 10

    return schedule


def _optax_labels(params):
    return {"enc": "a", "layers": ["b", {"w": "b", "s": "b"}], "frozen": None}


# The functions are module-level objects: a plain function is static structure, and
# `jax.tree_util.Partial` keeps the learning rate as a leaf (swept without recompiling).
def _sgd_step(lr: Any, updates: Any, params: Any) -> Any:
    """`u = -lr * g` on the whole tree (`gradtx.tree.scale` keeps `None` leaves)."""
    return gradtx.tree.scale(-lr, updates)


def _soft_sign_step(lr: Any, g: Any, param: Any) -> Any:
    """`u = -lr * g / (1 + |g|)` for one array, in the gradient's dtype."""
    return -jnp.asarray(lr, g.dtype) * g / (1 + jnp.abs(g))


def _ref_soft_sign(lr: float):
    step = ref.f32(lr)
    return lambda g, p: -step * g / (1.0 + np.abs(g))


ENTRIES: tuple[Entry, ...] = (
    Entry(
        id="chain-clip-trace-scale",
        name="chain",
        make=lambda lr: gradtx.chain(
            gradtx.clip_by_global_norm(2.0), gradtx.trace(0.9), gradtx.scale(-lr)
        ),
        reference=lambda lr: ref.chain(
            ref.clip_by_global_norm(2.0), ref.trace(0.9), ref.scale(-ref.f32(lr))
        ),
        oracle=lambda lr: optax.chain(
            optax.clip_by_global_norm(_f(2.0)), optax.trace(_f(0.9)), optax.scale(-_f(lr))
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
    ),
    Entry(
        id="named_chain-clip-adam",
        name="named_chain",
        make=lambda lr: gradtx.named_chain(("clip", gradtx.clip(0.5)), ("opt", gradtx.adam(lr))),
        reference=lambda lr: ref.chain(ref.clip(0.5), ref.adam(lr)),
        oracle=lambda lr: optax.chain(
            optax.clip(_f(0.5)), optax.adam(_f(lr), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8))
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.named_chain(
            ("clip", gradtx.clip(0.5)), ("opt", gradtx.adam(lr, mu_dtype=dt, nu_dtype=dt))
        ),
    ),
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
    Entry(
        id="stateless-sgd",
        name="stateless",
        make=lambda lr: gradtx.stateless(jax.tree_util.Partial(_sgd_step, lr)),
        reference=lambda lr: rc.stateless(lambda g, p: {k: -ref.f32(lr) * v for k, v in g.items()}),
        oracle=lambda lr: optax.stateless(lambda u, p: jax.tree.map(lambda g: -_f(lr) * g, u)),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
        packed=False,  # `f` sees the whole tree: packed params are refused
    ),
    Entry(
        id="stateless_with_tree_map-soft-sign",
        name="stateless_with_tree_map",
        make=lambda lr: gradtx.stateless_with_tree_map(jax.tree_util.Partial(_soft_sign_step, lr)),
        reference=lambda lr: rc.stateless_with_tree_map(_ref_soft_sign(lr)),
        oracle=lambda lr: optax.stateless_with_tree_map(
            lambda g, p: -_f(lr) * g / (1 + jnp.abs(g))
        ),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
    ),
)
