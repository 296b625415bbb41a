"""Host time per optimizer step: a step with almost no arithmetic, issued back to back.

    python -m benchmarks.lab.host_overhead                          # every configuration
    python -m benchmarks.lab.host_overhead --config "clip+adamw(cosine, mask)"
    python -m benchmarks.lab.host_overhead --smoke                  # a few calls, to check it

The step runs on two small leaves packed into one buffer (4096 floats), so its time is what
the host does per call: flatten the arguments, launch the program, wrap its outputs and
rebuild the trees. `benchmarks.run` waits for each call (a call's latency); here a block of
calls is issued back to back and waited for once, as a training loop issues them, so the
figure is the time per step of a loop bound by the host.

Each library's donated step is built twice (two copies, each compiled and with buffers of
its own), and the copies' blocks alternate, their order reversed every round. A copy's
figure is its fastest block: the slower ones are the machine's noise. The two copies of one
library measure the harness's spread. Where gradtx's state keeps statistics (the clipped
chain's norm and whether it clipped, a schedule's last value), a third variant times
`gradtx.without_statistics` of the same transformation ("lean"), the state optax keeps.

The floor of those extra arrays is measured beside them: two bare jitted steps over the
same buffer, which write scalars into their donated state, one returning as many arrays as
optax's step, one as many as gradtx's. Their difference is what the arrays cost this
machine's JAX on their own ("arrays floor"), and optax's time plus it is the time a step
that keeps those statistics cannot beat ("floor ratio": gradtx's time over it). An array's
cost is not the same at every count (a bare step's first few scalars cost more each than
later ones), so the floor is measured at the counts of the two steps.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import configs as C
from benchmarks import workloads as W
from benchmarks.cli import add_config_option
from benchmarks.results import write_json
from benchmarks.run import _copy, step_fn


def _variants(config: C.Config, workload: W.Workload) -> dict[str, Any]:
    """Each variant's transformation: gradtx, its lean form where it differs, optax."""
    import gradtx

    tx = config.gradtx(workload)
    lean = gradtx.without_statistics(tx)
    params = workload.params(0)
    out = {"gradtx": tx}
    if jax.tree.structure(lean.init(params)) != jax.tree.structure(tx.init(params)):
        out["lean"] = lean
    return {**out, "optax": config.optax(workload)}


class Copy:
    """One donated step `(params, state, grads) -> (params, state)`, compiled with its own
    buffers, and its timed blocks."""

    def __init__(self, step: Any, params: Any, state: Any, grads: Any) -> None:
        self.grads = grads
        self.step = jax.jit(step, donate_argnums=(0, 1))
        self.carry = jax.block_until_ready(self.step(params, state, grads))
        self.arrays = len(jax.tree.leaves(self.carry))
        self.blocks: list[float] = []

    @classmethod
    def of(cls, lib: str, tx: Any, workload: W.Workload) -> Copy:
        """A variant's step: `tx`'s update, applied by its library's `apply_updates`."""
        import optax

        import gradtx

        apply = optax.apply_updates if lib == "optax" else gradtx.apply_updates
        params = workload.params(0)
        return cls(step_fn(tx, apply), _copy(params), tx.init(params), workload.params(1))

    @classmethod
    def bare(cls, scalars: int, size: int = 4096) -> Copy:
        """A step of one addition over `size` floats, writing `scalars` more scalars (a
        statistic's share: a reduction of the gradient, in its own buffer of the state)."""

        def step(x: jax.Array, state: dict, g: jax.Array) -> tuple:
            total = g.sum()
            return x + g, {name: total + i for i, name in enumerate(state)}

        state = {f"s{i}": jnp.zeros((), jnp.float32) for i in range(scalars)}
        return cls(step, jnp.zeros(size, jnp.float32), state, jnp.ones(size, jnp.float32))

    def time(self, calls: int) -> None:
        """One block: `calls` steps back to back, then one wait; the time per step."""
        carry = self.carry
        t0 = time.perf_counter()
        for _ in range(calls):
            carry = self.step(*carry, self.grads)
        self.carry = jax.block_until_ready(carry)
        self.blocks.append((time.perf_counter() - t0) / calls)


