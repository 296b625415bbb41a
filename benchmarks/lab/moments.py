"""Adam's two moments kept in two arrays or side by side in one, measured in one process.

    python -m benchmarks.lab.moments                 # 33.5M-element leaf and transformer-like tree
    python -m benchmarks.lab.moments --size 1000000  # a smaller leaf

XLA's CPU backend computes Adam on a large leaf in three kernels: the first moment, the
second moment (each reads the gradient), then the parameter: 40 bytes per float32
parameter. Kept side by side in one `(..., 2)` array and updated by one kernel that picks
each lane's formula with a `where` on the lane index, the moments read the gradient once:
36 bytes. Both layouts are written here in plain JAX (no gradtx, no optax) and timed in
alternating blocks of donated jitted steps, so that the machine's drift between processes
does not enter the ratio. The docs' performance page quotes these figures.
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
from jax import lax

B1, B2, LR, EPS = 0.9, 0.999, 1e-3, 1e-8


def _corrections(count: jax.Array) -> tuple[jax.Array, jax.Array]:
    t = count.astype(jnp.float32)
    return 1 - B1**t, 1 - B2**t


def _new_param(p: jax.Array, mu: jax.Array, nu: jax.Array, c1: Any, c2: Any) -> jax.Array:
    u = -LR * (mu / c1) / (jnp.sqrt(nu / c2) + EPS)
    return (p.astype(jnp.float32) + u).astype(p.dtype)


def two_arrays() -> tuple[Callable, Callable]:
    """`mu` and `nu` each an array shaped like the parameter (optax's and gradtx's layout)."""

    def init(params: dict) -> dict:
        def zeros() -> dict:  # a buffer of its own for each slot: both are donated
            return {k: jnp.zeros(p.shape, jnp.float32) for k, p in params.items()}

        return {"mu": zeros(), "nu": zeros(), "count": jnp.zeros((), jnp.int32)}

    def step(params: dict, state: dict, grads: dict) -> tuple[dict, dict]:
        count = state["count"] + 1
        c1, c2 = _corrections(count)
        new_p, mus, nus = {}, {}, {}
        for k, p in params.items():
            g = grads[k].astype(jnp.float32)
            mus[k] = B1 * state["mu"][k] + (1 - B1) * g
            nus[k] = B2 * state["nu"][k] + (1 - B2) * g * g
            new_p[k] = _new_param(p, mus[k], nus[k], c1, c2)
        return new_p, {"mu": mus, "nu": nus, "count": count}

    return init, step


def one_array() -> tuple[Callable, Callable]:
    """Both moments in one `(..., 2)` array per parameter: lane 0 is `mu`, lane 1 is `nu`."""

    def init(params: dict) -> dict:
        moments = {k: jnp.zeros((*p.shape, 2), jnp.float32) for k, p in params.items()}
        return {"moments": moments, "count": jnp.zeros((), jnp.int32)}

    def step(params: dict, state: dict, grads: dict) -> tuple[dict, dict]:
        count = state["count"] + 1
        c1, c2 = _corrections(count)
        new_p, moments = {}, {}
        for k, p in params.items():
            old = state["moments"][k]
            g = grads[k].astype(jnp.float32)[..., None]
            # One kernel writes both lanes; `jnp.stack([mu, nu], -1)` is a slow kernel on CPU.
            lane = lax.broadcasted_iota(jnp.int32, old.shape, old.ndim - 1)
            new = jnp.where(lane == 0, B1 * old + (1 - B1) * g, B2 * old + (1 - B2) * g * g)
            moments[k] = new
            new_p[k] = _new_param(p, new[..., 0], new[..., 1], c1, c2)
        return new_p, {"moments": moments, "count": count}

    return init, step


LAYOUTS = {"two arrays": two_arrays, "one (..., 2) array": one_array}


def transformer_shapes(layers: int = 12, width: int = 384, vocab: int = 8192) -> dict:
    """The transformer-like tree of the benchmark suite (about 20M params in 147 leaves)."""
    from benchmarks.workloads import transformer_like

    return dict(transformer_like(layers, width, vocab).shapes)


def _params(shapes: dict, dtype: str, seed: int = 0) -> tuple[dict, dict]:
    key = jax.random.PRNGKey(seed)
    params, grads = {}, {}
    for i, (k, s) in enumerate(shapes.items()):
        kp, kg = jax.random.split(jax.random.fold_in(key, i))
        params[k] = (0.02 * jax.random.normal(kp, s)).astype(dtype)
        grads[k] = (0.01 * jax.random.normal(kg, s)).astype(dtype)
    return params, grads


def measure(shapes: dict, dtype: str, reps: int, rounds: int) -> dict:
    """Median donated step time per layout (alternating blocks), and whether results agree."""
    params, grads = _params(shapes, dtype)
    compiled, carries = {}, {}
    for name, make in LAYOUTS.items():
        init, step = make()
        carry = (jax.tree.map(jnp.copy, params), init(params))
        compiled[name] = jax.jit(step, donate_argnums=(0, 1)).lower(*carry, grads).compile()
        carries[name] = compiled[name](*carry, grads)
    times: dict[str, list[float]] = {name: [] for name in LAYOUTS}
    names = list(LAYOUTS)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            carry = carries[name]
            for _ in range(reps):
                t0 = time.perf_counter()
                carry = jax.block_until_ready(compiled[name](*carry, grads))
                times[name].append(time.perf_counter() - t0)
            carries[name] = carry
    # Both layouts took the same steps from the same params: compare where they ended.
    final = [[np.asarray(carries[n][0][k], np.float32) for k in shapes] for n in LAYOUTS]
    max_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(*final))
    row = {
        "leaves": len(shapes),
        "params": int(sum(np.prod(s) for s in shapes.values())),
        "dtype": dtype,
        "max_abs_diff": max_diff,
    }
    for name in LAYOUTS:
        row[f"{name} ms"] = statistics.median(times[name]) * 1e3
    row["ratio"] = row["one (..., 2) array ms"] / row["two arrays ms"]
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32 * 1024 * 1024, help="the big leaf")
    parser.add_argument("--layers", type=int, default=12, help="the transformer-like tree's")
    parser.add_argument("--width", type=int, default=384, help="the transformer-like tree's")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    tree = transformer_shapes(args.layers, args.width, args.vocab)
    cases = [
        ("one big leaf", {"w": (args.size,)}, "float32"),
        ("transformer-like", tree, "float32"),
        ("transformer-like, bf16 params", tree, "bfloat16"),
    ]
    print(
        f"{'case':<32}{'params':>11}{'two arrays':>12}{'one array':>11}{'ratio':>7}{'max diff':>10}"
    )
    rows = []
    for name, shapes, dtype in cases:
        row = {"case": name, **measure(shapes, dtype, args.reps, args.rounds)}
        rows.append(row)
        print(
            f"{name:<32}{row['params']:>11}{row['two arrays ms']:>12.2f}"
            f"{row['one (..., 2) array ms']:>11.2f}{row['ratio']:>7.2f}"
            f"{row['max_abs_diff']:>10.1e}",
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
