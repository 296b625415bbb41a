"""Memory of a training step: its compiled peak, and whether it stays flat over many steps.

    python -m benchmarks.memory                  # 20M params for the peaks, 10,000 steps
    python -m benchmarks.memory --smoke          # small sizes, 150 steps

Peak memory comes from XLA's memory analysis of the compiled, donated step
`(params, state, grads) -> (params, state)`: the arguments, plus the outputs that do not
reuse a donated argument's buffer, plus XLA's temporaries. It is compared with what the step
must hold anyway: the params, the gradients and the optimizer state.

The flat-memory run trains a small MLP for many steps, eagerly and jitted. Each step sets a
new learning rate through `set_hyperparams` and reads `stats` and `explain`. After a warm-up,
the process's resident memory (RSS) and JAX's count of live arrays are sampled; they must not
grow.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

import gradtx

MB = 2**20


def _bytes(tree: Any) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _params(n: int) -> dict[str, jax.ShapeDtypeStruct]:
    """About `n` float32 params in a few leaves of transformer-like shapes."""
    width = 1024
    rows = max(1, n // (4 * width))
    shape = jax.ShapeDtypeStruct((rows, width), jnp.float32)
    return {
        "layers": [{"w": shape, "b": jax.ShapeDtypeStruct((width,), jnp.float32)} for _ in range(4)]
    }


OPTIMIZERS: dict[str, Callable[[], Any]] = {
    "adam": lambda: gradtx.adam(1e-3),
    "clip + adamw": lambda: gradtx.chain(
        gradtx.clip_by_global_norm(1.0), gradtx.adamw(1e-3, weight_decay=1e-2)
    ),
    "accumulate(adam, every=4)": lambda: gradtx.accumulate(gradtx.adam(1e-3), every=4),
}


def _step(tx: Any) -> Callable:
    def step(params: Any, state: Any, grads: Any) -> tuple[Any, Any]:
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state

    return step


def peak_row(name: str, tx: Any, params: Any, donate: tuple[int, ...] = (0, 1)) -> dict:
    """XLA's memory analysis of the step compiled with `donate`, against params+grads+state."""
    state = jax.eval_shape(tx.init, params)
    return {"optimizer": name, **peak_of(_step(tx), params, state, donate)}


def peak_of(step: Callable, params: Any, state: Any, donate: tuple[int, ...]) -> dict:
    """The figures of `peak_row` for any step `(params, state, grads) -> (params, state)`."""
    compiled = jax.jit(step, donate_argnums=donate).lower(params, state, params).compile()
    m = compiled.memory_analysis()
    peak = (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes
    )
    held = 2 * _bytes(params) + _bytes(state)  # params, grads (shaped like params), state
    return {
        "donate": list(donate),
        "params_mb": _bytes(params) / MB,
        "state_mb": _bytes(state) / MB,
        "held_mb": held / MB,
        "arguments_mb": m.argument_size_in_bytes / MB,
        "outputs_mb": m.output_size_in_bytes / MB,
        "aliased_mb": m.alias_size_in_bytes / MB,
        "temp_mb": m.temp_size_in_bytes / MB,
        "peak_mb": peak / MB,
        "peak_over_held": peak / held,
    }


def _plain_adam(g: Any, mu: Any, nu: Any, count: Any) -> tuple[Any, Any, Any]:
    """Adam in plain JAX (lr 1e-3), the inner step of the accumulation floors below."""
    mu = jax.tree.map(lambda m, x: 0.9 * m + 0.1 * x, mu, g)
    nu = jax.tree.map(lambda v, x: 0.999 * v + 0.001 * x * x, nu, g)
    t = (count + 1).astype(jnp.float32)
    c1, c2 = 1 - 0.9**t, 1 - 0.999**t
    u = jax.tree.map(lambda m, v: -1e-3 * (m / c1) / (jnp.sqrt(v / c2) + 1e-8), mu, nu)
    return u, mu, nu


