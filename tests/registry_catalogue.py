"""Registry entries of the optimizer catalogue's second round (see `registry.Entry`): SM3,
optimistic Adam, `apply_every`, per-layer per-example clipping, parameter block norms and the
layer-wise DoG. One entry per public name; their options are checked in
tests/transforms/test_catalogue_round_two.py."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import references as ref
import references_catalogue as rc
from registry import Entry, _f
from registry_per_leaf import EXAMPLE_SCALES, FromOneGradient, as_examples

import gradtx

LR_SWEEP = (0.02, 0.05, 0.1)


def _as_vectors(tree: Any) -> Any:
    return jax.tree.map(lambda x: jnp.reshape(x, (1,)) if jnp.ndim(x) == 0 else x, tree)


class ScalarsAsVectors:
    """An optax oracle that fails on 0-d leaves (SM3 keeps one accumulator per axis, none for
    a scalar; L-DoG's sums have shape (1,)) sees each scalar as a vector of one element, which
    is what gradtx does with a scalar; its updates come back in the gradients' shapes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def init(self, params: Any) -> Any:
        return self.inner.init(_as_vectors(params))

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        with jax.numpy_rank_promotion("allow"):  # optax's L-DoG multiplies (1,) by the array
            new, state = self.inner.update(_as_vectors(updates), state, _as_vectors(params))
        return jax.tree.map(lambda u, g: jnp.reshape(u, jnp.shape(g)), new, updates), state


class OptaxPerExampleLayerClip:
    """The oracle: optax's `per_example_layer_norm_clip` function on the same batch."""

    def __init__(self, clip: Any, uniform: bool = True) -> None:
        self.clip, self.uniform = clip, uniform

    def init(self, params: Any) -> Any:
        return optax.EmptyState()

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        summed, _ = optax.per_example_layer_norm_clip(as_examples(updates), self.clip, self.uniform)
        return summed, state


def on_examples(inner: ref.Reference) -> ref.Reference:
    """A per-example reference fed the batch that `FromOneGradient` makes of one gradient."""

    def update(grads: dict, state: dict, params: dict) -> tuple[dict, dict]:
        examples = {
            p: np.stack([s * np.asarray(g) for s in EXAMPLE_SCALES]) for p, g in grads.items()
        }
        return inner.update(examples, state, params)

    return ref.Reference(inner.init, update)


def optax_optimistic_adam(learning_rate: float) -> Any:
    """optax 0.2.8's `optimistic_adam` (deprecated there in favour of `optimistic_adam_v2`,
    whose arguments differ; the algorithm is the same)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return optax.optimistic_adam(_f(learning_rate), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8))


CATALOGUE: tuple[Entry, ...] = (
    Entry(
        # b2 < 1: exponential averages of the cover sets' maxima (the sum is `sm3`'s entry).
        id="scale_by_sm3-b2",
        name="scale_by_sm3",
        make=lambda b1: gradtx.scale_by_sm3(b1=b1, b2=0.99),
        reference=lambda b1: rc.scale_by_sm3(b1=b1, b2=0.99),
        oracle=lambda b1: ScalarsAsVectors(optax.scale_by_sm3(_f(b1), _f(0.99), _f(1e-8))),
        scalar=0.9,
        sweep=(0.0, 0.5, 0.9),
        converges=False,
        packed=False,
    ),
    Entry(
        id="sm3",
        name="sm3",
        make=lambda lr: gradtx.sm3(lr),
        reference=lambda lr: rc.sm3(lr),
        oracle=lambda lr: ScalarsAsVectors(optax.sm3(_f(lr))),
        scalar=0.2,
        sweep=(0.1, 0.2, 0.4),
        converges=True,
        packed=False,
    ),
    Entry(
        id="optimistic_adam",
        name="optimistic_adam",
        make=lambda lr: gradtx.optimistic_adam(lr),
        reference=lambda lr: rc.optimistic_adam(lr),
        oracle=optax_optimistic_adam,
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        # u = 2 lr r_t - lr r_{t-1} subtracts two Adam directions, whose bias correction
        # `1 - 0.999**t` keeps only a few float32 digits at small t (in optax too): the
        # difference amplifies that rounding, and optax rounds NAdam's terms in another order.
        reference_rtol=1e-4,
        oracle_rtol=1e-5,
    ),
    Entry(
        # k = n + 1 (an int32 leaf, so a new k reuses the compiled step): every scalar the
        # suites pass, 0.1 included (tests/layouts/test_step_counts.py), gives a valid k.
        id="apply_every",
        name="apply_every",
        make=lambda n: gradtx.apply_every(n + 1),
        reference=lambda n: rc.apply_every(int(n) + 1),
        oracle=lambda n: optax.apply_every(int(n) + 1),
        scalar=2.0,
        sweep=(1.0, 2.0, 3.0),
        converges=False,
    ),
    Entry(
        id="per_example_layer_norm_clip",
        name="per_example_layer_norm_clip",
        make=lambda c: FromOneGradient(gradtx.per_example_layer_norm_clip(c)),
        reference=lambda c: on_examples(rc.per_example_layer_norm_clip(c)),
        oracle=lambda c: OptaxPerExampleLayerClip(_f(c)),
        scalar=2.0,
        sweep=(1.0, 4.0, 100.0),
        converges=False,
        packed=False,
    ),
    Entry(
        id="scale_by_param_block_norm",
        name="scale_by_param_block_norm",
        make=lambda s: gradtx.scale_by_param_block_norm(s),
        reference=lambda s: rc.scale_by_param_block_norm(s),
        oracle=lambda s: optax.scale_by_param_block_norm(_f(s)),
        scalar=1.0,
        sweep=(1e-3, 1.0, 3.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        # global_scale -1: the DoG step itself descends.
        id="scale_by_distance_over_gradients",
        name="scale_by_distance_over_gradients",
        make=lambda s: gradtx.scale_by_distance_over_gradients(1e-2, global_scale=s),
        reference=lambda s: rc.scale_by_distance_over_gradients(1e-2, global_scale=s),
        oracle=lambda s: ScalarsAsVectors(
            optax.scale_by_distance_over_gradients(_f(1e-2), _f(1e-8), global_scale=_f(s))
        ),
        scalar=-1.0,
        sweep=(-2.0, -1.0, -0.5),
        converges=True,
        needs_params=True,
        packed=False,
    ),
)
