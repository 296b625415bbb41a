"""Run the benchmark suite: gradtx and optax side by side, alternating, in one process.

    python -m benchmarks.run            # the full suite (about an hour on 2 cores)
    python -m benchmarks.run --smoke    # a tiny version, run by the tests so the suite cannot rot

Prints a table (times in ms, ratios gradtx/optax and x the memory-bandwidth bound) and
writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import workloads as W
from benchmarks.cli import add_config_option, check_selected
from benchmarks.configs import configs
from benchmarks.fresh import clear_caches
from benchmarks.results import write_json
from benchmarks.training import format_rows, run_training


def _ready(tree: Any) -> Any:
    return jax.block_until_ready(tree)


def measure_bandwidth(mib: int = 256, reps: int = 5, rounds: int = 3) -> float:
    """In-place streaming bandwidth (bytes/s): a donated `x * 2 + 1` reads and writes x.

    Calls are timed in blocks of `reps`, each feeding the next, and the best block counts:
    a wait for the device after every call would add its round trip to each call, which on
    a GPU is a good part of the kernel's own time.
    """
    n = mib * 1024 * 1024 // 4
    x = jnp.ones((n,), jnp.float32)
    f = jax.jit(lambda x: x * 2 + 1, donate_argnums=0)
    x = _ready(f(x))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            x = f(x)
        x = _ready(x)
        times.append((time.perf_counter() - t0) / reps)
    return 2 * n * 4 / min(times)


def step_fn(tx: Any, apply: Any) -> Any:
    """The step every configuration is timed with: `(params, state, grads) -> (params, state)`."""

    def step(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return apply(params, updates), state

    return step


def _time_block(fn: Any, carry: tuple, grads: Any, reps: int) -> tuple[list[float], tuple]:
    """`reps` timed calls of `fn(params, state, grads)`, each feeding the next."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        carry = _ready(fn(*carry, grads))
        times.append(time.perf_counter() - t0)
    return times, carry


def _copy(tree: Any) -> Any:
    return jax.tree.map(lambda x: x.copy(), tree)


# Timed blocks of jitted steps last at least this long (up to _MAX_REPS calls): a 2-4 ms
# step timed 5 times per round gave medians 13% apart for two programs with the same kernels.
_MIN_BLOCK_S = 0.1
_MAX_REPS = 50


class Contender:
    """One library's step on one workload: compiled, then timed in blocks.

    The blocks of the two libraries alternate (and which goes first alternates by round), so
    that drift of the machine (other load, memory state) hits both alike. So do the compiles:
    each starts from cleared caches, as in a fresh process (unless `fresh` is off, as in the
    smoke run), and a fast compile is repeated (see `run`) so that its median, not one noisy
    sample, is reported.
    """

    def __init__(
        self, lib: str, tx: Any, workload: W.Workload, eager: bool, fresh: bool = True
    ) -> None:
        import optax

        import gradtx

        apply = gradtx.apply_updates if lib == "gradtx" else optax.apply_updates
        self.tx, self.apply, self.eager, self.fresh = tx, apply, eager, fresh
        # Wait for the inputs before timing the compile: JAX dispatches their computation
        # asynchronously, and lowering waits for the device whenever it reads a value (a
        # hyperparameter held as an array), so that wait would be counted as compile time.
        self.params, self.grads = _ready((workload.params(0), workload.params(1)))
        self.state = _ready(tx.init(self.params))
        self.compile_times: list[float] = []
        self.compile()

    def compile(self) -> None:
        """Compile the step afresh (a new function; cleared caches if `fresh`) and time it.

        With `fresh`, the state is built again after the caches are cleared, as a program
        builds it before its first compile.
        """
        if self.fresh:
            clear_caches()
            self.state = _ready(self.tx.init(self.params))
        step = step_fn(self.tx, self.apply)
        t0 = time.perf_counter()
        self.compiled = jax.jit(step).lower(self.params, self.state, self.grads).compile()
        self.compile_times.append(time.perf_counter() - t0)

    def warm_up(self) -> None:
        """Build the timed variants and make their first calls (compiles, cache warm-up).

        Call this after the last `compile`, which clears the caches the variants fill.
        """
        memory = self.compiled.memory_analysis()
        self.peak = None
        if memory is not None:
            self.peak = memory.temp_size_in_bytes + memory.output_size_in_bytes
        step = step_fn(self.tx, self.apply)
        donated = jax.jit(step, donate_argnums=(0, 1))
        self.kinds: dict[str, tuple[Any, tuple]] = {
            "step_ms": (self.compiled, (self.params, self.state)),
            "donated_ms": (donated, (_copy(self.params), _copy(self.state))),
        }
        if self.eager:
            self.kinds["eager_ms"] = (step, (self.params, self.state))
        self.call_s: dict[str, float] = {}
        for kind, (fn, carry) in self.kinds.items():  # first calls: compile, warm caches
            carry = _ready(fn(*carry, self.grads))
            t0 = time.perf_counter()  # a second call estimates the time per call
            self.kinds[kind] = (fn, _ready(fn(*carry, self.grads)))
            self.call_s[kind] = time.perf_counter() - t0
        self.times: dict[str, list[float]] = {kind: [] for kind in self.kinds}

    def time(self, reps: int, eager_reps: int) -> None:
        for kind, (fn, carry) in self.kinds.items():
            if kind == "eager_ms":
                n = eager_reps
            else:  # a block of a few fast steps is mostly the machine's noise: lengthen it
                n = max(reps, min(_MAX_REPS, int(_MIN_BLOCK_S / self.call_s[kind])))
            times, carry = _time_block(fn, carry, self.grads, n)
            self.kinds[kind] = (fn, carry)
            self.times[kind].extend(times)

    def results(self) -> dict:
        out = {
            "compile_s": statistics.median(self.compile_times),
            "compile_samples": len(self.compile_times),
            "peak_bytes": self.peak,
            "eager_ms": None,
        }
        for kind, times in self.times.items():
            out[kind] = statistics.median(times) * 1e3
        return out


