"""L-BFGS with its zoom line search, against optax's, on a few large leaves and many small ones.

    python -m benchmarks.lbfgs                # four leaves of 3.1M floats, 150 of 64 x 64
    python -m benchmarks.lbfgs --only large   # the large leaves alone
    python -m benchmarks.lbfgs --smoke        # tiny leaves, to check that it runs
    python -m benchmarks.lbfgs --spread       # optax against a copy of itself: the spread

A step is what a user's loop runs: the loss and gradient (read back from the line search's
state after the first step, `value_and_grad_from_state`), the update, whose line search
evaluates the loss and gradient at each trial step size, and the apply. The loss is a
weighted sum of `cosh(x) - 1`, elementwise, so that the optimizer's passes over the params
are a large share of the step.

Both libraries take the same steps (the same trials, the losses checked equal), so a block
is a run of `--steps` donated steps from the same start, its time divided by the steps; the
blocks alternate between the libraries, the first of each round too, and the figure is the
median block. Each compile starts from cleared caches (tracing included), alternating; one
under 2 s is repeated three times, the figure their median.
Results go to benchmarks/results/lbfgs.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import workloads as W
from benchmarks.cli import check_selected
from benchmarks.combinators import large_leaves, small_leaves
from benchmarks.fresh import clear_caches
from benchmarks.results import write_json
from benchmarks.run import _REPEAT_COMPILES_UNDER_S, _copy, _ready


def loss_fn(params: dict) -> jax.Array:
    """`sum(d * (cosh(x) - 1))` over the leaves, `d` from 1 to 7 along the last axis."""
    total = jnp.zeros((), jnp.float32)
    for x in jax.tree.leaves(params):
        weight = 1.0 + jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1) % 7
        total = total + jnp.sum(weight.astype(x.dtype) * (jnp.cosh(x) - 1))
    return total


class Contender:
    """One library's L-BFGS step on one workload: compiled afresh, then timed in blocks."""

    def __init__(self, name: str, lib: str, workload: W.Workload) -> None:
        import optax

        import gradtx

        module = gradtx if lib == "gradtx" else optax
        tx = module.lbfgs()
        value_and_grad = module.value_and_grad_from_state(loss_fn)

        def step(params: Any, state: Any) -> tuple:
            value, grads = value_and_grad(params, state=state)
            updates, state = tx.update(
                grads, state, params, value=value, grad=grads, value_fn=loss_fn
            )
            return module.apply_updates(params, updates), state, value

        self.name, self.step, self.tx = name, step, tx
        self.params = _ready(workload.params(0))
        self.state = _ready(tx.init(self.params))
        self.compile_times: list[float] = []
        self.block_times: list[float] = []
        self.losses: list[float] = []

    def compile(self) -> None:
        """Compile the donated step from cleared caches and a new state, and time it."""
        clear_caches()
        self.state = _ready(self.tx.init(self.params))
        t0 = time.perf_counter()
        lowered = jax.jit(self.step, donate_argnums=(0, 1)).lower(self.params, self.state)
        self.compiled = lowered.compile()
        self.compile_times.append(time.perf_counter() - t0)

    def time(self, steps: int) -> None:
        """`steps` donated steps from the start (copies of it), waited for once."""
        # optax's `init` gives two memories one buffer, which a donated call refuses: copies.
        params, state = _ready((_copy(self.params), _copy(self.state)))
        values = []
        t0 = time.perf_counter()
        for _ in range(steps):
            params, state, value = self.compiled(params, state)
            values.append(value)
        _ready(params)
        self.block_times.append((time.perf_counter() - t0) / steps)
        self.losses = [float(v) for v in values]


def measure(
    workload: W.Workload, steps: int, rounds: int, compiles: int, spread: bool = False
) -> dict:
    """Compile and step times of both libraries on `workload`, and their ratios; with
    `spread`, of optax against a copy of itself (named "gradtx" in the row)."""
    first = "optax" if spread else "gradtx"
    contenders = [Contender("gradtx", first, workload), Contender("optax", "optax", workload)]
    for r in range(compiles):
        for contender in contenders if r % 2 == 0 else contenders[::-1]:
            contender.compile()
        if max(c.compile_times[0] for c in contenders) >= _REPEAT_COMPILES_UNDER_S:
            break  # one sample of a long compile is not mostly noise
    for contender in contenders:  # a warm-up block each, not kept
        contender.time(steps)
        contender.block_times.clear()
    for r in range(rounds):
        for contender in contenders if r % 2 == 0 else contenders[::-1]:
            contender.time(steps)
    ours, theirs = contenders
    np.testing.assert_allclose(ours.losses, theirs.losses, rtol=1e-4, err_msg=workload.name)
    row: dict[str, Any] = {
        "workload": workload.name,
        "leaves": workload.num_leaves,
        "params": workload.num_params,
        "steps": steps,
        "final_loss": ours.losses[-1],
    }
    for c in contenders:
        row[f"{c.name}_step_ms"] = statistics.median(c.block_times) * 1e3
        row[f"{c.name}_blocks_ms"] = [t * 1e3 for t in c.block_times]
        row[f"{c.name}_compile_s"] = statistics.median(c.compile_times)
    row["step_ratio"] = row["gradtx_step_ms"] / row["optax_step_ms"]
    row["compile_ratio"] = row["gradtx_compile_s"] / row["optax_compile_s"]
    return row


def format_row(row: dict) -> str:
    return (
        f"{row['workload']:<20}{row['gradtx_step_ms']:>10.2f}{row['optax_step_ms']:>10.2f}"
        f"{row['step_ratio']:>7.2f}{row['gradtx_compile_s']:>9.2f}{row['optax_compile_s']:>9.2f}"
        f"{row['compile_ratio']:>7.2f}"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny leaves, few blocks")
    parser.add_argument("--steps", type=int, default=8, help="steps per timed block")
    parser.add_argument(
        "--spread", action="store_true", help="optax against a copy of itself: the day's spread"
    )
    parser.add_argument("--only", default="", help="run workloads whose name contains this")
    parser.add_argument("--out", default="benchmarks/results/lbfgs.json")
    args = parser.parse_args(argv)
    if args.smoke:
        workloads = [W.Workload("two small leaves", {"enc/kernel": (8, 8), "enc/bias": (8,)})]
        rounds, compiles = 2, 1
    else:
        every = (large_leaves(), small_leaves())
        workloads = [w for w in every if args.only in w.name]
        check_selected(parser, workloads, "--only", args.only, [w.name for w in every])
        rounds, compiles = 8, 3
    print(f"jax {jax.__version__} on {jax.default_backend()}: L-BFGS (zoom line search),")
    print(f"{args.steps} donated steps per block from the same start; medians")
    if args.spread:
        print("the spread: optax (in the gradtx columns) against a copy of itself")
    print(
        f"{'workload':<20}{'gtx ms':>10}{'opx ms':>10}{'ratio':>7}"
        f"{'gtx cmp':>9}{'opx cmp':>9}{'ratio':>7}"
    )
    rows = []
    for workload in workloads:
        rows.append(measure(workload, args.steps, rounds, compiles, args.spread))
        print(format_row(rows[-1]), flush=True)
    report = {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "spread": args.spread,
        "rows": rows,
    }
    write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
