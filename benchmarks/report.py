"""Print a results file of `benchmarks.run` as the Markdown table of the performance page.

python -m benchmarks.report benchmarks/results/full.json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

COLUMNS = (
    "| workload | config | bound ms | gradtx ms | optax ms | ratio | gradtx x bound | "
    "optax x bound | gradtx compile s | optax compile s | compile ratio | gradtx eager ms | "
    "optax eager ms |"
)


def _num(x: Any, digits: int) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}f}"


def markdown_rows(report: dict) -> list[str]:
    lines = [COLUMNS, "|" + "---|" * COLUMNS.count(" |")]
    for r in report["results"]:
        bound, g, o = r["bound_ms"], r["gradtx_donated_ms"], r["optax_donated_ms"]
        gc, oc = r["gradtx_compile_s"], r["optax_compile_s"]
        digits = 1 if min(g, o) >= 10 else 2
        cells = [
            r["workload"],
            r["config"],
            _num(bound, 2),
            _num(g, digits),
            _num(o, digits),
            _num(g / o, 2),
            _num(g / bound, 2),
            _num(o / bound, 2),
            _num(gc, 2),
            _num(oc, 2),
            _num(gc / oc, 2),
            _num(r["gradtx_eager_ms"], 0),
            _num(r["optax_eager_ms"], 0),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="JSON files written by `benchmarks.run`")
    args = parser.parse_args(argv)
    merged: dict = {"results": []}
    for path in args.results:
        with open(path) as f:
            report = json.load(f)
        if not isinstance(report, dict) or not report.get("results"):
            continue  # a training-only run, or another experiment's file
        print(f"{path}: streaming bandwidth {report['bandwidth_gb_s']:.1f} GB/s")
        merged["results"].extend(report["results"])
    print("\n".join(markdown_rows(merged)))


if __name__ == "__main__":
    main()
