"""Combinators around an optimizer, against optax's, on a few large leaves and many small ones.

    python -m benchmarks.combinators            # four leaves of 3.1M floats, 150 small ones
    python -m benchmarks.combinators --smoke    # tiny leaves, to check that it runs
    python -m benchmarks.lab.spread --only large --config "accumulate(sgd)"   # the day's spread

Gradient accumulation (`accumulate` against optax's `MultiSteps`, every 4 calls), skipping
non-finite steps (`apply_if_finite`, with gradtx's default check of the updates and with the
gradients alone, as optax checks) and masking. The steps are timed as `benchmarks.run`
times the suite (donated, blocks alternating, compiles from cleared caches), and the same
table is printed; results go to benchmarks/results/combinators.json.
"""

from __future__ import annotations

import argparse
from typing import Any

import jax
import numpy as np

from benchmarks import workloads as W
from benchmarks.cli import add_config_option
from benchmarks.configs import Config, _adam_bytes
from benchmarks.results import write_json
from benchmarks.run import HEADER, run

EVERY = 4  # calls per optimizer step of the accumulating configurations


def large_leaves() -> W.Workload:
    """Two matrices and two vectors, 3.1M floats: steps bound by memory, not by the host."""
    shapes = {
        "enc/kernel": (1024, 1024),
        "enc/bias": (1024,),
        "dec/kernel": (512, 1024),
        "dec/scale": (1 << 20,),
    }
    return W.Workload("four large leaves", shapes)


def small_leaves() -> W.Workload:
    """150 leaves of 64 x 64 floats: steps bound by the kernels' count, compiles by the
    kernels' code."""
    return W.Workload("150 small leaves", {f"layers/{i}/kernel": (64, 64) for i in range(150)})


def _accumulate_bytes(inner_slots: int) -> Any:
    """Bytes a call moves: read g, the accumulator and p, write the accumulator and p; once
    per `EVERY` calls the inner step also reads and writes its `inner_slots` slots."""
    return lambda p, s: 3 * p + 2 * s + 2 * inner_slots * s // EVERY


def _is_kernel(params: Any) -> Any:
    return jax.tree_util.tree_map_with_path(lambda kp, _: "kernel" in str(kp[-1]), params)


def combinator_configs() -> list[Config]:
    """Each combinator built the same way in gradtx and in optax."""
    import optax

    import gradtx

    f32 = np.float32

    def o_adam() -> Any:
        return optax.adam(1e-3, b1=f32(0.9), b2=f32(0.999))

    def multi_steps(inner: Any) -> Any:
        return optax.MultiSteps(inner, EVERY).gradient_transformation()

    return [
        Config(
            "accumulate(sgd)",
            lambda w: gradtx.accumulate(gradtx.sgd(1e-2), EVERY),
            lambda w: multi_steps(optax.sgd(1e-2)),
            _accumulate_bytes(0),
        ),
        Config(
            "accumulate(sgd momentum)",
            lambda w: gradtx.accumulate(gradtx.sgd(1e-2, momentum=0.9), EVERY),
            lambda w: multi_steps(optax.sgd(1e-2, momentum=f32(0.9))),
            _accumulate_bytes(1),
        ),
        Config(
            "accumulate(adam)",
            lambda w: gradtx.accumulate(gradtx.adam(1e-3), EVERY),
            lambda w: multi_steps(o_adam()),
            _accumulate_bytes(2),
        ),
        # gradtx's default also skips a step whose updates are not finite; optax looks at the
        # gradients alone, as `check_updates=False` does.
        Config(
            "apply_if_finite(adam)",
            lambda w: gradtx.apply_if_finite(gradtx.adam(1e-3), 3),
            lambda w: optax.apply_if_finite(o_adam(), 3),
            _adam_bytes,
        ),
        Config(
            "apply_if_finite, grads",
            lambda w: gradtx.apply_if_finite(gradtx.adam(1e-3), 3, check_updates=False),
            lambda w: optax.apply_if_finite(o_adam(), 3),
            _adam_bytes,
        ),
        Config(
            "masked(adam, kernels)",
            lambda w: gradtx.masked(gradtx.adam(1e-3), "**/kernel"),
            lambda w: optax.masked(o_adam(), _is_kernel),
            _adam_bytes,
        ),
    ]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny leaves, one compile each")
    parser.add_argument("--out", default="benchmarks/results/combinators.json")
    add_config_option(parser, combinator_configs())
    args = parser.parse_args(argv)
    if args.smoke:
        workloads = [W.Workload("two small leaves", {"enc/kernel": (8, 8), "enc/bias": (8,)})]
        reps, rounds, compile_samples, fresh = 2, 2, 1, False
    else:
        workloads = [large_leaves(), small_leaves()]
        reps, rounds, compile_samples, fresh = 5, 8, 3, True
    print(f"jax {jax.__version__} on {jax.default_backend()}; times are medians in ms")
    print(HEADER)
    report = run(
        workloads,
        reps,
        0,
        rounds,
        args.config,
        compile_samples,
        fresh,
        args.out,
        candidates=combinator_configs(),
    )
    if args.out:
        write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