def accumulation_floor_rows(params: Any, every: int = 4) -> list[dict]:
    """Gradient accumulation written in plain JAX: the floor of `accumulate(adam, every)`.

    The inner step runs under `lax.cond` every `every`-th call. Returning the updates (the
    `update` / `apply_updates` split every transformation has) and applying them inside the
    conditional are both measured: the first is the floor for a transformation.
    """
    zeros = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    count = jax.ShapeDtypeStruct((), jnp.int32)
    state = {"acc": zeros, "mu": zeros, "nu": zeros, "count": count, "micro": count}

    def run(params: Any, state: dict, grads: Any, apply_inside: bool) -> tuple[Any, dict]:
        micro = state["micro"] + 1
        fire = micro >= every

        # The accumulators are summed and reset outside the conditional, which says whether
        # to keep the sum: returned by a branch, they would be copied on every call.
        def step(params, mu, nu):
            mean = jax.tree.map(lambda a, g: (a + g) / every, state["acc"], grads)
            u, mu, nu = _plain_adam(mean, mu, nu, state["count"])
            out = jax.tree.map(jnp.add, params, u) if apply_inside else u
            return out, mu, nu, jnp.bool_(False)

        def wait(params, mu, nu):
            out = params if apply_inside else jax.tree.map(jnp.zeros_like, params)
            return out, mu, nu, jnp.bool_(True)

        out, mu, nu, keep = lax.cond(fire, step, wait, params, state["mu"], state["nu"])
        acc = jax.tree.map(lambda a, g: jnp.where(keep, a + g, 0.0), state["acc"], grads)
        new_params = out if apply_inside else jax.tree.map(jnp.add, params, out)
        count = state["count"] + fire.astype(jnp.int32)
        micro = jnp.where(fire, 0, micro)
        return new_params, {"acc": acc, "mu": mu, "nu": nu, "count": count, "micro": micro}

    rows = []
    for name, inside in (("updates returned", False), ("applied inside the cond", True)):
        step = functools.partial(run, apply_inside=inside)
        row = peak_of(step, params, state, (0, 1))
        rows.append({"optimizer": f"plain JAX accumulate(adam), {name}", **row})
    return rows


def monitored_donation_rows(params: Any) -> list[dict]:
    """A step with a pre-step gradient monitor, undonated and with the gradients donated too;
    then the monitor's other statistics one by one (what each adds to the peak); then a
    monitor of Adam's updates, beside optax's Adam and the norm of its updates."""
    rows = []
    for stats in ("global_norm", "max_abs", "nonfinite_count", "norm", "update_ratio"):
        tx = gradtx.chain(gradtx.monitor("grad", stats), gradtx.adam(1e-3))
        donations = [(), (0, 1, 2)] if stats == "global_norm" else [(0, 1, 2)]
        rows += [peak_row(f"monitor({stats}) + adam", tx, params, d) for d in donations]
    tx = gradtx.chain(gradtx.adam(1e-3), gradtx.monitor("step", "update_ratio"))
    rows.append(peak_row("adam + monitor(update_ratio)", tx, params, (0, 1, 2)))
    return rows + [optax_updates_norm_row(params)]


def optax_updates_norm_row(params: Any) -> dict:
    """optax's Adam and `optax.global_norm` of its updates, the comparison for a monitor
    placed after the optimizer: in both, the updates feed a reduction and the apply."""
    import optax

    tx = optax.adam(1e-3)
    state = (jax.eval_shape(tx.init, params), jax.ShapeDtypeStruct((), jnp.float32))

    def step(params: Any, state: tuple, grads: Any) -> tuple[Any, tuple]:
        updates, inner = tx.update(grads, state[0], params)
        return optax.apply_updates(params, updates), (inner, optax.global_norm(updates))

    return {
        "optimizer": "optax adam + global_norm(updates)",
        **peak_of(step, params, state, (0, 1, 2)),
    }


# --- flat memory over many steps ----------------------------------------------------------------


