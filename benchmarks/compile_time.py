"""Compile time of Adam's donated step on many leaves, per library and layout.

    python -m benchmarks.compile_time                              # 100, 500, 2000 leaves
    python -m benchmarks.compile_time --leaves 2000 --lib optax    # one measurement

Each leaf holds 2048 float32 values. The step `(params, state, grads) -> (params, state)`
is lowered and compiled from cleared caches, as in a fresh process; tracing and lowering are
timed apart from XLA's compile. Libraries and sizes alternate, and each measurement is
repeated (`--repeat`) so that the median is reported.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks.fresh import clear_caches
from benchmarks.results import write_json

LEAF_SIZE = 2048


def _optimizers() -> dict[str, tuple[Callable[[], Any], Callable]]:
    import optax

    import gradtx

    return {
        "optax": (lambda: optax.adam(1e-3), optax.apply_updates),
        "gradtx": (lambda: gradtx.adam(1e-3), gradtx.apply_updates),
        "gradtx bucketed": (lambda: gradtx.bucketed(gradtx.adam(1e-3)), gradtx.apply_updates),
    }


def lower_and_compile_s(
    jitted: Any, *args: Any, platforms: tuple[str, ...] | None = None
) -> tuple[float, float]:
    """Seconds to trace and lower `jitted` on `args`, then to compile it.

    Call `benchmarks.fresh.clear_caches()` before building `args` (the state included).
    `platforms` names the platform to lower for where it is not the default backend's
    (as `benchmarks.lab.gpu_target.for_device` gives them with its abstract args).
    """
    t0 = time.perf_counter()
    lowered = jitted.trace(*args).lower(lowering_platforms=platforms)
    t1 = time.perf_counter()
    lowered.compile()
    return t1 - t0, time.perf_counter() - t1


def measure(lib: str, leaves: int) -> dict:
    """Trace+lower and compile seconds of `lib`'s donated Adam step on `leaves` leaves."""
    make, apply = _optimizers()[lib]
    clear_caches()
    tx = make()
    params = {f"l/{i}": jax.ShapeDtypeStruct((LEAF_SIZE,), jnp.float32) for i in range(leaves)}
    state = jax.eval_shape(tx.init, params)

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return apply(params, updates), state

    lower_s, compile_s = lower_and_compile_s(
        jax.jit(step, donate_argnums=(0, 1)), params, state, params
    )
    return {
        "lib": lib,
        "leaves": leaves,
        "lower_s": lower_s,
        "compile_s": compile_s,
        "total_s": lower_s + compile_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, action="append", default=None)
    parser.add_argument("--lib", action="append", default=None, choices=list(_optimizers()))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/compile_time.json")
    args = parser.parse_args(argv)
    sizes = args.leaves or [100, 500, 2000]
    libs = args.lib or list(_optimizers())
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    samples: dict[tuple[str, int], list[dict]] = {}
    for r in range(args.repeat):
        for n in sizes:
            for lib in libs if r % 2 == 0 else libs[::-1]:
                samples.setdefault((lib, n), []).append(measure(lib, n))
    rows = []
    for (lib, n), got in samples.items():
        row = {"lib": lib, "leaves": n, "samples": len(got)}
        for key in ("lower_s", "compile_s", "total_s"):
            row[key] = statistics.median(g[key] for g in got)
        rows.append(row)
    optax_total = {r["leaves"]: r["total_s"] for r in rows if r["lib"] == "optax"}
    print(
        f"{'library':<18}{'leaves':>7}{'lower s':>9}{'compile s':>11}{'total s':>9}{'x optax':>9}"
    )
    for row in sorted(rows, key=lambda r: (r["leaves"], r["lib"])):
        base = optax_total.get(row["leaves"])
        row["total_vs_optax"] = row["total_s"] / base if base else None
        ratio = f"{row['total_vs_optax']:>9.2f}" if base else f"{'-':>9}"
        print(
            f"{row['lib']:<18}{row['leaves']:>7}{row['lower_s']:>9.2f}{row['compile_s']:>11.2f}"
            f"{row['total_s']:>9.2f}{ratio}",
            flush=True,
        )
    if args.out:
        device = jax.devices()[0].device_kind
        write_json(args.out, {"jax": jax.__version__, "device": device, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
