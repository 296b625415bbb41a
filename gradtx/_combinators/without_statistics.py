"""`without_statistics`: a transformation whose state keeps no statistics on the side."""

from __future__ import annotations

from typing import Any

import jax

from gradtx._core.statistics import KeepsStatistics


def _keeps_statistics(node: Any) -> bool:
    return isinstance(node, KeepsStatistics)


def without_statistics(tx: Any) -> Any:
    """`tx`, rebuilt so that its state keeps none of the statistics its steps never read.

    Some transformations record statistics on the side, for `gradtx.stats` to read: the
    pre-clip norm of `clip_by_global_norm` and whether it clipped, the value a schedule gave
    the last step (`scheduled/learning_rate` of `adamw(schedule)`), the `info` of the line
    searches and the counts of clipped examples (`num_clipped`) of the per-example clipping
    transformations and `contrib.differentially_private_aggregate`. Each is an array in and
    out of every step. On a step bound by the host (a small model, most of all on a GPU),
    each costs about as much as a parameter leaf; the compiled step also computes and
    returns it. Without them, the updates are the same, bit for bit, and the
    state is the one optax keeps: for the chain `clip_by_global_norm` then `adamw` with a
    cosine schedule on packed params, the compiled step returns optax's five arrays instead
    of eight and runs no more kernels than optax's, so a host-bound step costs about what
    optax's does (benchmarks/lab/host_overhead.py).

    What stays: `gradtx.monitor` (it is there to record), and the state that decides what a
    step does: the counts of `apply_if_finite` and the hyperparameters of
    `inject_hyperparams` (its inner transformation loses its statistics too).

    The transformation is rebuilt wherever it sits in `tx` (inside `chain`, `partition`,
    `masked`, `inject_hyperparams`, ...); one without such statistics, or an optax
    transformation, comes back unchanged. Its state is a new layout: make it with the new
    transformation's `init` (or move a checkpoint over with `gradtx.load_state_dict`,
    `strict=False`, which reports the statistics it leaves behind).

    Args:
        tx: a transformation.

    Returns:
        The same transformation without the statistics.

    Examples:
        >>> sched = gradtx.schedules.cosine_decay(1e-3, 1000)
        >>> tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(sched))
        >>> params = {"w": jnp.zeros(2)}
        >>> sorted(gradtx.stats(tx.init(params)))
        ['adamw/scheduled/learning_rate', 'clip_by_global_norm/clipped',
         'clip_by_global_norm/global_norm']
        >>> lean = gradtx.without_statistics(tx)
        >>> gradtx.stats(lean.init(params))
        {}
        >>> sorted(gradtx.state_dict(lean.init(params)))
        ['adamw/count/w', 'adamw/mu/w', 'adamw/nu/w', 'adamw/schedule_count/w']
    """

    def strip(node: Any) -> Any:
        return node.without_statistics() if _keeps_statistics(node) else node

    return jax.tree.map(strip, tx, is_leaf=_keeps_statistics)
