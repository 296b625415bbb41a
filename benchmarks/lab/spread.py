"""The harness's own spread: one library's step timed against a copy of itself.

    python -m benchmarks.lab.spread                                   # packed, sgd momentum
    python -m benchmarks.lab.spread --only transformer --config adam --lib gradtx
    python -m benchmarks.lab.spread --only large --config "accumulate(sgd)"   # a combinator

Two `Contender`s of the same library and configuration (the same program, compiled twice,
each with buffers of its own) are timed exactly as `benchmarks.run` times gradtx against
optax: blocks alternating, the first one alternating by round. Their ratio would be 1.00 on
a perfect machine; what it is instead bounds the differences the suite can resolve between
the two libraries on that workload. On the packed 1-3 ms steps it measured 0.97-1.11x.
"""

from __future__ import annotations

import argparse

from benchmarks import workloads as W
from benchmarks.combinators import combinator_configs, large_leaves, small_leaves
from benchmarks.configs import configs
from benchmarks.run import Contender

_WORKLOADS = {
    "packed": lambda: W.many_leaves_packed(2000),
    "transformer": W.transformer_like,
    "big": W.one_big_leaf,
    "large": large_leaves,
    "small": small_leaves,
}


def _configs() -> list:
    """The optimizer configurations of `benchmarks.run` and those of the combinators."""
    return configs() + combinator_configs()


def measure(workload: W.Workload, config_name: str, lib: str, reps: int, rounds: int) -> dict:
    """Medians of the donated step of two copies of `lib`'s step, and their ratio."""
    (config,) = [c for c in _configs() if c.name == config_name]
    # Compile times are not compared here: the caches are kept (`fresh=False`).
    pair = [
        Contender(lib, getattr(config, lib)(workload), workload, eager=False, fresh=False)
        for _ in "ab"
    ]
    for contender in pair:
        contender.warm_up()
    for r in range(rounds):
        for contender in pair if r % 2 == 0 else pair[::-1]:
            contender.time(reps, 0)
    first, second = (c.results()["donated_ms"] for c in pair)
    return {"first_ms": first, "second_ms": second, "ratio": second / first}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(_WORKLOADS), default="packed")
    names = sorted({c.name for c in _configs()})
    parser.add_argument("--config", choices=names, default="sgd momentum", metavar="NAME")
    parser.add_argument("--lib", choices=("gradtx", "optax"), action="append", default=None)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    workload = _WORKLOADS[args.only]()
    out = {}
    for lib in args.lib or ("optax", "gradtx"):
        out[lib] = got = measure(workload, args.config, lib, args.reps, args.rounds)
        print(
            f"{workload.name}, {args.config}, {lib} against itself: "
            f"{got['first_ms']:.3f} and {got['second_ms']:.3f} ms, ratio {got['ratio']:.2f}",
            flush=True,
        )
    return out


if __name__ == "__main__":
    main()
