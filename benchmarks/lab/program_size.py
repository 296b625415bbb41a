"""What each library's compiled step launches and passes: kernels and arrays, not run.

    python -m benchmarks.lab.program_size                   # every configuration, this device
    python -m benchmarks.lab.program_size --config "clip+adamw(cosine, mask)"
    python -m benchmarks.lab.program_size --gpu-target benchmarks/lab/gpu_targets/h100.txtpb
                                                        # for an H100, without one
    python -m benchmarks.lab.program_size --smoke           # tiny sizes, to check the script

On a GPU a tree's step is bound by the host: its time follows the kernels the program
launches and the arrays it passes in and out more than its arithmetic (see the performance
page). Where gradtx's step timed slower than optax's there, these counts tell whether its
program is the larger one, or the difference is the timing's spread.

For each of `benchmarks.run`'s configurations, on the transformer-like tree and on 2000
small leaves packed, the donated step of each library is compiled (for `--gpu-target`'s
GPU when given, see `gpu_target.py`) and never run. Counted:

- kernels: the instructions of the optimized program's entry computation that run on the
  device (`benchmarks.lab.kernels.entry_kernels`), and those of them that are copies;
- arrays: the leaves of `(params, state, grads)` passed in, and of `(params, state)` out.
"""

from __future__ import annotations

import argparse
from typing import Any

import jax

from benchmarks import configs as C
from benchmarks import workloads as W
from benchmarks.cli import add_config_option
from benchmarks.lab import gpu_target
from benchmarks.lab.kernels import entry_kernels
from benchmarks.results import write_json
from benchmarks.run import step_fn


def count(lib: str, tx: Any, workload: W.Workload, device: Any = None) -> dict:
    """The kernels and arrays of `lib`'s donated step of `tx` on `workload`, compiled only."""
    import optax

    import gradtx

    apply = gradtx.apply_updates if lib == "gradtx" else optax.apply_updates
    params = jax.eval_shape(workload.params)
    state = jax.eval_shape(tx.init, params)
    args, platforms = gpu_target.for_device(device, (params, state, params))
    jitted = jax.jit(step_fn(tx, apply), donate_argnums=(0, 1))
    traced = jitted.trace(*args)
    kernels = entry_kernels(traced.lower(lowering_platforms=platforms).compile().as_text())
    return {
        "kernels": sum(kernels.values()),
        "copies": kernels.get("copy", 0) + kernels.get("copy-start", 0),
        "arrays_in": len(jax.tree.leaves(args)),
        "arrays_out": len(jax.tree.leaves(traced.out_info)),
    }


def run(workloads: list[W.Workload], only: list[str] | None, device: Any = None) -> list[dict]:
    """One row per workload and configuration: each library's counts side by side."""
    rows = []
    print(f"{'workload':<32}{'config':<30}{'kernels':>16}{'copies':>10}{'arrays in':>14}")
    print(f"{'':<62}{'gradtx  optax':>16}{'gx  ox':>10}{'gradtx  optax':>14}")
    for w in workloads:
        for config in C.configs():
            if not config.applies(w) or (only and config.name not in only):
                continue
            g, o = (
                count("gradtx", config.gradtx(w), w, device),
                count("optax", config.optax(w), w, device),
            )
            row = {"workload": w.name, "config": config.name, "gradtx": g, "optax": o}
            rows.append(row)
            print(
                f"{w.name:<32}{config.name:<30}{g['kernels']:>8}{o['kernels']:>8}"
                f"{g['copies']:>6}{o['copies']:>4}{g['arrays_in']:>8}{o['arrays_in']:>6}",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny workloads")
    add_config_option(parser, C.configs())
    parser.add_argument(
        "--gpu-target", help="compile for this GPU target config, here (see gpu_target.py)"
    )
    parser.add_argument("--out", default="benchmarks/results/program_size.json")
    args = parser.parse_args(argv)
    if args.smoke:
        workloads = [W.transformer_like(1, 32, 64), W.many_leaves_packed(20)]
    else:
        workloads = [W.transformer_like(), W.many_leaves_packed()]
    target, head = gpu_target.report_head(args.gpu_target)
    print(f"jax {head['jax']}, compiled for {head['device']}")
    report = {**head, "rows": run(workloads, args.config, target)}
    if args.out:
        write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
