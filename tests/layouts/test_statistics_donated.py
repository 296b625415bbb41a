"""A donated step gives each statistic's buffer to its new value, and copies no scalar."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled import donated_step_program

import gradtx
from gradtx._core.statistics import reading_replaced, statistics


def _schedule():
    return gradtx.schedules.warmup_cosine_decay(0.0, 1e-3, 10, 100)


# States in which a statistic, written and never read, comes before scalars the step reads.
WITH_STATISTICS = {
    "schedule_free_adamw": lambda: gradtx.schedule_free_adamw(1e-3, warmup_steps=10),
    "clip, then injected lion": lambda: gradtx.chain(
        gradtx.clip_by_global_norm(1.0), gradtx.inject_hyperparams(gradtx.lion)(1e-4)
    ),
    "scheduled sgd, then injected adam": lambda: gradtx.partition(
        {"a": gradtx.sgd(_schedule()), "c": gradtx.inject_hyperparams(gradtx.adam)(1e-3)},
        {"a": "a/**", "c": "c/**"},
    ),
}


def _params() -> dict:
    return {
        "a": {"w": jnp.ones((8, 16)), "b": jnp.zeros(16)},
        "c": {"w": jnp.ones((16, 4)), "b": jnp.zeros(4)},
    }


@pytest.mark.parametrize("layout", ["tree", "packed"])
@pytest.mark.parametrize("name", sorted(WITH_STATISTICS))
def test_a_donated_step_copies_no_scalar(name, layout):
    # JAX drops an unused input and its donation; the scalars behind it would each be
    # aliased to the buffer of the one before, and XLA copies them to keep those aliases
    # (schedule-free AdamW on one leaf: 4 scalar copies beside its 10 fusions).
    tx = WITH_STATISTICS[name]()
    params = _params()
    if layout == "packed":  # a buffer per group, as a partition needs
        params = {group: gradtx.pack(leaves) for group, leaves in params.items()}
    grads = jax.tree.map(lambda x: 0.1 * jnp.ones_like(x), params)

    entry = donated_step_program(tx, params, grads)
    assert gradtx.stats(tx.init(params))  # it does keep statistics
    assert re.findall(r"= \w+\[\] copy\(", entry) == []


def test_the_statistics_keep_their_new_values():
    tx = WITH_STATISTICS["clip, then injected lion"]()
    params = _params()
    grads = jax.tree.map(lambda x: 3.0 * jnp.ones_like(x), params)
    state = tx.init(params)
    _, state = jax.jit(tx.update, donate_argnums=(1,))(grads, state, params)
    norm = np.sqrt(sum(9.0 * x.size for x in jax.tree.leaves(params)))
    np.testing.assert_allclose(
        gradtx.stats(state)["clip_by_global_norm/global_norm"], norm, rtol=1e-6
    )


def test_only_scalar_statistics_of_the_same_kind_read_their_old_value():
    old = {"s": statistics(norm=jnp.float32(1)), "mu": {"w": jnp.zeros(3)}, "n": jnp.int32(0)}
    new = {"s": statistics(norm=jnp.float32(2)), "mu": {"w": jnp.ones(3)}, "n": jnp.int32(1)}
    jaxpr = jax.make_jaxpr(reading_replaced)(new, old)
    (select,) = [e for e in jaxpr.eqns if e.primitive.name == "select_n"]
    assert select.outvars[0].aval.shape == ()
    got = jax.jit(reading_replaced)(new, old)
    assert got["s"]["norm"] == 2 and type(next(iter(got["s"]))) is type(next(iter(new["s"])))
    np.testing.assert_array_equal(got["mu"]["w"], np.ones(3))
