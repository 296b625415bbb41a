"""Execution layouts for an Adam step on a tree of many small leaves, measured side by side.

    python -m benchmarks.lab.layouts            # 2000 leaves (kernels (32, 64), biases (2048,))
    python -m benchmarks.lab.layouts --leaves 500

Each layout is written in plain JAX (no gradtx, no optax internals), so what is measured is
the layout alone: how many per-leaf kernels, outputs and distinct kernel bodies XLA has to
compile and launch. The docs' performance page quotes these figures.

- `per-leaf, shared count`: moments per leaf, one step count (optax's layout).
- `per-leaf, count per path`: moments and a step count per leaf (gradtx's tree layout today,
  which keeps partial updates exact).
- `per-leaf, count per path, corrections once`: the same state plus each leaf's index kept in
  the state (a runtime value); the bias corrections of all paths are computed in one kernel
  over the vector of counts and each leaf reads its own at its index, so no leaf has scalar
  kernels of its own.
- `bucketed`: the moments in one flat buffer, the gradients concatenated into it, the Adam
  math once over the buffer, and each parameter updated from its slice of the flat update at
  an offset kept in the state (a runtime value, so every leaf of one shape shares a kernel).
- `bucketed, static offsets`: the same with the offsets baked in as constants (each slice is
  a distinct kernel); run with `--static` (it takes about a minute to compile).

Two floors follow the layouts: what any step on a tree of params pays before its own math.
`params returned` takes the params (donated) and the gradients and returns the params as
they came; `p + g` adds each gradient to its param, one kernel per leaf and no state.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

B1, B2, LR, EPS = 0.9, 0.999, 1e-3, 1e-8
CHUNK = 64  # leaves per inner concatenation: one flat concatenation of 2000 operands is 2x slower


def _tree(n: int, seed: int) -> dict[str, jax.Array]:
    key = jax.random.PRNGKey(seed)
    shapes = [(32, 64), (2048,)] * (n // 2)
    return {
        f"{i:05d}": 0.02 * jax.random.normal(jax.random.fold_in(key, i), s)
        for i, s in enumerate(shapes)
    }


def _adam_math(g: Any, mu: Any, nu: Any, count: Any) -> tuple[Any, Any, Any]:
    mu = B1 * mu + (1 - B1) * g
    nu = B2 * nu + (1 - B2) * g * g
    t = count.astype(jnp.float32)
    u = -LR * (mu / (1 - B1**t)) / (jnp.sqrt(nu / (1 - B2**t)) + EPS)
    return u, mu, nu


def per_leaf(shared_count: bool) -> tuple[Callable, Callable]:
    def init(params: dict) -> dict:
        def zeros() -> dict:
            return {k: jnp.zeros_like(p) for k, p in params.items()}

        counts = jnp.int32(0) if shared_count else {k: jnp.int32(0) for k in params}
        return {"mu": zeros(), "nu": zeros(), "count": counts}

    def step(params: dict, state: dict, grads: dict) -> tuple[dict, dict]:
        new_p, mu, nu = {}, {}, {}
        counts = state["count"] + 1 if shared_count else {}
        for k, p in params.items():
            c = counts if shared_count else state["count"][k] + 1
            if not shared_count:
                counts[k] = c
            u, mu[k], nu[k] = _adam_math(grads[k], state["mu"][k], state["nu"][k], c)
            new_p[k] = p + u
        return new_p, {"mu": mu, "nu": nu, "count": counts}

    return init, step


def per_leaf_corrections_once() -> tuple[Callable, Callable]:
    def init(params: dict) -> dict:
        state = per_leaf(shared_count=False)[0](params)
        state["index"] = {k: jnp.int32(i) for i, k in enumerate(params)}
        return state

    def step(params: dict, state: dict, grads: dict) -> tuple[dict, dict]:
        counts = {k: c + 1 for k, c in state["count"].items()}
        flat = [counts[k] for k in params]
        t = jnp.concatenate([jnp.stack(flat[i : i + CHUNK]) for i in range(0, len(flat), CHUNK)])
        t = t.astype(jnp.float32)
        corrections = (1 - B1**t, 1 - B2**t)
        new_p, mu, nu = {}, {}, {}
        for k, p in params.items():
            c1, c2 = (
                jax.lax.dynamic_index_in_dim(c, state["index"][k], 0, False) for c in corrections
            )
            m = B1 * state["mu"][k] + (1 - B1) * grads[k]
            v = B2 * state["nu"][k] + (1 - B2) * grads[k] * grads[k]
            mu[k], nu[k] = m, v
            new_p[k] = p - LR * (m / c1) / (jnp.sqrt(v / c2) + EPS)
        return new_p, {**state, "mu": mu, "nu": nu, "count": counts}

    return init, step


def bucketed(static_offsets: bool) -> tuple[Callable, Callable]:
    def offsets(params: dict) -> dict[str, int]:
        sizes = [p.size for p in params.values()]
        return dict(zip(params, np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()))

    def init(params: dict) -> dict:
        total = sum(p.size for p in params.values())
        state = {"mu": jnp.zeros(total), "nu": jnp.zeros(total), "count": jnp.int32(0)}
        if not static_offsets:
            state["offset"] = {k: jnp.int32(o) for k, o in offsets(params).items()}
        return state

    def step(params: dict, state: dict, grads: dict) -> tuple[dict, dict]:
        flat = [g.ravel() for g in grads.values()]
        chunks = [jnp.concatenate(flat[i : i + CHUNK]) for i in range(0, len(flat), CHUNK)]
        count = state["count"] + 1
        u, mu, nu = _adam_math(jnp.concatenate(chunks), state["mu"], state["nu"], count)
        # Materialise the flat update: fused into every per-leaf kernel it would be recomputed.
        u, mu, nu = jax.lax.optimization_barrier((u, mu, nu))
        where = offsets(params) if static_offsets else state["offset"]
        new_p = {
            k: p + jax.lax.dynamic_slice(u, (where[k],), (p.size,)).reshape(p.shape)
            for k, p in params.items()
        }
        return new_p, {**state, "mu": mu, "nu": nu, "count": count}

    return init, step


def floors() -> dict[str, tuple[Callable, Callable]]:
    """Steps that do no optimizer math: the cost of a tree's arrays going in and out."""

    def init(params: dict) -> dict:
        return {}

    def returned(params: dict, state: dict, grads: dict) -> tuple[dict, dict]:
        return params, state

    def added(params: dict, state: dict, grads: dict) -> tuple[dict, dict]:
        return {k: p + grads[k] for k, p in params.items()}, state

    return {"floor: params returned": (init, returned), "floor: p + g": (init, added)}


