"""A donated step writes its step counts in place, and a count stops at the largest int32."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compiled import donated_step_program

import gradtx
from gradtx._layouts.step_counts import next_count

TOP = int(np.iinfo(np.int32).max)


def _schedule():
    return gradtx.schedules.warmup_cosine_decay(0.0, 1e-3, 10, 100)


# Optimizers whose counts are read by bias corrections, schedules or first-step tests.
COUNTING = {
    "adam": lambda: gradtx.adam(1e-3),
    "adamw, scheduled": lambda: gradtx.adamw(_schedule(), mask="!**/b"),
    "clipped adamw chain": lambda: gradtx.chain(
        gradtx.clip_by_global_norm(1.0), gradtx.adamw(_schedule(), mask="!**/b")
    ),
    "nadam": lambda: gradtx.nadam(1e-3),
    "amsgrad": lambda: gradtx.amsgrad(1e-3),
    "radam": lambda: gradtx.radam(1e-3),
    "yogi": lambda: gradtx.yogi(1e-3),
    "lars, scheduled": lambda: gradtx.lars(_schedule()),
    "fromage, scheduled": lambda: gradtx.fromage(_schedule()),
    "sgd, scheduled": lambda: gradtx.sgd(_schedule(), momentum=0.9),
    "lion, scheduled": lambda: gradtx.lion(_schedule()),
    "ema_params(adam)": lambda: gradtx.ema_params(gradtx.adam(1e-3), 0.99),
    "ema, debiased": lambda: gradtx.chain(gradtx.ema(0.9), gradtx.sgd(1e-3)),
    "apply_if_finite(adam)": lambda: gradtx.apply_if_finite(gradtx.adam(1e-3), 3),
    "rmsprop, bias-corrected": lambda: gradtx.chain(
        gradtx.scale_by_rms(bias_correction=True), gradtx.scale(-1e-3)
    ),
    "contrib.madgrad": lambda: gradtx.contrib.madgrad(1e-3),
    "contrib.ademamix": lambda: gradtx.contrib.ademamix(1e-3),
    "contrib.simplified_ademamix": lambda: gradtx.contrib.simplified_ademamix(1e-3),
}


def _params() -> dict:
    return {
        "a": {"w": jnp.ones((8, 16)), "b": jnp.zeros(16)},
        "c": {"w": jnp.ones((16, 4)), "b": jnp.zeros(4)},
    }


def _laid_out(tree: dict, layout: str):
    return gradtx.pack(tree) if layout == "packed" else tree


# A cross product of the catalogue and the layouts: `make test` runs it, `make quick` does not.
@pytest.mark.slow
@pytest.mark.parametrize("layout", ["tree", "packed", "bucketed"])
@pytest.mark.parametrize("name", sorted(COUNTING))
def test_a_donated_step_writes_its_counts_in_place(name, layout):
    # When several kernels read the old count, XLA copies the donated count before writing
    # the new one in place: a kernel more per count and step. Adam's step had 7 kernels
    # where optax's has 6; bucketed state had one such copy per bucket.
    tx = COUNTING[name]()
    if layout == "bucketed":
        tx = gradtx.bucketed(tx)
    params = _laid_out(_params(), layout)
    grads = jax.tree.map(lambda x: 0.1 * jnp.ones_like(x), params)
    entry = donated_step_program(tx, params, grads)
    assert "s32[] parameter(" in entry  # it does carry a count
    assert re.findall(r"= s32\[\] copy\(", entry) == []


def test_adafactor_writes_its_per_leaf_counts_in_place():
    # Each leaf keeps its own count (its factored statistics refuse packed params), and a
    # plain `count + 1` read by the decay's kernels had XLA copy two counts per leaf and step,
    # as in optax's adafactor.
    grads = jax.tree.map(lambda x: 0.1 * jnp.ones_like(x), _params())
    entry = donated_step_program(gradtx.adafactor(1e-3), _params(), grads)
    assert entry.count("s32[] parameter(") == 4
    assert re.findall(r"= s32\[\] copy\(", entry) == []


def test_next_count_adds_one_until_the_largest_int32():
    assert int(next_count(jnp.int32(0))) == 1
    assert int(next_count(jnp.int32(TOP - 1))) == TOP
    assert int(next_count(jnp.int32(TOP))) == TOP
    assert next_count(jnp.int32(3)).dtype == jnp.int32


@pytest.mark.parametrize("layout", ["tree", "packed"])
def test_a_count_at_the_largest_int32_stays_there(layout):
    # A wrapping count would turn negative and Adam's bias correction 1 - b1**t would blow
    # up; a saturated one keeps the correction at 1.
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(_schedule()))
    params = _laid_out(_params(), layout)
    grads = jax.tree.map(lambda x: 0.1 * jnp.ones_like(x), params)
    state = jax.tree.map(
        lambda x: jnp.full_like(x, TOP) if x.dtype == jnp.int32 else x, tx.init(params)
    )
    updates, state = jax.jit(tx.update)(grads, state, params)
    counts = [x for x in jax.tree.leaves(state) if x.dtype == jnp.int32]
    assert len(counts) == 2  # Adam's count and the schedule's
    assert [int(c) for c in counts] == [TOP, TOP]
    for u in jax.tree.leaves(updates):
        assert bool(jnp.all(jnp.isfinite(u)))
