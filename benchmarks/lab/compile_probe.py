"""Where the many-leaf model's compile time goes: the MLP's step, piece by piece.

    python -m benchmarks.lab.compile_probe                 # the MLP of 250 layers (500 leaves)
    python -m benchmarks.lab.compile_probe --depth 1000    # the whole-model benchmark's size
    python -m benchmarks.lab.compile_probe --smoke         # tiny, to check the script
    python -m benchmarks.lab.compile_probe --gpu-target benchmarks/lab/gpu_targets/h100.txtpb
                                                       # for an H100, without one (gpu_target.py)

On an NVIDIA H200 the packed MLP's whole training step (`benchmarks.whole_model`) compiled
in 2.36x optax's time (134.0 against 56.7 s), while on the CPU it compiled in 0.60x. This
script took that step apart; compiled for an H100 on the CPU (`--gpu-target`), it showed
XLA's GPU multi-output fusion spending most of the time on the leaves' slices of one buffer,
which `gradtx.pack` now reads through views (`LEAVES_PER_VIEW` in its module).

Each variant is one jitted step of the Equinox MLP, traced, lowered and compiled from
cleared caches, and the script reports the trace-and-lower and the XLA compile seconds of:

- optax's Adam on the tree, and the model's gradient alone on the tree (the references);
- the packed model's gradient alone, leaves read at runtime offsets: the unpacking and its
  gradient, with no optimizer;
- gradtx's Adam on packed params, offsets at runtime (as in `benchmarks.whole_model`) and
  offsets static (`unpack()` with none): the whole step.

Run under different `XLA_FLAGS` (`benchmarks/lab/gpu_suite.sh` turns off autotuning, Triton's
matrix products, and the fusion autotuner, one at a time, when `PARTS` names
`compile_probe_no_autotune`, `compile_probe_no_triton` or
`compile_probe_no_fusion_autotuner`), the rows say which part, and which compiler stage,
takes the time.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import jax

from benchmarks import models
from benchmarks.compile_time import lower_and_compile_s
from benchmarks.fresh import clear_caches
from benchmarks.lab import gpu_target
from benchmarks.results import write_json
from benchmarks.whole_model import variants


def _packed_gradient_step(w: models.Workload) -> Callable:
    # The model's gradient through `unpack`, returned packed: the floor of the packed step.
    def step(packed, batch, offsets):
        def loss(p):
            return w.loss(w.from_plain(p.unpack(offsets)), batch)

        return w.value_and_grad(loss)(packed)

    return jax.jit(step)


def builders(w: models.Workload) -> dict[str, Callable[[], tuple]]:
    """name -> `() -> (jitted step, its arguments)`, from `benchmarks.whole_model`'s variants."""
    whole = variants(w, "adam", 1e-3)
    packed = whole["gradtx adam, packed params"]  # args: (packed, state, batch, offsets)

    def static_offsets() -> tuple:
        step, (p, state, batch, _) = packed()
        return step, (p, state, batch, None)

    def packed_gradient() -> tuple:
        _, (p, _, batch, offsets) = packed()
        return _packed_gradient_step(w), (p, batch, offsets)

    return {
        "optax adam, tree": whole["optax adam"],
        "tree gradient only": whole["model gradient only"],
        "packed gradient only": packed_gradient,
        "gradtx adam, packed, runtime offsets": packed,
        "gradtx adam, packed, static offsets": static_offsets,
    }


def probe(w: models.Workload, only: list[str] | None = None, device: Any = None) -> list[dict]:
    """Trace+lower and compile seconds of each variant, caches cleared before each.

    With `device` (from `gpu_target.compile_only_device`), each compiles for that device.
    """
    known = builders(w)
    unknown = sorted(set(only or ()) - set(known))
    if unknown:  # a misspelt variant would otherwise be skipped without a word
        listed = ", ".join(repr(name) for name in known)
        raise ValueError(f"compile_probe: no variant named {unknown[0]!r}; the variants: {listed}")
    rows = []
    jax.jit(w.loss).lower(w.params, w.batch).compile()  # one-time costs, untimed
    for name, build in known.items():
        if only and name not in only:
            continue
        clear_caches()
        step, args = build()
        args, platforms = gpu_target.for_device(device, jax.block_until_ready(args))
        lower_s, compile_s = lower_and_compile_s(step, *args, platforms=platforms)
        rows.append({"variant": name, "lower_s": lower_s, "compile_s": compile_s})
        print(f"{name:<40}{lower_s:>9.2f}{compile_s:>11.2f}{lower_s + compile_s:>9.2f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny MLP")
    parser.add_argument("--depth", type=int, default=250, help="layers (two leaves each)")
    parser.add_argument("--only", action="append", default=None, help="a variant (repeatable)")
    parser.add_argument("--out", default="benchmarks/results/compile_probe.json")
    parser.add_argument(
        "--gpu-target", help="compile for this GPU target config, here (see gpu_target.py)"
    )
    args = parser.parse_args(argv)
    w = models.mlp(args.smoke, depth=args.depth)
    target, head = gpu_target.report_head(args.gpu_target)
    flags = os.environ.get("XLA_FLAGS", "")
    print(f"jax {head['jax']} on {head['device']}; MLP {w.config}; XLA_FLAGS={flags!r}")
    print(f"{'variant':<40}{'lower s':>9}{'compile s':>11}{'total s':>9}")
    report = {**head, "xla_flags": flags, "config": w.config}
    report["rows"] = probe(w, args.only, target)
    if args.out:
        write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
