"""Optimizer configurations, each built the same way in gradtx and in optax."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    gradtx: Callable[[Any], Any]  # workload -> gradtx transformation
    optax: Callable[[Any], Any]  # workload -> optax transformation
    bytes_per_param: Callable[[int, int], int]  # (param bytes, state bytes) -> bytes moved
    # workload -> whether this config runs on it (e.g. it needs paths optax cannot see inside
    # packed buffers, or parameters named `bias`)
    applies: Callable[[Any], bool] = lambda w: True


def _adam_bytes(p: int, s: int) -> int:
    # read g, p, mu, nu; write p, mu, nu (the gradient has the params' dtype)
    return 3 * p + 2 * s + 2 * s


def _clipped_bytes(p: int, s: int) -> int:
    # Adam's bytes, plus one more read of the gradient: the global norm needs every gradient
    # before any update can be written, so a gradient larger than the cache is read twice.
    return _adam_bytes(p, s) + p


def _sgd_bytes(p: int, s: int) -> int:
    return 3 * p + 2 * s


def _schedule_free_bytes(p: int, s: int) -> int:
    # read g and the params y, write y; read and write z and nu (z in the state's dtype)
    return 3 * p + 4 * s


def _decay_mask(params: Any) -> Any:
    import jax

    return jax.tree_util.tree_map_with_path(lambda kp, _: "bias" not in str(kp[-1]), params)


def _is_bias(params: Any) -> Any:
    import jax

    return jax.tree_util.tree_map_with_path(lambda kp, _: "bias" in str(kp[-1]), params)


def _one_dtype(w: Any) -> bool:
    return w.state_dtype is None


def _tree_params(w: Any) -> bool:
    return not w.packed


def _decays(path: str, leaf: Any) -> bool:
    # A function, not the glob "!**/bias": a glob must match a path, and some workloads
    # (one big leaf) have no bias at all.
    return not path.endswith("bias")


def _has_biases(w: Any) -> bool:
    return not w.packed and any(path.endswith("bias") for path in w.shapes)


def configs() -> list[Config]:
    import jax
    import optax

    import gradtx

    f32 = np.float32

    def g_adam(w):
        return gradtx.adam(1e-3, mu_dtype=w.state_dtype, nu_dtype=w.state_dtype)

    def o_adam(w):
        return optax.adam(1e-3, b1=f32(0.9), b2=f32(0.999), mu_dtype=w.state_dtype)

    def g_clipped(w):
        sched = gradtx.schedules.warmup_cosine_decay(0.0, 1e-3, 100, 10_000)
        return gradtx.chain(
            gradtx.clip_by_global_norm(1.0),
            gradtx.adamw(sched, weight_decay=0.01, mask=_decays, mu_dtype=w.state_dtype),
        )

    def o_clipped(w):
        sched = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 100, 10_000)
        return optax.chain(
            optax.clip_by_global_norm(1.0),
            optax.adamw(sched, weight_decay=0.01, mask=_decay_mask, mu_dtype=w.state_dtype),
        )

    def g_sgd(w):
        return gradtx.sgd(1e-2, momentum=0.9, accumulator_dtype=w.state_dtype)

    def o_sgd(w):
        return optax.sgd(1e-2, momentum=0.9, accumulator_dtype=w.state_dtype)

    def g_lion(w):
        return gradtx.lion(1e-4, mu_dtype=w.state_dtype)

    def o_lion(w):
        return optax.lion(1e-4, b1=f32(0.9), b2=f32(0.99), mu_dtype=w.state_dtype)

    # The paper's schedule-free AdamW in gradtx; optax's puts Adam's bias correction in the
    # second moment instead (tests/combinators/test_schedule_free.py), the same work a step.
    def g_schedule_free(w):
        return gradtx.schedule_free_adamw(1e-3, warmup_steps=100, weight_decay=1e-4)

    def o_schedule_free(w):
        return optax.contrib.schedule_free_adamw(
            1e-3, 100, b1=f32(0.9), b2=f32(0.999), weight_decay=1e-4
        )

    # Two parameter groups, each Adam with its own injected learning rate (biases 3x faster).
    # optax keeps the np.float32 b1 and b2 static (baked into its kernels); gradtx is told to
    # do the same, so both inject the same hyperparameters (learning_rate, eps, eps_root).
    def g_groups(w):
        adam = gradtx.inject_hyperparams(gradtx.adam, static_args=("b1", "b2"))
        kw = {"mu_dtype": w.state_dtype, "nu_dtype": w.state_dtype}
        return gradtx.partition(
            {"weights": adam(1e-3, **kw), "biases": adam(3e-3, **kw)},
            {"biases": "**/bias", "weights": "!**/bias"},
        )

    def o_groups(w):
        adam = optax.inject_hyperparams(optax.adam)
        kw = {"b1": f32(0.9), "b2": f32(0.999), "mu_dtype": w.state_dtype}
        labels = lambda p: jax.tree.map(lambda b: "biases" if b else "weights", _is_bias(p))  # noqa: E731
        return optax.multi_transform(
            {"weights": adam(1e-3, **kw), "biases": adam(3e-3, **kw)}, labels
        )

    def g_bucketed(w):
        return gradtx.bucketed(g_adam(w))

    def g_clipped_bucketed(w):
        return gradtx.bucketed(g_clipped(w))

    return [
        Config("adam", g_adam, o_adam, _adam_bytes),
        # The same Adam with its state in flat buffers (the params stay a tree), against optax's.
        Config("adam, bucketed state", g_bucketed, o_adam, _adam_bytes, applies=_tree_params),
        Config("per-group lr (partition)", g_groups, o_groups, _adam_bytes, applies=_has_biases),
        Config("clip+adamw(cosine, mask)", g_clipped, o_clipped, _clipped_bytes),
        Config(
            "clip+adamw, bucketed state",
            g_clipped_bucketed,
            o_clipped,
            _clipped_bytes,
            applies=_tree_params,
        ),
        Config("sgd momentum", g_sgd, o_sgd, _sgd_bytes),
        Config("lion", g_lion, o_lion, _sgd_bytes),  # read g, p, mu; write p, mu
        # optax's second moment would change dtype between steps with float32 state
        Config(
            "schedule-free adamw",
            g_schedule_free,
            o_schedule_free,
            _schedule_free_bytes,
            applies=_one_dtype,
        ),
    ]
