"""Whole training steps of real models: optax against gradtx's layouts, in one process.

    python -m benchmarks.whole_model                 # full sizes
    python -m benchmarks.whole_model --smoke         # tiny models, a few steps (the tests)
    python -m benchmarks.whole_model --only gpt      # one workload (gpt or mlp)

Two workloads from `benchmarks/models.py`: a GPT-style language model in Flax NNX (about
150 leaves, 20M params) and an Equinox residual MLP of 1000 small layers (2000 leaves). Each
is trained by five variants from the same params on the same batch: optax's Adam(W) on the
tree, gradtx's on the tree, gradtx's with bucketed state (`gradtx.bucketed`), gradtx's on
packed params (`gradtx.pack`, the loss unpacking the leaves at runtime offsets), and the
model's gradient alone, the floor of what any optimizer adds to a step.

Every step is one jitted function `(params, state, batch) -> (params, state, loss)` with
params and state donated. Per variant it reports the compile time (lower + compile, caches
cleared first in the full run, as in a fresh process), the median step time over blocks
that alternate between the variants (`benchmarks.training._time_rounds`), the peak memory
from XLA's analysis of the compiled step (arguments + outputs - aliased + temporaries, as
in `benchmarks/memory.py`), compile + 1000 steps, the ratios of these to optax's, and the
last loss. All variants take the same number of steps, so the trained ones must reach the
same loss up to float rounding.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import models
from benchmarks.fresh import clear_caches
from benchmarks.results import write_json
from benchmarks.training import _compile, _time_rounds

MB = 2**20
STEPS = 1000  # the run length that `total_1000_steps_s` prices compile time against
# Leaves this large get a packed buffer of their own, as in `gradtx.bucketed` by default:
# copying them into a shared buffer every step saves no kernel worth the copy.
OWN_BUFFER_FROM = 1 << 16


def _tree_step(w: models.Workload, tx: Any, apply: Callable) -> Callable:
    def step(params, state, batch):
        value, grads = w.value_and_grad(w.loss)(params, batch)
        updates, state = tx.update(grads, state, params)
        return apply(params, updates), state, value

    return jax.jit(step, donate_argnums=(0, 1))


def _packed_step(w: models.Workload, tx: Any) -> Callable:
    import gradtx

    def step(packed, state, batch, offsets):
        def loss(p):
            return w.loss(w.from_plain(p.unpack(offsets)), batch)

        value, grads = w.value_and_grad(loss)(packed)
        updates, state = tx.update(grads, state, packed)
        return gradtx.apply_updates(packed, updates), state, value

    return jax.jit(step, donate_argnums=(0, 1))


def _gradient_step(w: models.Workload) -> Callable:
    # No optimizer: the gradients go out in a donated buffer, the params come back as they
    # were (donated too, so they cost no fresh output buffer).
    def step(params, grads, batch):
        value, grads = w.value_and_grad(w.loss)(params, batch)
        return params, grads, value

    return jax.jit(step, donate_argnums=(0, 1))


def variants(w: models.Workload, optimizer: str, lr: float, **kw: Any) -> dict[str, Callable]:
    """Each variant's builder: `() -> (jitted step, its first arguments)`, fresh params."""
    import optax

    import gradtx

    def fresh() -> Any:  # a copy per variant: donation consumes the params it is given
        return jax.tree.map(jnp.copy, w.params)

    def ours() -> Any:
        return getattr(gradtx, optimizer)(lr, **kw)

    def tree(tx: Any, apply: Callable) -> tuple:
        p = fresh()
        return _tree_step(w, tx, apply), (p, tx.init(p), w.batch)

    def packed() -> tuple:
        tx, p = ours(), gradtx.pack(w.to_plain(fresh()), own_buffer_from=OWN_BUFFER_FROM)
        return _packed_step(w, tx), (p, tx.init(p), w.batch, p.offsets())

    def gradient_only() -> tuple:
        p = fresh()
        return _gradient_step(w), (p, jax.tree.map(jnp.zeros_like, p), w.batch)

    return {
        f"optax {optimizer}": lambda: tree(
            getattr(optax, optimizer)(lr, **kw), optax.apply_updates
        ),
        f"gradtx {optimizer}": lambda: tree(ours(), gradtx.apply_updates),
        f"gradtx {optimizer}, bucketed state": lambda: tree(
            gradtx.bucketed(ours()), gradtx.apply_updates
        ),
        f"gradtx {optimizer}, packed params": packed,
        "model gradient only": gradient_only,
    }