def measure(config: C.Config, workload: W.Workload, calls: int, rounds: int) -> dict:
    """Microseconds per step of each copy, the ratios to optax and each variant's spread."""
    variants = _variants(config, workload)
    copies = [Copy.of(lib, tx, workload) for lib, tx in variants.items() for _ in "ab"]
    arrays = {lib: copies[2 * i].arrays for i, lib in enumerate(variants)}
    # The floor of gradtx's arrays beyond optax's, timed in the same rounds: bare steps
    # returning as many arrays as optax's step and as gradtx's (the buffer and scalars).
    floor_at = (arrays["optax"], arrays["gradtx"])
    if floor_at[1] > floor_at[0]:
        copies += [Copy.bare(n - 1) for n in floor_at for _ in "ab"]
    for copy in copies:  # warm-up blocks, not kept
        copy.time(calls)
        copy.blocks.clear()
    for r in range(rounds):
        for copy in copies if r % 2 == 0 else copies[::-1]:
            copy.time(calls)
    us = [min(copy.blocks) * 1e6 for copy in copies]
    row: dict[str, Any] = {"workload": workload.name, "config": config.name}
    for i, lib in enumerate(variants):
        first, second = us[2 * i], us[2 * i + 1]
        row[f"{lib}_us"] = min(first, second)
        row[f"{lib}_spread"] = max(first, second) / min(first, second)
        row[f"{lib}_arrays_out"] = arrays[lib]
    row["ratio"] = row["gradtx_us"] / row["optax_us"]
    if "lean" in variants:
        row["lean_ratio"] = row["lean_us"] / row["optax_us"]
    if floor_at[1] > floor_at[0]:
        bare = us[2 * len(variants) :]
        row["floor_arrays_out"] = [copy.arrays for copy in copies[2 * len(variants) :: 2]]
        # Noise can put the larger bare step first; a floor is never below zero.
        row["arrays_floor_us"] = max(min(bare[2:]) - min(bare[:2]), 0.0)
        row["floor_ratio"] = row["gradtx_us"] / (row["optax_us"] + row["arrays_floor_us"])
    return row


def format_row(row: dict) -> str:
    lean = f"{row['lean_us']:>9.1f}{row['lean_ratio']:>7.2f}" if "lean_us" in row else f"{'-':>16}"
    floor = (
        f"{row['arrays_floor_us']:>8.1f}{row['floor_ratio']:>7.2f}"
        if "arrays_floor_us" in row
        else f"{'-':>15}"
    )
    return (
        f"{row['config']:<28}{row['gradtx_us']:>9.1f}{row['optax_us']:>9.1f}{row['ratio']:>7.2f}"
        f"{lean}{floor}{row['gradtx_spread']:>8.2f}{row['optax_spread']:>8.2f}"
        f"{row['gradtx_arrays_out']:>6}{row['optax_arrays_out']:>6}"
    )


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few calls, one round")
    add_config_option(parser, C.configs())
    parser.add_argument("--out", default=None, help="write the rows here as JSON")
    args = parser.parse_args(argv)
    calls, rounds = (5, 2) if args.smoke else (1000, 10)
    workload = W.many_leaves_packed(2)
    chosen = [
        c for c in C.configs() if c.applies(workload) and (not args.config or c.name in args.config)
    ]
    print(f"jax {jax.__version__} on {jax.default_backend()}: {workload.name}, microseconds per")
    print("step of back-to-back donated steps (fastest of each copy's blocks); spread: one")
    print("library's two copies apart; lean: gradtx without statistics, where it differs;")
    print("floor: what gradtx's extra arrays cost a bare step, and gradtx over optax plus it;")
    print("out: arrays each step returns")
    print(
        f"{'config':<28}{'gradtx':>9}{'optax':>9}{'ratio':>7}{'lean':>9}{'ratio':>7}"
        f"{'floor':>8}{'ratio':>7}{'gtx sp':>8}{'opx sp':>8}{'gtx':>6}{'opx':>6}"
    )
    rows = []
    for config in chosen:
        rows.append(measure(config, workload, calls, rounds))
        print(format_row(rows[-1]), flush=True)
    if args.out:
        report = {"jax": jax.__version__, "backend": jax.default_backend(), "rows": rows}
        write_json(args.out, report)
    return rows


if __name__ == "__main__":
    main()
