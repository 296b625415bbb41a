"""Whole training steps (model gradient + optimizer update) on many small leaves.

Compares three ways to train the same model with Adam: params as a tree with optax, as a
tree with gradtx, and packed with gradtx (`gradtx.pack`, the model unpacking its leaves at
runtime offsets). Reports compile time, the donated step time, and the total for compiling
plus a run of steps, with ratios to optax. The last two rows time the model's gradient
alone (no optimizer) on each layout of the params: what the optimizer adds is the difference.
Every variant is compiled first; their steps are then timed in blocks that alternate between
the variants, so that the machine's drift between blocks does not decide a ratio.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def blocks_params(blocks: int, seed: int = 0) -> dict:
    """`blocks` pairs of a (32, 64) kernel and a (2048,) bias (the 2000-leaf workload)."""
    key = jax.random.PRNGKey(seed)
    out = {}
    for i in range(blocks):
        k1, k2 = jax.random.split(jax.random.fold_in(key, i))
        out[str(i)] = {
            "kernel": 0.1 * jax.random.normal(k1, (32, 64)),
            "bias": 0.01 * jax.random.normal(k2, (2048,)),
        }
    return {"layers": out}


def model_loss(params: dict, x: jax.Array) -> jax.Array:
    """Each block maps the batch `x` (32, 32) to (32, 64); the loss is the mean square."""
    total = jnp.zeros((), jnp.float32)
    for block in params["layers"].values():
        h = jnp.tanh(x @ block["kernel"] + block["bias"].reshape(32, 64))
        total = total + jnp.mean(h * h)
    return total / len(params["layers"])


def _compile(step: Any, args: tuple) -> tuple[Any, float, list]:
    args = jax.block_until_ready(args)  # not counted as compile time (see benchmarks/run.py)
    t0 = time.perf_counter()
    compiled = step.lower(*args).compile()
    return compiled, time.perf_counter() - t0, list(args)


def _time_rounds(
    compiled: list, args: list[list], reps: int, rounds: int
) -> tuple[list[list[float]], list[float]]:
    """Blocks of `reps` steps of each compiled step, alternating (order reversed every other
    round), so that the machine's drift between blocks reaches every variant alike. Returns
    each variant's step times and its last loss."""
    times: list[list[float]] = [[] for _ in compiled]
    losses = [float("nan")] * len(compiled)
    for r in range(rounds):
        order = range(len(compiled)) if r % 2 == 0 else reversed(range(len(compiled)))
        for i in order:
            params, state, *rest = args[i]
            params, state, _ = jax.block_until_ready(compiled[i](params, state, *rest))
            for _ in range(reps):
                t0 = time.perf_counter()
                params, state, loss = jax.block_until_ready(compiled[i](params, state, *rest))
                times[i].append(time.perf_counter() - t0)
            args[i], losses[i] = [params, state, *rest], float(loss)
    return times, losses


def run_training(
    blocks: int = 1000, reps: int = 10, steps: int = 1000, rounds: int = 6
) -> list[dict]:
    import optax

    import gradtx

    x = jax.random.normal(jax.random.PRNGKey(42), (32, 32))
    rows = []

    def tree_step(tx: Any, apply: Any) -> Any:
        def step(params, state, x):
            loss, grads = jax.value_and_grad(model_loss)(params, x)
            updates, state = tx.update(grads, state, params)
            return apply(params, updates), state, loss

        return jax.jit(step, donate_argnums=(0, 1))

    def packed_step(tx: Any) -> Any:
        def step(packed, state, x, offsets):
            def loss_fn(p):
                return model_loss(p.unpack(offsets), x)

            loss, grads = jax.value_and_grad(loss_fn)(packed)
            updates, state = tx.update(grads, state, packed)
            return gradtx.apply_updates(packed, updates), state, loss

        return jax.jit(step, donate_argnums=(0, 1))

    def gradient_only(packed: bool) -> Any:
        # The model's gradient alone, no optimizer: the part of the step the optimizer's
        # layout does not touch (the params' layout does: packed, the gradient is one buffer).
        def step(params, grads, x, *offsets):
            unpack = (lambda p: p.unpack(*offsets)) if packed else (lambda p: p)
            loss, grads = jax.value_and_grad(lambda p: model_loss(unpack(p), x))(params)
            return params, grads, loss

        p = gradtx.pack(blocks_params(blocks)) if packed else blocks_params(blocks)
        extra = (p.offsets(),) if packed else ()
        zeros = jax.tree.map(jnp.zeros_like, p)
        # Params donated too: returned undonated, they cost a fresh output buffer per step.
        return jax.jit(step, donate_argnums=(0, 1)), (p, zeros, x, *extra)

    variants = {
        "tree, optax": lambda: (
            tree_step(opt := optax.adam(1e-3), optax.apply_updates),
            (p := blocks_params(blocks), opt.init(p), x),
        ),
        "tree, gradtx": lambda: (
            tree_step(gtx := gradtx.adam(1e-3), gradtx.apply_updates),
            (p := blocks_params(blocks), gtx.init(p), x),
        ),
        "packed, gradtx": lambda: (
            packed_step(gtx := gradtx.adam(1e-3)),
            (pk := gradtx.pack(blocks_params(blocks)), gtx.init(pk), x, pk.offsets()),
        ),
        "model gradient only, tree": lambda: gradient_only(packed=False),
        "model gradient only, packed": lambda: gradient_only(packed=True),
    }
    built = [_compile(*build()) for build in variants.values()]
    args = [a for _, _, a in built]
    times, losses = _time_rounds([c for c, _, _ in built], args, reps, rounds)
    for name, (_, compile_s, _), t, loss in zip(variants, built, times, losses):
        step_s = statistics.median(t)
        rows.append(
            {
                "variant": name,
                "leaves": 2 * blocks,
                "compile_s": compile_s,
                "step_ms": step_s * 1e3,
                f"total_{steps}_steps_s": compile_s + steps * step_s,
                "loss": loss,
            }
        )
    base = rows[0]
    for row in rows:
        row["step_ratio"] = row["step_ms"] / base["step_ms"]
        key = f"total_{steps}_steps_s"
        row["total_speedup_vs_optax"] = base[key] / row[key]
    return rows


def format_rows(rows: list[dict], steps: int = 1000) -> str:
    key = f"total_{steps}_steps_s"
    lines = [
        f"{'training step (2 x blocks leaves)':<44}{'compile s':>10}{'step ms':>9}"
        f"{'ratio':>7}{f'cmp+{steps} s':>12}{'speedup':>9}"
    ]
    for r in rows:
        lines.append(
            f"{r['variant'] + ' (' + str(r['leaves']) + ' leaves)':<44}{r['compile_s']:>10.2f}"
            f"{r['step_ms']:>9.2f}{r['step_ratio']:>7.2f}{r[key]:>12.1f}"
            f"{r['total_speedup_vs_optax']:>9.2f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    print(format_rows(run_training()))
