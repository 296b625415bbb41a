"""Run the benchmark suite: gradtx and optax side by side, alternating, in one process.

    python -m benchmarks.run            # the full suite (minutes)
    python -m benchmarks.run --smoke    # a tiny version, run by the tests so the suite cannot rot

Prints a table (times in ms, ratios gradtx/optax and x the memory-bandwidth bound) and
writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import workloads as W
from benchmarks.configs import configs
from benchmarks.training import format_rows, run_training


def _ready(tree: Any) -> Any:
    return jax.block_until_ready(tree)


def measure_bandwidth(mib: int = 256, reps: int = 5) -> float:
    """In-place streaming bandwidth (bytes/s): a donated `x * 2 + 1` reads and writes x."""
    n = mib * 1024 * 1024 // 4
    x = jnp.ones((n,), jnp.float32)
    f = jax.jit(lambda x: x * 2 + 1, donate_argnums=0)
    x = _ready(f(x))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x = _ready(f(x))
        times.append(time.perf_counter() - t0)
    return 2 * n * 4 / min(times)


def _step_fn(tx: Any, apply: Any) -> Any:
    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return apply(params, updates), state

    return step


def _median_time(fn: Any, params: Any, state: Any, grads: Any, reps: int) -> float:
    params, state = _ready(fn(params, state, grads))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        params, state = _ready(fn(params, state, grads))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _copy(tree: Any) -> Any:
    return jax.tree.map(lambda x: x.copy(), tree)


def bench_one(lib: str, tx: Any, workload: W.Workload, reps: int, eager_reps: int) -> dict:
    import optax

    import gradtx

    apply = gradtx.apply_updates if lib == "gradtx" else optax.apply_updates
    params = workload.params(0)
    grads = workload.params(1)
    state = tx.init(params)
    step = _step_fn(tx, apply)
    jitted = jax.jit(step)
    t0 = time.perf_counter()
    compiled = jitted.lower(params, state, grads).compile()
    compile_s = time.perf_counter() - t0
    memory = compiled.memory_analysis()
    peak = None
    if memory is not None:
        peak = memory.temp_size_in_bytes + memory.output_size_in_bytes
    undonated = _median_time(compiled, params, state, grads, reps)
    donated_fn = jax.jit(step, donate_argnums=(0, 1))
    p2, s2 = _copy(params), _copy(state)
    donated = _median_time(donated_fn, p2, s2, grads, reps)
    eager = None
    if eager_reps:
        eager = _median_time(step, params, state, grads, eager_reps)
    return {
        "compile_s": compile_s,
        "step_ms": undonated * 1e3,
        "donated_ms": donated * 1e3,
        "eager_ms": None if eager is None else eager * 1e3,
        "peak_bytes": peak,
    }


def run(
    workloads: list[W.Workload],
    reps: int,
    eager_reps: int,
    rounds: int,
    only: list[str] | None = None,
) -> dict:
    bandwidth = measure_bandwidth(64 if reps < 5 else 256)
    results = []
    for workload in workloads:
        p_bytes = np.dtype(jnp.dtype(workload.dtype)).itemsize
        s_bytes = np.dtype(jnp.dtype(workload.state_dtype or workload.dtype)).itemsize
        for config in configs():
            if workload.only_configs is not None and config.name not in workload.only_configs:
                continue
            if not config.applies(workload):
                continue
            if only and config.name not in only:
                continue
            runs: dict[str, list[dict]] = {"gradtx": [], "optax": []}
            for _ in range(rounds):  # alternate, so drift hits both libraries alike
                for lib in ("gradtx", "optax"):
                    tx = getattr(config, lib)(workload)
                    runs[lib].append(bench_one(lib, tx, workload, reps, eager_reps))
            row = {
                "workload": workload.name,
                "leaves": workload.num_leaves,
                "params": workload.num_params,
                "config": config.name,
                "bound_ms": config.bytes_per_param(p_bytes, s_bytes)
                * workload.num_params
                / bandwidth
                * 1e3,
            }
            for lib, values in runs.items():
                for key in values[0]:
                    series = [v[key] for v in values if v[key] is not None]
                    row[f"{lib}_{key}"] = statistics.median(series) if series else None
            results.append(row)
            print(format_row(row), flush=True)
    return {
        "bandwidth_gb_s": bandwidth / 1e9,
        "jax": jax.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "backend": jax.default_backend(),
        "results": results,
    }


HEADER = (
    f"{'workload':<28}{'config':<26}{'bound':>7}"
    f"{'gtx don':>9}{'opx don':>9}{'ratio':>7}{'gtx xB':>8}{'opx xB':>8}"
    f"{'gtx cmp':>9}{'opx cmp':>9}{'ratio':>7}{'gtx eag':>9}{'opx eag':>9}"
)


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def format_row(r: dict) -> str:
    bound = r["bound_ms"]
    return (
        f"{r['workload']:<28}{r['config']:<26}{bound:>7.2f}"
        f"{r['gradtx_donated_ms']:>9.2f}{r['optax_donated_ms']:>9.2f}"
        f"{r['gradtx_donated_ms'] / r['optax_donated_ms']:>7.2f}"
        f"{r['gradtx_donated_ms'] / bound:>8.2f}{r['optax_donated_ms'] / bound:>8.2f}"
        f"{r['gradtx_compile_s']:>9.2f}{r['optax_compile_s']:>9.2f}"
        f"{r['gradtx_compile_s'] / r['optax_compile_s']:>7.2f}"
        f"{_fmt(r['gradtx_eager_ms'], '>9.1f')}{_fmt(r['optax_eager_ms'], '>9.1f')}"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round")
    parser.add_argument("--only", default="", help="run workloads whose name contains this")
    parser.add_argument("--skip", default=None, help="skip workloads whose name contains this")
    parser.add_argument("--out", default="benchmarks/results/latest.json")
    parser.add_argument(
        "--config", action="append", default=None, help="run only this configuration (repeatable)"
    )
    parser.add_argument("--no-training", action="store_true", help="skip the training steps")
    args = parser.parse_args(argv)
    if args.smoke:
        workloads = [
            W.many_leaves(8),
            W.many_leaves_packed(8),
            W.Workload("bf16 params, f32 state", {"w": (64,), "bias": (8,)}, "bfloat16", "float32"),
        ]
        reps, eager_reps, rounds = 2, 1, 1
    else:
        workloads = [
            W.transformer_like(),
            W.many_leaves(2000),
            W.many_leaves_packed(2000),
            W.one_big_leaf(),
            W.bf16_f32_state(),
            *W.leaf_sweep(),
        ]
        reps, eager_reps, rounds = 10, 2, 1
    workloads = [w for w in workloads if args.only in w.name]
    if args.skip:
        workloads = [w for w in workloads if args.skip not in w.name]
    print(
        f"jax {jax.__version__} on {jax.default_backend()}; times are medians in ms; "
        "'don' = donated jitted step, 'xB' = x the bandwidth bound, 'cmp' = compile s, "
        "'eag' = un-jitted step ms"
    )
    print(HEADER)
    report = run(workloads, reps, eager_reps, rounds, args.config)
    print(f"streaming bandwidth: {report['bandwidth_gb_s']:.1f} GB/s")
    if not args.no_training:
        blocks = 4 if args.smoke else 1000
        report["training"] = run_training(blocks=blocks, reps=reps)
        print(format_rows(report["training"]))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
