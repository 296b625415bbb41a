"""Where the many-leaf model's compile time goes: the MLP's step, piece by piece.

    python -m benchmarks.compile_probe                 # the MLP of 250 layers (500 leaves)
    python -m benchmarks.compile_probe --depth 1000    # the whole-model benchmark's size
    python -m benchmarks.compile_probe --smoke         # tiny, to check the script

On an NVIDIA H200 the packed MLP's whole training step (`benchmarks.whole_model`) compiled
in 2.36x optax's time (134.0 against 56.7 s), while on the CPU it compiles in 0.60x. This
script takes that step apart. Each variant is one jitted step of the Equinox MLP, traced,
lowered and compiled from cleared caches, and it reports the trace-and-lower and the XLA
compile seconds of:

- optax's Adam on the tree, and the model's gradient alone on the tree (the references);
- the packed model's gradient alone, leaves read at runtime offsets: the unpacking and its
  gradient, with no optimizer;
- gradtx's Adam on packed params, offsets at runtime (as in `benchmarks.whole_model`) and
  offsets static (`unpack()` with none): the whole step.

Run under different `XLA_FLAGS` (`benchmarks/gpu_suite.sh` turns off autotuning, Triton's
matrix products, and the fusion autotuner, one at a time), the rows say which part, and which
compiler stage, takes the time.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import jax

from benchmarks import models
from benchmarks.results import write_json
from benchmarks.whole_model import OWN_BUFFER_FROM, _packed_step, variants

LR = 1e-3


def _packed_gradient_step(w: models.Workload) -> Callable:
    # The model's gradient through `unpack`, returned packed: the floor of the packed step.
    def step(packed, batch, offsets):
        def loss(p):
            return w.loss(w.from_plain(p.unpack(offsets)), batch)

        return w.value_and_grad(loss)(packed)

    return jax.jit(step)


def builders(w: models.Workload) -> dict[str, Callable[[], tuple]]:
    """name -> `() -> (jitted step, its arguments)`."""
    import gradtx

    whole = variants(w, "adam", LR)

    def packed() -> Any:
        params = jax.tree.map(lambda x: x.copy(), w.params)
        return gradtx.pack(w.to_plain(params), own_buffer_from=OWN_BUFFER_FROM)

    def packed_step(static: bool) -> tuple:
        tx, p = gradtx.adam(LR), packed()
        return _packed_step(w, tx), (p, tx.init(p), w.batch, None if static else p.offsets())

    def packed_gradient() -> tuple:
        p = packed()
        return _packed_gradient_step(w), (p, w.batch, p.offsets())

    return {
        "optax adam, tree": whole["optax adam"],
        "tree gradient only": whole["model gradient only"],
        "packed gradient only": packed_gradient,
        "gradtx adam, packed, runtime offsets": lambda: packed_step(static=False),
        "gradtx adam, packed, static offsets": lambda: packed_step(static=True),
    }


def probe(w: models.Workload, only: list[str] | None = None) -> list[dict]:
    """Trace+lower and compile seconds of each variant, caches cleared before each."""
    rows = []
    jax.jit(w.loss).lower(w.params, w.batch).compile()  # one-time costs, untimed
    for name, build in builders(w).items():
        if only and name not in only:
            continue
        jax.clear_caches()
        step, args = build()
        args = jax.block_until_ready(args)
        t0 = time.perf_counter()
        lowered = step.lower(*args)
        t1 = time.perf_counter()
        lowered.compile()
        t2 = time.perf_counter()
        rows.append({"variant": name, "lower_s": t1 - t0, "compile_s": t2 - t1})
        print(f"{name:<40}{t1 - t0:>9.2f}{t2 - t1:>11.2f}{t2 - t0:>9.2f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny MLP")
    parser.add_argument("--depth", type=int, default=250, help="layers (two leaves each)")
    parser.add_argument("--only", action="append", default=None, help="a variant (repeatable)")
    parser.add_argument("--out", default="benchmarks/results/compile_probe.json")
    args = parser.parse_args(argv)
    w = models.mlp(args.smoke, depth=args.depth)
    device = jax.devices()[0]
    flags = os.environ.get("XLA_FLAGS", "")
    print(f"jax {jax.__version__} on {device.device_kind}; MLP {w.config}; XLA_FLAGS={flags!r}")
    print(f"{'variant':<40}{'lower s':>9}{'compile s':>11}{'total s':>9}")
    report = {
        "jax": jax.__version__,
        "device": device.device_kind,
        "xla_flags": flags,
        "config": w.config,
        "rows": probe(w, args.only),
    }
    if args.out:
        write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
