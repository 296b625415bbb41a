"""Differentially private SGD: per-example clipping, Gaussian noise, the batch mean."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from gradtx._core.lift import check_state_keys, compute_dtype, init_slots, update_slots
from gradtx._core.module import field, hyperparam, non_negative, positive, static
from gradtx._core.protocol import Params, Transformation, Updates
from gradtx._core.statistics import KeepsStatistics, statistics
from gradtx._layouts.packed import reject_packed
from gradtx._optimizers.descent import descent
from gradtx._transforms.momentum import trace
from gradtx._transforms.noise import path_key, raw_key
from gradtx._transforms.per_example_clipping import clipped_sums, per_example_leaves
from gradtx._transforms.scale import ScalarOrSchedule

_PER_PATH = "keeps one random stream per path and takes per-example gradients"


class DifferentiallyPrivateAggregate(Transformation, KeepsStatistics):
    """Clip per example, sum, add noise, average (see `differentially_private_aggregate`)."""

    name: ClassVar[str] = "differentially_private_aggregate"
    gradients_like_params: ClassVar[bool] = False  # a batch of them per parameter
    l2_norm_clip: Any = hyperparam(check=positive, required=True)
    noise_multiplier: Any = hyperparam(check=non_negative, required=True)
    key: Any = field(default=0, converter=raw_key)
    keep_statistics: bool = static(True)

    def state_keys(self) -> tuple[str, ...]:
        """The statistic `num_clipped` (none without statistics) and each path's `rng_key`."""
        return ("num_clipped", "rng_key") if self.keep_statistics else ("rng_key",)

    def init_state(self, params: Params) -> dict:
        """`num_clipped` 0 and the key `fold_in(key, crc32(path))` for every path."""
        reject_packed(params, self.name, _PER_PATH)
        seed = jnp.asarray(self.key, jnp.uint32)
        keys = init_slots(params, lambda p: {"rng_key": seed}, ("rng_key",))["rng_key"]
        state = {"rng_key": {p: path_key(k, p) for p, k in keys.items()}}
        if not self.keep_statistics:
            return state
        return statistics(num_clipped=jnp.zeros((), jnp.int32), **state)

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """The noisy mean over the leading batch axis of the clipped per-example gradients."""
        check_state_keys(self.name, state, self.state_keys())
        paths, treedef, present, batch = per_example_leaves(updates, self.name)
        if not present:
            return updates, state
        sums, num_clipped = clipped_sums(present, self.l2_norm_clip)
        std = self.l2_norm_clip * self.noise_multiplier

        def noisy_mean(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            dtype = compute_dtype(g)
            key, sample = jax.random.split(slots["rng_key"])
            noise = jax.random.normal(sample, g.shape, dtype)
            u = (g.astype(dtype) + std.astype(dtype) * noise) / jnp.asarray(batch, dtype)
            return u, {"rng_key": key}

        new_updates, keys = update_slots(
            noisy_mean,
            treedef.unflatten([sums.get(p) for p in paths]),
            {"rng_key": state["rng_key"]},
            params,
            owner=self.name,
        )
        if not self.keep_statistics:
            return new_updates, {"rng_key": keys["rng_key"]}
        return new_updates, statistics(num_clipped=num_clipped, rng_key=keys["rng_key"])


def _key_or_seed(key: Any, seed: Any) -> Any:
    if seed is not None and key is not None:
        raise ValueError(
            "differentially_private_aggregate: pass `key` or its older name `seed`, not both."
        )
    chosen = seed if key is None else key
    return 0 if chosen is None else chosen


def differentially_private_aggregate(
    l2_norm_clip: float,
    noise_multiplier: float,
    key: int | jax.Array | None = None,
    *,
    seed: int | None = None,
) -> DifferentiallyPrivateAggregate:
    r"""Aggregate per-example gradients as DP-SGD does: clip each, sum, add noise, average.

    The update takes **per-example gradients**: every leaf has a leading batch axis of size
    $B$ (for instance from `jax.vmap(jax.grad(loss), (None, 0))(params, batch)`), and returns
    an update shaped like the params:

    $$u = \frac{1}{B}\left(\sum_{i=1}^{B} g_i \min\!\left(1, \frac{C}{\lVert g_i\rVert}\right)
      + \sigma C\, \xi\right),\qquad \xi \sim \mathcal N(0, I)$$

    with $\lVert g_i\rVert$ the global norm of example $i$'s gradient over every leaf, $C$ =
    `l2_norm_clip` and $\sigma$ = `noise_multiplier` (the clipping is
    `gradtx.per_example_global_norm_clip`). Each path has its own random stream, so a path's
    noise does not depend on which other paths are present: its key starts as
    `jax.random.fold_in(key, zlib.crc32(path))` and each update draws
    `jax.random.normal(sample, shape)` (in at least float32) after
    `key, sample = jax.random.split(key)`. optax splits one key over the leaves instead, so
    the two draw different (equally distributed) noise. Place it first in a chain: what
    follows sees ordinary, batch-averaged updates. Gradient accumulation (`accumulate`,
    `apply_every`) defeats the privacy accounting. Packed and complex params are refused.

    Args:
        l2_norm_clip: the largest global norm $C$ of one example's gradient.
        noise_multiplier: the noise's standard deviation relative to $C$.
        key: an int seed or a `jax.random` key (default 0).
        seed: optax's older name for `key`.

    State:
        `num_clipped`: an int32 statistic, how many examples the last update clipped
        (reported by `gradtx.stats`, left out by `gradtx.without_statistics`);
        `rng_key/<path>`: the raw uint32 key of each path's noise stream.

    Examples:
        >>> tx = gradtx.contrib.differentially_private_aggregate(5.0, 0.0, key=0)
        >>> per_example = {"w": jnp.array([[6.0, 8.0], [1.0, 0.0]])}  # two examples
        >>> u, state = tx.update(per_example, tx.init({"w": jnp.zeros(2)}))
        >>> u["w"], state["num_clipped"]  # ([3, 4] + [1, 0]) / 2: the first clipped to 5
        (Array([2., 2.], dtype=float32), Array(1, dtype=int32))

    References:
        Abadi et al., "Deep Learning with Differential Privacy", ACM CCS 2016.
    """
    return DifferentiallyPrivateAggregate(l2_norm_clip, noise_multiplier, _key_or_seed(key, seed))


def dpsgd(
    learning_rate: ScalarOrSchedule,
    l2_norm_clip: float,
    noise_multiplier: float,
    seed: int | jax.Array,
    momentum: float | None = None,
    nesterov: bool = False,
) -> Any:
    r"""DP-SGD: SGD (with optional momentum) on privately aggregated per-example gradients.

    `chain(differentially_private_aggregate(l2_norm_clip, noise_multiplier, seed),
    trace(momentum, nesterov), scale_by_learning_rate(learning_rate))`, the momentum left
    out when it is `None`:

    $$\tilde g = \frac{1}{B}\Big(\sum_i \mathrm{clip}_C(g_i) + \sigma C \xi\Big),\qquad
      \theta_t = \theta_{t-1} - \eta\, \tilde g\ \ (\text{or its momentum})$$

    `update` takes per-example gradients, with a leading batch axis on every leaf (see
    `differentially_private_aggregate`). The privacy guarantee depends on $\sigma$, the
    sampling rate and the number of steps; account for it with a privacy accountant.

    Args:
        learning_rate: a number or a schedule.
        l2_norm_clip: the largest global norm $C$ of one example's gradient.
        noise_multiplier: the noise's standard deviation relative to $C$.
        seed: an int seed or a `jax.random` key for the noise.
        momentum: the momentum's decay, or `None` for none.
        nesterov: use Nesterov momentum.

    State:
        `num_clipped`, `rng_key/<path>`; `trace/<path>` with momentum;
        `schedule_count/<path>` with a learning-rate schedule.

    Examples:
        >>> tx = gradtx.contrib.dpsgd(0.1, l2_norm_clip=1.0, noise_multiplier=1.1, seed=0)
        >>> params = {"w": jnp.zeros(3)}
        >>> sorted(gradtx.state_dict(tx.init(params)))
        ['num_clipped', 'rng_key/w']
        >>> u, _ = tx.update({"w": jnp.ones((8, 3))}, tx.init(params))  # 8 examples
        >>> u["w"].shape
        (3,)

    References:
        Abadi et al., "Deep Learning with Differential Privacy", ACM CCS 2016.
    """
    steps: list[Any] = [differentially_private_aggregate(l2_norm_clip, noise_multiplier, seed)]
    if momentum is not None:
        steps.append(trace(momentum, nesterov))
    return descent("dpsgd", learning_rate, *steps)
