"""The composition matrix: every ordered pair of combinators, nested both ways, against an
independent per-group NumPy reference (tests/contract/references/combinators.py).

Params have two groups (`enc/...` and `head/...`) and four paths; each combinator is set up
so that it acts differently on different paths (a mask on `**/w`, a partition `enc` / `head`,
a frozen `head/s`, ...). Over six steps the updates must equal the reference's, and no path
may get a zero update where the reference's is not zero (the optax#1101 failure).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import references.combinators as rc

import gradtx
from gradtx import schedules

# A cross product of the registry: left out of `make quick` (see CONTRIBUTING.md).
pytestmark = pytest.mark.slow

SHAPES = {"enc/w": (2, 3), "enc/b": (3,), "head/w": (3,), "head/s": ()}
N_STEPS = 6
SCHEDULE = schedules.linear(0.1, 0.02, 6)


def ref_schedule(t: int) -> float:
    v0, v1 = rc.f32(0.1), rc.f32(0.02)
    return v0 + (v1 - v0) * min(t, 6) / 6


def tree(values: dict[str, Any]) -> dict:
    return {
        "enc": {"w": values["enc/w"], "b": values["enc/b"]},
        "head": {"w": values["head/w"], "s": values["head/s"]},
    }


def flat(t: Any) -> dict[str, np.ndarray]:
    return {p: np.asarray(x) for p, x in gradtx.paths.leaves(t).items() if x is not None}


Build = Callable[[Any], Any]  # learning rate -> gradtx transformation

# name -> (gradtx wrapper of a builder, reference wrapper of a reference node)
COMBINATORS: dict[str, tuple[Callable[[Build], Build], Callable[[Any], Any]]] = {
    "masked": (
        lambda b: lambda lr: gradtx.masked(b(lr), "**/w"),
        lambda r: rc.Masked(r, "**/w"),
    ),
    "partition": (
        lambda b: (
            lambda lr: gradtx.partition(
                {"a": b(lr), "b": gradtx.sgd(0.05, momentum=0.9)}, {"a": "enc", "b": "head"}
            )
        ),
        lambda r: rc.Partition(r, "enc", rc.Sgd(0.05, 0.9)),
    ),
    "freeze": (
        lambda b: lambda lr: gradtx.freeze(b(lr), "head/s"),
        lambda r: rc.Freeze(r, "head/s"),
    ),
    "inject_hyperparams": (
        lambda b: lambda lr: gradtx.inject_hyperparams(b)(lr=SCHEDULE),
        lambda r: rc.Inject(r, ref_schedule),
    ),
    "accumulate": (
        lambda b: lambda lr: gradtx.accumulate(b(lr), every=2),
        lambda r: rc.Accumulate(r, 2),
    ),
    "apply_if_finite": (
        lambda b: lambda lr: gradtx.apply_if_finite(b(lr), 2),
        lambda r: rc.ApplyIfFinite(r, 2),
    ),
    "lookahead": (
        lambda b: lambda lr: gradtx.lookahead(b(lr), 2, 0.5),
        lambda r: rc.Lookahead(r, 2, 0.5),
    ),
    "chain": (
        lambda b: lambda lr: gradtx.chain(gradtx.clip_by_global_norm(1.0), b(lr)),
        lambda r: rc.ClipChain(r, 1.0),
    ),
    "schedule_free": (
        lambda b: lambda lr: gradtx.schedule_free(b(lr), lr, b1=0.9),
        lambda r: rc.ScheduleFree(r, 0.1, 0.9),
    ),
    "ema_params": (
        lambda b: lambda lr: gradtx.ema_params(b(lr), decay=0.5),
        lambda r: rc.EmaParams(r, 0.5),
    ),
}

BASES = {
    "adam": (lambda lr: gradtx.adam(lr), rc.Adam(0.1)),
    "sgd": (lambda lr: gradtx.sgd(lr, momentum=0.9), rc.Sgd(0.1, 0.9)),
}

PAIRS = [
    pytest.param(outer, inner, base, id=f"{outer}-{inner}-{base}")
    for outer, inner in itertools.permutations(COMBINATORS, 2)
    for base in BASES
]


def _inputs(with_nan: bool) -> tuple[dict, list[dict]]:
    rng = np.random.default_rng(7)
    params = {p: rng.normal(size=s).astype(np.float32) for p, s in SHAPES.items()}
    grads = []
    for t in range(N_STEPS):
        g = {p: (0.5 * rng.normal(size=s)).astype(np.float32) for p, s in SHAPES.items()}
        if with_nan and t == 2:
            g["enc/w"] = g["enc/w"].copy()
            g["enc/w"][0, 0] = np.nan
        grads.append(g)
    return params, grads


@pytest.mark.parametrize(("outer", "inner", "base"), PAIRS)
def test_pair_matches_the_per_group_reference(outer: str, inner: str, base: str) -> None:
    wrap_outer, ref_outer = COMBINATORS[outer]
    wrap_inner, ref_inner = COMBINATORS[inner]
    build, ref_base = BASES[base]
    tx = wrap_outer(wrap_inner(build))(0.1)
    ref = ref_outer(ref_inner(ref_base))

    params, grads = _inputs(with_nan="apply_if_finite" in (outer, inner))
    state = tx.init(tree({p: jnp.asarray(x) for p, x in params.items()}))
    ref_params = {p: x.astype(np.float64) for p, x in params.items()}
    ref_state = ref.init(ref_params)
    p_tree = tree({p: jnp.asarray(x) for p, x in params.items()})

    @jax.jit
    def step(p_tree, state, g_tree):
        u, state = tx.update(g_tree, state, p_tree)
        return gradtx.apply_updates(p_tree, u), u, state

    for t, g in enumerate(grads):
        p_tree, u, state = step(p_tree, state, tree({p: jnp.asarray(x) for p, x in g.items()}))
        ref_u, ref_state = ref.update(g, ref_state, ref_params, None)
        ref_params = {p: ref_params[p] + ref_u[p] for p in ref_params}
        got = flat(u)
        assert set(got) == set(ref_u)
        for path, want in ref_u.items():
            if np.any(want != 0):
                assert np.any(got[path] != 0), f"step {t}: {path} got a zero update"
            np.testing.assert_allclose(
                got[path], want, rtol=2e-5, atol=1e-6, err_msg=f"step {t}, path {path}"
            )
    for path, value in flat(p_tree).items():
        np.testing.assert_allclose(value, ref_params[path], rtol=2e-5, atol=1e-6, err_msg=path)
