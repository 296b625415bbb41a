"""Where a step's time goes on an accelerator: its kernels, counted and timed.

    python -m benchmarks.lab.kernels            # transformer-like tree (147 leaves, 27.6M params)
    python -m benchmarks.lab.kernels --smoke    # tiny tree, a few steps

For each configuration the step `(params, state, grads) -> (params, state, grads)`, all three
donated, is compiled, and two counts are taken:

- the kernels XLA's optimized program launches: the instructions of its entry computation
  that run on the device (fusions, custom calls, copies; not parameters, tuples, bitcasts or
  constants);
- from a `jax.profiler` trace of a few steps: the device events per step, their summed time,
  the device's busy time per step (overlapping events counted once) and the longest kernels.

The wall time per step (median over timed blocks) is printed beside them, so that the gap
between it and the device's busy time (launch overhead, host work) can be read off.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import workloads as W
from benchmarks.results import write_json

# Entry-computation instructions that launch nothing on the device.
_NO_KERNEL = {
    "parameter",
    "tuple",
    "get-tuple-element",
    "bitcast",
    "constant",
    "after-all",
    "opt-barrier",
    "partition-id",
    "replica-id",
}
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*[^=]*?\s([a-z][\w\-]*)\(")


def entry_kernels(hlo_text: str) -> collections.Counter:
    """Count the device-launching instructions of the optimized program's entry, by opcode."""
    counts: collections.Counter = collections.Counter()
    inside = False
    for line in hlo_text.splitlines():
        if line.startswith("ENTRY"):
            inside = True
            continue
        if inside:
            if line.startswith("}"):
                break
            match = _INSTRUCTION.match(line)
            if match and match.group(1) not in _NO_KERNEL:
                counts[match.group(1)] += 1
    return counts


def _device_events(trace_dir: str) -> list[dict]:
    """The complete events of the device's lanes in the perfetto trace (none on CPU)."""
    files = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    if not files:
        return []
    with gzip.open(files[0]) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    devices = {
        e["pid"]
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and "/device:" in str(e.get("args", {}).get("name", ""))
    }
    return [e for e in events if e.get("ph") == "X" and e.get("pid") in devices]


def _busy_us(events: list[dict]) -> float:
    """The time covered by at least one event (overlapping kernels counted once)."""
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events)
    total, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def profile(step: Callable, args: tuple, steps: int) -> tuple[dict, tuple]:
    """Device events per step from a profiler trace of `steps` calls (args carried along)."""
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(steps):
                args = jax.block_until_ready(step(*args))
        events = _device_events(trace_dir)
    if not events:
        return {"device_events_per_step": None}, args
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        by_name[e["name"]].append(float(e.get("dur", 0)))
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:8]
    figures = {
        "device_events_per_step": len(events) / steps,
        "device_sum_ms_per_step": sum(sum(d) for d in by_name.values()) / steps / 1e3,
        "device_busy_ms_per_step": _busy_us(events) / steps / 1e3,
        "top_kernels": [
            {
                "name": name[:80],
                "calls_per_step": len(d) / steps,
                "ms_per_step": sum(d) / steps / 1e3,
            }
            for name, d in top
        ],
    }
    return figures, args


def _wall_ms(step: Callable, args: tuple, reps: int, rounds: int) -> tuple[float, tuple]:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            args = step(*args)
        jax.block_until_ready(args)
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times) * 1e3, args


def _variants(workload: W.Workload, packed: W.Workload) -> dict[str, tuple[Any, Any, Any]]:
    """name -> (transformation, apply_updates, workload)."""
    import optax

    import gradtx

    return {
        "optax adam, tree": (optax.adam(1e-3), optax.apply_updates, workload),
        "gradtx adam, tree": (gradtx.adam(1e-3), gradtx.apply_updates, workload),
        "gradtx adam, bucketed state": (
            gradtx.bucketed(gradtx.adam(1e-3)),
            gradtx.apply_updates,
            workload,
        ),
        "gradtx adam, packed params": (gradtx.adam(1e-3), gradtx.apply_updates, packed),
    }


def run(workload: W.Workload, reps: int, rounds: int, profiled_steps: int) -> list[dict]:
    packed = W.Workload(workload.name + ", packed", workload.shapes, packed=True)
    rows = []
    for name, (tx, apply, w) in _variants(workload, packed).items():
        params, grads = jax.block_until_ready((w.params(0), w.params(1)))
        state = jax.block_until_ready(tx.init(params))

        def step(params, state, grads, tx=tx, apply=apply):
            updates, state = tx.update(grads, state, params)
            return apply(params, updates), state, grads

        # The gradients are carried to the next call; donated, they go out in their own
        # buffer. Undonated, XLA must copy them every step: a copy per leaf that would be
        # counted as the optimizer's.
        jitted = jax.jit(step, donate_argnums=(0, 1, 2))
        t0 = time.perf_counter()
        compiled = jitted.lower(params, state, grads).compile()
        compile_s = time.perf_counter() - t0
        kernels = entry_kernels(compiled.as_text())
        args = jax.block_until_ready(compiled(params, state, grads))
        wall_ms, args = _wall_ms(compiled, args, reps, rounds)
        profiled, args = profile(compiled, args, profiled_steps)
        row = {
            "variant": name,
            "leaves": w.num_leaves,
            "params": w.num_params,
            "compile_s": compile_s,
            "hlo_kernels": sum(kernels.values()),
            "hlo_kernels_by_op": dict(kernels.most_common()),
            "wall_ms": wall_ms,
            **profiled,
        }
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


HEADER = (
    f"{'variant':<30}{'compile s':>10}{'HLO kernels':>12}{'events/step':>12}"
    f"{'busy ms':>9}{'sum ms':>8}{'wall ms':>9}"
)


def format_row(r: dict) -> str:
    def fmt(x: Any, spec: str) -> str:
        return format("-" if x is None else x, spec if x is not None else spec[:-3] + "s")

    return (
        f"{r['variant']:<30}{r['compile_s']:>10.2f}{r['hlo_kernels']:>12d}"
        f"{fmt(r['device_events_per_step'], '>12.1f')}"
        f"{fmt(r.get('device_busy_ms_per_step'), '>9.3f')}"
        f"{fmt(r.get('device_sum_ms_per_step'), '>8.3f')}{r['wall_ms']:>9.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/kernels.json")
    args = parser.parse_args(argv)
    if args.smoke:
        workload, reps, rounds, profiled = W.transformer_like(1, 32, 64), 3, 2, 2
    else:
        workload, reps, rounds, profiled = W.transformer_like(), 20, 7, 5
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {workload.name}")
    if os.environ.get("XLA_FLAGS"):
        print(f"XLA_FLAGS={os.environ['XLA_FLAGS']}")
    print(HEADER)
    rows = run(workload, reps, rounds, profiled)
    for r in rows:
        if r.get("top_kernels"):
            print(f"{r['variant']}: longest kernels per step")
            for k in r["top_kernels"]:
                print(f"  {k['ms_per_step']:8.3f} ms  x{k['calls_per_step']:<6.0f} {k['name']}")
    if args.out:
        report = {
            "jax": jax.__version__,
            "device": jax.devices()[0].device_kind,
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "rows": rows,
        }
        write_json(args.out, report)
    return 0


if __name__ == "__main__":
    jnp.zeros(())  # start the backend before timing anything
    raise SystemExit(main())