# Compiles faster than this are repeated: one sample of a sub-second compile is mostly noise
# on a busy machine, and three cost little.
_REPEAT_COMPILES_UNDER_S = 2.0
_COMPILE_SAMPLES = 3


def run(
    workloads: list[W.Workload],
    reps: int,
    eager_reps: int,
    rounds: int,
    only: list[str] | None = None,
    compile_samples: int = _COMPILE_SAMPLES,
    fresh_caches: bool = True,
    out: str | None = None,
    candidates: list[Any] | None = None,
) -> dict:
    """Time every configuration (of `candidates`, default the suite's `configs()`) on every
    workload; the report, written to `out` (if given) after each row, so that a run stopped
    at a time limit keeps the rows it finished."""
    bandwidth = measure_bandwidth(64 if reps < 5 else 256)
    results: list[dict] = []
    report = {
        "bandwidth_gb_s": bandwidth / 1e9,
        "jax": jax.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "backend": jax.default_backend(),
        # XLA's flags change the compiled programs (multi-output fusion, say): keep them.
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "rounds": rounds,
        "reps_per_round": reps,
        "results": results,
    }
    for workload in workloads:
        p_bytes = np.dtype(jnp.dtype(workload.dtype)).itemsize
        s_bytes = np.dtype(jnp.dtype(workload.state_dtype or workload.dtype)).itemsize
        chosen = [
            config
            for config in (configs() if candidates is None else candidates)
            if (workload.only_configs is None or config.name in workload.only_configs)
            and config.applies(workload)
            and (not only or config.name in only)
        ]
        for index, config in enumerate(chosen):
            # The library built (and compiled) first alternates, so neither always pays for
            # the caches it warms for the other.
            libs = ("gradtx", "optax") if index % 2 == 0 else ("optax", "gradtx")
            contenders = {
                lib: Contender(
                    lib, getattr(config, lib)(workload), workload, eager_reps > 0, fresh_caches
                )
                for lib in libs
            }
            order = list(contenders.values())
            if max(c.compile_times[0] for c in order) < _REPEAT_COMPILES_UNDER_S:
                for r in range(1, compile_samples):
                    for contender in order if r % 2 == 0 else order[::-1]:
                        contender.compile()
            for contender in order:
                contender.warm_up()
            for r in range(rounds):
                for contender in order if r % 2 == 0 else order[::-1]:
                    contender.time(reps, eager_reps)
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
            for lib, contender in contenders.items():
                for key, value in contender.results().items():
                    row[f"{lib}_{key}"] = value
            # Free the finished row's compiled programs (eager ones included): they pile up
            # over a long run, and the 8000-leaf rows need the memory.
            del contenders
            if fresh_caches:
                clear_caches()
            gc.collect()
            results.append(row)
            print(format_row(row), flush=True)
            if out:
                write_json(out, report)
    return report


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
    add_config_option(parser, configs())
    parser.add_argument("--no-training", action="store_true", help="skip the training steps")
    args = parser.parse_args(argv)
    if args.smoke:
        workloads = [
            W.many_leaves(8),
            W.many_leaves_packed(8),
            W.Workload("bf16 params, f32 state", {"w": (64,), "bias": (8,)}, "bfloat16", "float32"),
        ]
        if args.only:  # tiny forms of the rest, so that a script's `--only` parts smoke-run
            workloads += [W.transformer_like(layers=1, width=8, vocab=32), W.one_big_leaf(1024)]
        # One compile each, caches kept: the smoke run checks that the suite runs, not its
        # figures, and after a cache clear every eager operation compiles again (2.5x longer).
        reps, eager_reps, rounds, compile_samples, fresh = 2, 1, 2, 1, False
    else:
        workloads = [
            W.transformer_like(),
            W.many_leaves(2000),
            W.many_leaves_packed(2000),
            W.one_big_leaf(),
            W.bf16_f32_state(),
            *W.leaf_sweep(),
        ]
        reps, eager_reps, rounds, compile_samples, fresh = 5, 1, 6, _COMPILE_SAMPLES, True
    names = [w.name for w in workloads]
    workloads = [w for w in workloads if args.only in w.name]
    check_selected(parser, workloads, "--only", args.only, names)
    if args.skip:
        workloads = [w for w in workloads if args.skip not in w.name]
        check_selected(parser, workloads, "--skip", args.skip, names)
    print(
        f"jax {jax.__version__} on {jax.default_backend()}; times are medians in ms; "
        "'don' = donated jitted step, 'xB' = x the bandwidth bound, 'cmp' = compile s, "
        "'eag' = un-jitted step ms"
    )
    if os.environ.get("XLA_FLAGS"):
        print(f"XLA_FLAGS={os.environ['XLA_FLAGS']}")
    print(HEADER)
    report = run(workloads, reps, eager_reps, rounds, args.config, compile_samples, fresh, args.out)
    print(f"streaming bandwidth: {report['bandwidth_gb_s']:.1f} GB/s")
    if not args.no_training:
        blocks = 4 if args.smoke else 1000
        report["training"] = run_training(blocks=blocks, reps=reps, rounds=rounds)
        print(format_rows(report["training"]))
    if args.out:
        write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