def _rss_mb() -> float:
    """The process's resident memory now (Linux: /proc; elsewhere psutil)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss / MB


def _mlp(key: jax.Array) -> dict:
    k1, k2 = jax.random.split(key)
    return {
        "hidden": {"w": 0.3 * jax.random.normal(k1, (8, 32)), "b": jnp.zeros(32)},
        "out": {"w": 0.3 * jax.random.normal(k2, (32, 1)), "b": jnp.zeros(1)},
    }


def _loss(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return jnp.mean((h @ params["out"]["w"] + params["out"]["b"] - y) ** 2)


def flat_memory_run(steps: int, jitted: bool, samples: int = 10) -> dict:
    """Train `steps` steps; sample RSS and live arrays after a warm-up of a tenth of them."""
    key = jax.random.key(0)
    params = _mlp(key)
    x = jax.random.normal(jax.random.key(1), (64, 8))
    y = jnp.sin(x.sum(axis=1, keepdims=True))
    tx = gradtx.chain(
        gradtx.monitor("grad", ("global_norm", "norm")),
        gradtx.clip_by_global_norm(1.0),
        gradtx.inject_hyperparams(gradtx.adamw)(learning_rate=1e-2, weight_decay=1e-4),
    )
    state = tx.init(params)

    def step(params: Any, state: Any) -> tuple[Any, Any, jax.Array]:
        loss, grads = jax.value_and_grad(_loss)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state, loss

    run = jax.jit(step) if jitted else step
    warmup = max(1, steps // 10)
    every = max(1, (steps - warmup) // samples)
    rss, live, at = [], [], []
    start = time.perf_counter()
    for i in range(1, steps + 1):
        lr = 1e-2 * (1.0 - 0.5 * i / steps)
        state = gradtx.set_hyperparams(state, {"adamw/learning_rate": lr})
        params, state, loss = run(params, state)
        logged = {k: float(v) for k, v in gradtx.stats(state).items()}
        gradtx.explain(tx, params, i)
        if i >= warmup and (i - warmup) % every == 0:
            gc.collect()
            rss.append(_rss_mb())
            live.append(len(jax.live_arrays()))
            at.append(i)
    seconds = time.perf_counter() - start
    return {
        "mode": "jit" if jitted else "eager",
        "steps": steps,
        "seconds": seconds,
        "final_loss": float(loss),
        "final_grad_norm": logged["grad/global_norm"],
        "sampled_at": at,
        "rss_mb": rss,
        "live_arrays": live,
        "rss_growth": max(rss) / min(rss) - 1.0,
        "live_growth": max(live) / min(live) - 1.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small sizes, few steps")
    parser.add_argument("--params", type=int, default=20_000_000)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    n, steps = (200_000, 150) if args.smoke else (args.params, args.steps)

    params = _params(n)
    peaks = [peak_row(name, make(), params) for name, make in OPTIMIZERS.items()]
    peaks += accumulation_floor_rows(params)
    peaks += monitored_donation_rows(params)
    print(f"compiled step peaks, {_bytes(params) / 4 / 1e6:.1f}M float32 params:")
    for r in peaks:
        print(
            f"  {r['optimizer']:<52} donate {str(tuple(r['donate'])):<10} peak "
            f"{r['peak_mb']:8.1f} MB  params+grads+state {r['held_mb']:8.1f} MB  "
            f"ratio {r['peak_over_held']:.3f}  (temp {r['temp_mb']:.1f} MB)"
        )
    runs = [flat_memory_run(steps, jitted) for jitted in (False, True)]
    for r in runs:
        print(
            f"{r['mode']:>5}: {r['steps']} steps in {r['seconds']:.1f} s; after warm-up RSS "
            f"{min(r['rss_mb']):.1f}-{max(r['rss_mb']):.1f} MB ({r['rss_growth']:+.1%}), live "
            f"arrays {min(r['live_arrays'])}-{max(r['live_arrays'])} "
            f"({r['live_growth']:+.1%}); final loss {r['final_loss']:.4f}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"peaks": peaks, "runs": runs, "jax": jax.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