def measure(init: Callable, step: Callable, params: dict, grads: dict, reps: int) -> dict:
    state = init(params)
    jitted = jax.jit(step, donate_argnums=(0, 1))
    t0 = time.perf_counter()
    compiled = jitted.lower(params, state, grads).compile()
    compile_s = time.perf_counter() - t0
    p, s = jax.tree.map(jnp.copy, params), state
    p, s = jax.block_until_ready(compiled(p, s, grads))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        p, s = jax.block_until_ready(compiled(p, s, grads))
        times.append(time.perf_counter() - t0)
    outputs = len(jax.tree.leaves((p, s)))
    # One step from the initial params, to check that the layouts compute the same thing.
    first, _ = jax.jit(step)(params, init(params), grads)
    return {
        "compile_s": compile_s,
        "step_ms": statistics.median(times) * 1e3,
        "outputs": outputs,
        "first_step": first,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--static", action="store_true", help="also the static-offset layout")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    params, grads = _tree(args.leaves, 0), _tree(args.leaves, 1)
    layouts = {
        "per-leaf, shared count": per_leaf(shared_count=True),
        "per-leaf, count per path": per_leaf(shared_count=False),
        "per-leaf, count per path, corrections once": per_leaf_corrections_once(),
        "bucketed": bucketed(static_offsets=False),
    }
    if args.static:
        layouts["bucketed, static offsets"] = bucketed(static_offsets=True)
    rows = []
    print(f"{args.leaves} leaves, Adam, donated jitted step")
    print(f"{'layout':<44}{'outputs':>9}{'compile s':>11}{'step ms':>9}{'max |diff|':>12}")
    for name, (init, step) in layouts.items():
        row = {"layout": name, **measure(init, step, params, grads, args.reps)}
        reference = rows[0]["first_step"] if rows else row["first_step"]
        row["max_abs_diff"] = max(
            float(jnp.max(jnp.abs(row["first_step"][k] - reference[k]))) for k in params
        )
        rows.append(row)
        print(
            f"{name:<44}{row['outputs']:>9}{row['compile_s']:>11.2f}{row['step_ms']:>9.2f}"
            f"{row['max_abs_diff']:>12.2e}"
        )
    for name, (init, step) in floors().items():
        row = {"layout": name, **measure(init, step, params, grads, args.reps)}
        row["max_abs_diff"] = None  # no Adam step to compare
        rows.append(row)
        print(f"{name:<44}{row['outputs']:>9}{row['compile_s']:>11.2f}{row['step_ms']:>9.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "first_step"} for r in rows], f)
    return rows


if __name__ == "__main__":
    main()