def _peak_mb(compiled: Any) -> float | None:
    m = compiled.memory_analysis()
    if m is None:  # not every backend reports it
        return None
    peak = (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes
    )
    return peak / MB


def run_workload(
    w: models.Workload, builders: dict[str, Callable], reps: int, rounds: int, fresh: bool
) -> dict:
    """Compile every variant, time them in alternating blocks, and report each one's row."""
    leaves = jax.tree.leaves(w.params)
    # Compile the loss once, untimed: the first compile in a process also pays one-time
    # costs (imports, lowering rules) that would otherwise count against the first variant.
    jax.jit(w.loss).lower(w.params, w.batch).compile()
    built = []
    for name, build in builders.items():
        if fresh:  # each variant builds its state, traces and compiles as in a fresh process
            clear_caches()
        built.append(_compile(*build()))
        print(f"  compiled {name} in {built[-1][1]:.1f} s", flush=True)  # long on many leaves
    compiled = [c for c, _, _ in built]
    times, losses = _time_rounds(compiled, [a for _, _, a in built], reps, rounds)
    rows = []
    for name, (c, compile_s, _), t, loss in zip(builders, built, times, losses):
        step_s = statistics.median(t)
        rows.append(
            {
                "variant": name,
                "compile_s": compile_s,
                "step_ms": step_s * 1e3,
                "peak_mb": _peak_mb(c),
                f"total_{STEPS}_steps_s": compile_s + STEPS * step_s,
                "loss": loss,
                "steps_trained": rounds * (reps + 1),
            }
        )
    base = rows[0]
    key = f"total_{STEPS}_steps_s"
    for row in rows:
        row["step_ratio"] = row["step_ms"] / base["step_ms"]
        row["compile_ratio"] = row["compile_s"] / base["compile_s"]
        row["total_speedup_vs_optax"] = base[key] / row[key]
    return {
        "leaves": len(leaves),
        "params": sum(x.size for x in leaves),
        "config": w.config,
        "rows": rows,
    }


def format_rows(title: str, result: dict) -> str:
    key = f"total_{STEPS}_steps_s"
    lines = [
        f"{title}: {result['leaves']} leaves, {result['params']:,} params, {result['config']}",
        f"{'variant':<36}{'compile s':>10}{'step ms':>10}{'peak MB':>9}{'step x':>8}"
        f"{'cmp x':>7}{f'cmp+{STEPS} s':>12}{'speedup':>9}{'loss':>11}",
    ]
    for r in result["rows"]:
        peak = "-" if r["peak_mb"] is None else f"{r['peak_mb']:.1f}"
        lines.append(
            f"{r['variant']:<36}{r['compile_s']:>10.2f}{r['step_ms']:>10.2f}{peak:>9}"
            f"{r['step_ratio']:>8.2f}{r['compile_ratio']:>7.2f}{r[key]:>12.1f}"
            f"{r['total_speedup_vs_optax']:>9.2f}{r['loss']:>11.6f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny models, a few steps")
    parser.add_argument("--only", choices=("gpt", "mlp"), default=None)
    parser.add_argument("--reps", type=int, default=None, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=None, help="timed blocks per variant")
    parser.add_argument("--out", default="benchmarks/results/whole_model.json")
    args = parser.parse_args(argv)
    reps = args.reps or (3 if args.smoke else 10)
    rounds = args.rounds or (3 if args.smoke else 6)
    # The smoke run keeps the caches: it checks that the benchmark runs, not its compile
    # times, and a cleared cache makes every small eager operation compile again.
    fresh = not args.smoke

    workloads = {
        "gpt": lambda: (models.gpt(args.smoke), ("adamw", 3e-4), {"weight_decay": 0.1}),
        "mlp": lambda: (models.mlp(args.smoke), ("adam", 1e-3), {}),
    }
    device = jax.devices()[0]
    report: dict[str, Any] = {
        "jax": jax.__version__,
        "device": device.device_kind,
        "platform": device.platform,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "smoke": args.smoke,
        "reps_per_round": reps,
        "rounds": rounds,
    }
    print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}); times: medians")
    for name, make in workloads.items():
        if args.only and name != args.only:
            continue
        w, (optimizer, lr), kw = make()
        result = run_workload(w, variants(w, optimizer, lr, **kw), reps, rounds, fresh)
        report[name] = result
        print(format_rows(name, result), flush=True)
    if args.out:
        write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
