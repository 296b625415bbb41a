"""Draw gradtx's times as a fraction of optax's, from benchmark JSON, into an SVG chart.

    python -m benchmarks.chart                                  # the committed snapshots
    python -m benchmarks.chart benchmarks/results/*.json        # a fresh run's result files
    python -m benchmarks.chart benchmarks/snapshots/*.json benchmarks/results/*.json
    python -m benchmarks.chart --markdown                       # the figures, as a table
    python -m benchmarks.chart --ratios                         # the performance page's table
    python -m benchmarks.chart --snapshot benchmarks/snapshots/cpu.json --source "..." \\
        benchmarks/results/*.json                               # a fresh run as a snapshot

There is one chart per device, `docs/images/performance-<device>.svg` (`--out-dir` sets the
folder; the device is its label in lower case, without "NVIDIA": `cpu`, `h100`, `h200`). Each
has two panels, the step time and the compile time, each as gradtx's time divided by optax's
on a log scale, with a row per workload and configuration: left of the 1.0 line gradtx is
faster. The charts are sized for the documentation's content column, about 700 px wide: their
text renders at 11 px or more there.

Input files are read in order and merged per device (`label`): a later file's row replaces an
earlier one with the same benchmark, workload and configuration, so fresh results given after
the snapshots update those rows and keep the others. A file is either a snapshot (below) or
a result file written by `benchmarks.run`, `benchmarks.whole_model` or
`benchmarks.compile_time`, which is converted on reading:

- `benchmarks.run`: one "optimizer step" row per workload and configuration (the donated
  jitted step, and the compile from cleared caches), and "training step" rows from its
  whole training steps when it ran them;
- `benchmarks.whole_model`: "training step" rows, each gradtx variant against optax's,
  and the model's gradient alone as a floor (`floors`, not drawn);
- `benchmarks.compile_time`: "compile" rows (trace, lower and compile of Adam's donated
  step), per leaf count, for gradtx per leaf and bucketed against optax.

Their device label is "CPU" on the CPU and the device's name elsewhere (`--label` sets it).
`--snapshot` writes the merged files of one device as a snapshot, with `--source` and any
`--note`s; result files do not record optax's version, so the installed one is written.

Snapshot schema (`benchmarks/snapshots/*.json`), one device per file::

    {
      "label": "CPU",                       # the device's name in the legend and tables
      "device": "CPU, 2 cores (x86_64)",    # what it is, in words
      "source": "...",                      # where the figures come from: run or transcription
      "jax": "0.10.2",                      # versions the figures were measured with;
      "optax": "0.2.8",                     #   null where the source does not give one
      "notes": ["..."],                     # optional: what a reader must know (rounds, ...)
      "rows": [                             # what the chart draws, in this order
        {
          "benchmark": "optimizer step",    # or "training step", or "compile"
          "workload": "transformer-like (12 blocks)",
          "config": "adam",                 # gradtx's variant; optax runs its own equivalent
          "gradtx_step_ms": 28.9,           # median step; null where not measured
          "optax_step_ms": 29.5,
          "gradtx_compile_s": 0.84,         # compile (trace, lower, XLA); null if not measured
          "optax_compile_s": 0.87,
          "gradtx_peak_mb": 702.4,          # optional: XLA's peak memory of the step
          "optax_peak_mb": 702.4
        }
      ],
      "floors": [                           # optional, not drawn: a step without optimizer
        {"benchmark": "training step", "workload": "GPT, 150 leaves",
         "what": "model gradient only", "step_ms": 6.39, "compile_s": 3.51, "peak_mb": 579.4}
      ]
    }

The SVG is deterministic (fixed hash salt, text kept as text, no date), so that a test can
check that the committed chart was drawn from the committed snapshots.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
from typing import Any

from benchmarks.results import write_json

SNAPSHOTS = "benchmarks/snapshots/*.json"
OUT_DIR = "docs/images"
BENCHMARKS = ("optimizer step", "training step", "compile")
HEADINGS = {
    "optimizer step": "Optimizer step alone",
    "training step": "Whole training step",
    "compile": "Compile of Adam's step alone",
}
KEYS = ("gradtx_step_ms", "optax_step_ms", "gradtx_compile_s", "optax_compile_s")


# --- reading -------------------------------------------------------------------------------------


def _device_label(platform: str, kind: str | None = None) -> str:
    return "CPU" if platform == "cpu" else (kind or platform.upper())


def _row(benchmark: str, workload: str, config: str, **figures: Any) -> dict:
    row = {"benchmark": benchmark, "workload": workload, "config": config}
    row.update({key: figures.get(key) for key in KEYS})
    row.update({k: v for k, v in figures.items() if k not in KEYS and v is not None})
    return row


def _from_run(data: dict) -> dict:
    rows = [
        _row(
            "optimizer step",
            r["workload"],
            r["config"],
            gradtx_step_ms=r["gradtx_donated_ms"],
            optax_step_ms=r["optax_donated_ms"],
            gradtx_compile_s=r["gradtx_compile_s"],
            optax_compile_s=r["optax_compile_s"],
        )
        for r in data["results"]
    ]
    floors = []
    training = {r["variant"]: r for r in data.get("training", [])}
    if "tree, optax" in training:
        base = training["tree, optax"]
        workload = f"MLP of {base['leaves'] // 2} blocks, {base['leaves']} leaves"
        for name, r in training.items():
            if name.startswith("model gradient only"):
                what = "model gradient only" + name[len("model gradient only") :]
                floors.append(_floor("training step", workload, what, r))
            elif name != "tree, optax":
                layout, _ = name.split(", ")
                config = "adam" if layout == "tree" else f"adam, {layout} params"
                rows.append(_versus("training step", workload, config, r, base))
    cpus = data.get("cpus")
    return {
        "label": _device_label(data.get("backend", "cpu")),
        "device": f"CPU, {cpus} cores ({data.get('machine')})"
        if data.get("backend", "cpu") == "cpu"
        else data["backend"].upper(),
        "jax": data.get("jax"),
        "rows": rows,
        "floors": floors,
    }


def _floor(benchmark: str, workload: str, what: str, r: dict) -> dict:
    floor = {"benchmark": benchmark, "workload": workload, "what": what}
    floor.update(step_ms=r["step_ms"], compile_s=r["compile_s"])
    if r.get("peak_mb") is not None:
        floor["peak_mb"] = r["peak_mb"]
    return floor


def _versus(benchmark: str, workload: str, config: str, r: dict, base: dict) -> dict:
    return _row(
        benchmark,
        workload,
        config,
        gradtx_step_ms=r["step_ms"],
        optax_step_ms=base["step_ms"],
        gradtx_compile_s=r["compile_s"],
        optax_compile_s=base["compile_s"],
        gradtx_peak_mb=r.get("peak_mb"),
        optax_peak_mb=base.get("peak_mb"),
    )


def _from_whole_model(data: dict) -> dict:
    rows, floors = [], []
    for name in ("gpt", "mlp"):
        if name not in data:
            continue
        result = data[name]
        workload = f"{name.upper()}, {result['leaves']} leaves"
        base, *others = result["rows"]
        for r in others:
            if r["variant"].startswith("gradtx "):
                config = r["variant"][len("gradtx ") :]
                rows.append(_versus("training step", workload, config, r, base))
            else:
                floors.append(_floor("training step", workload, r["variant"], r))
    return {
        "label": _device_label(data["platform"], data["device"]),
        "device": f"CPU, {data['cpus']} cores ({data['machine']})"
        if data["platform"] == "cpu"
        else data["device"],
        "jax": data.get("jax"),
        "rows": rows,
        "floors": floors,
    }


def _from_compile_time(data: dict) -> dict:
    totals = {(r["lib"], r["leaves"]): r["total_s"] for r in data["rows"]}
    configs = {"gradtx": "adam", "gradtx bucketed": "adam, bucketed state"}
    rows = []
    for leaves in sorted({n for _, n in totals}):
        for lib, config in configs.items():
            if (lib, leaves) in totals and ("optax", leaves) in totals:
                rows.append(
                    _row(
                        "compile",
                        f"{leaves} leaves of 2048 floats",
                        config,
                        gradtx_compile_s=totals[lib, leaves],
                        optax_compile_s=totals["optax", leaves],
                    )
                )
    device = data.get("device", "cpu")
    return {
        "label": _device_label("cpu" if device == "cpu" else "gpu", device),
        "device": "CPU" if device == "cpu" else device,
        "jax": data.get("jax"),
        "rows": rows,
    }


def to_snapshot(data: dict) -> dict:
    """One file's figures in the snapshot schema (see the module docstring)."""
    if "label" in data and "rows" in data:
        return data
    if "results" in data:
        return _from_run(data)
    if "gpt" in data or "mlp" in data:
        return _from_whole_model(data)
    if data.get("rows") and "lib" in data["rows"][0]:
        return _from_compile_time(data)
    raise ValueError(
        "not a snapshot nor a result file of benchmarks.run, benchmarks.whole_model or "
        f"benchmarks.compile_time: top-level keys {sorted(data)}"
    )


def _key(row: dict) -> tuple:
    return row["benchmark"], row["workload"], row.get("config", row.get("what"))


def load(paths: list[str], label: str | None = None) -> list[dict]:
    """Read `paths` in order and merge them per device; the devices in order of appearance.

    A later file's row replaces an earlier one of the same device with the same key
    (benchmark, workload, configuration). `label`, if given, names the device of every
    result file (snapshots keep their own).
    """
    devices: dict[str, dict] = {}
    for path in paths:
        with open(path) as f:
            raw = json.load(f)
        snap = to_snapshot(raw)
        if label and snap is not raw:
            snap = {**snap, "label": label}
        device = devices.setdefault(
            snap["label"],
            {"label": snap["label"], "device": snap.get("device"), "rows": {}, "floors": {}},
        )
        for field in ("source", "jax", "optax", "notes"):
            if snap.get(field) is not None:
                device[field] = snap[field]
        for row in snap["rows"]:
            device["rows"][_key(row)] = row
        for floor in snap.get("floors", []):
            device["floors"][_key(floor)] = floor
    return [
        {**d, "rows": list(d["rows"].values()), "floors": list(d["floors"].values())}
        for d in devices.values()
    ]


# --- the chart ----------------------------------------------------------------------------------


def _ratio(row: dict, what: str) -> float | None:
    g, o = row.get(f"gradtx_{what}"), row.get(f"optax_{what}")
    return None if g is None or o is None else g / o


def layout(devices: list[dict]) -> list[tuple[str, str, str | None]]:
    """The chart's lines, top to bottom: (kind, text, key) with kind benchmark, workload or
    row; rows in the order first seen, grouped by benchmark, then workload."""
    order: dict[str, dict[str, list[str]]] = {b: {} for b in BENCHMARKS}
    for device in devices:
        for row in device["rows"]:
            configs = order.setdefault(row["benchmark"], {}).setdefault(row["workload"], [])
            if row["config"] not in configs:
                configs.append(row["config"])
    lines: list[tuple[str, str, Any]] = []
    for benchmark, workloads in order.items():
        if not workloads:
            continue
        lines.append(("benchmark", HEADINGS.get(benchmark, benchmark), None))
        for workload, configs in workloads.items():
            lines.append(("workload", workload, None))
            lines.extend(("row", config, (benchmark, workload, config)) for config in configs)
    return lines


def _fmt_ratio(x: float) -> str:
    return f"{x:.2f}"


def slug(label: str) -> str:
    """The file-name part of a device's label: "NVIDIA H100" -> "h100", "CPU" -> "cpu"."""
    words = label.lower().replace("nvidia", " ").split()
    return "-".join("".join(c for c in w if c.isalnum()) for w in words) or "device"


def chart_path(out_dir: str, device: dict) -> str:
    """Where `draw` writes `device`'s chart: `<out_dir>/performance-<slug>.svg`."""
    return os.path.join(out_dir, f"performance-{slug(device['label'])}.svg")


# The chart is drawn in points (72 to the inch) and shown scaled to the page's width. The
# content column of the documentation is about 700 px wide, so a figure WIDTH_IN inches wide
# (WIDTH_IN * 72 units) is shown at 700 / (WIDTH_IN * 72) px per unit: at 9 inches, 1.08, and
# text of FONT units or more is at least 11 px high there.
WIDTH_IN = 9.0
FONT = 11
LINE_IN = 0.25  # the height of one line of the chart (a heading, a workload or a row)


def draw(devices: list[dict], out_dir: str) -> list[str]:
    """Draw one chart per device of `devices` (as returned by `load`) into `out_dir`; the
    paths written, in the devices' order."""
    return [draw_device(device, chart_path(out_dir, device)) for device in devices]


def draw_device(device: dict, out: str) -> str:
    """Draw `device`'s ratios into the SVG file `out`: a row per workload and configuration,
    the step time on the left, the compile time on the right, each as gradtx's time over
    optax's on a log scale, with a line at 1.0 (left of it, gradtx is faster)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    from matplotlib.transforms import blended_transform_factory

    lines = layout([device])
    rows = {_key(r): r for r in device["rows"]}
    ratios = [
        r
        for row in rows.values()
        for r in (_ratio(row, "step_ms"), _ratio(row, "compile_s"))
        if r is not None
    ]
    lo = min([0.5, *ratios]) / 1.9
    hi = max([1.5, *ratios]) * 1.9
    n = len(lines)
    style = {
        "svg.hashsalt": "gradtx-performance",
        "svg.fonttype": "none",
        "font.family": "DejaVu Sans",
        "font.size": FONT,
        "axes.edgecolor": "#888888",
        "axes.linewidth": 0.6,
    }
    with matplotlib.rc_context(style):
        fig = Figure(figsize=(WIDTH_IN, 1.9 + LINE_IN * n), layout="constrained")
        axes = fig.subplots(1, 2, sharey=True)
        for ax, what, title in zip(axes, ("step_ms", "compile_s"), ("Step time", "Compile time")):
            ax.set_xscale("log")
            ax.set_xlim(lo, hi)
            ax.set_ylim(n - 0.5, -0.5)
            ax.set_title(title, fontsize=FONT + 1, fontweight="bold")
            ax.set_xlabel(
                "gradtx time / optax time\n\u2190 gradtx faster \u00b7 optax faster \u2192",
                fontsize=FONT,
            )
            ax.xaxis.set_label_position("top")
            ax.tick_params(axis="x", top=True, labeltop=True, labelsize=FONT)
            ax.axvspan(lo, 1.0, color="#edf5ec", zorder=0, linewidth=0)
            ax.axvline(1.0, color="black", linewidth=1.0, zorder=3)
            ticks = [t for t in (0.125, 0.25, 0.5, 1, 2, 4) if lo <= t <= hi]
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
            ax.grid(axis="x", color="#cccccc", linewidth=0.5, zorder=1)
            ax.tick_params(axis="y", length=0)
            for y, (kind, text, key) in enumerate(lines):
                if kind == "benchmark":
                    ax.axhspan(y - 0.5, y + 0.5, color="#e4e4e4", zorder=2, linewidth=0)
                    if ax is axes[0]:
                        # The heading starts at the figure's left edge, over the row labels.
                        to = blended_transform_factory(fig.transFigure, ax.transData)
                        fig.text(
                            0.01,
                            y,
                            text,
                            transform=to,
                            va="center",
                            fontweight="bold",
                            fontsize=FONT + 1,
                        )
                if kind != "row":
                    continue
                r = _ratio(rows[key], what)
                if r is None:
                    ax.text(1.08, y, "not timed", va="center", fontsize=FONT, color="#777777")
                    continue
                ax.barh(y, abs(r - 1), left=min(r, 1.0), height=0.7, color="#3b6fb6", zorder=4)
                ax.text(
                    r * (0.96 if r < 1 else 1.04),
                    y,
                    _fmt_ratio(r),
                    ha="right" if r < 1 else "left",
                    va="center",
                    fontsize=FONT,
                    color="#222222",
                    zorder=5,
                )
        ax = axes[0]
        ax.set_yticks(range(n))
        ax.set_yticklabels(["" if kind == "benchmark" else text for kind, text, _ in lines])
        for label, (kind, _, _) in zip(ax.get_yticklabels(), lines):
            label.set_fontsize(FONT)
            if kind == "workload":
                label.set_fontweight("bold")
            else:
                label.set_color("#333333")
        fig.suptitle(_legend(device), fontsize=FONT + 1)
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        fig.savefig(out, format="svg", metadata={"Date": None})
    return out


def _legend(device: dict) -> str:
    versions = []
    if device.get("jax"):
        versions.append(f"JAX {device['jax']}")
    if device.get("optax"):
        versions.append(f"optax {device['optax']}")
    text = device.get("device") or device["label"]
    return f"{text}: {', '.join(versions)}" if versions else text


# --- the table ----------------------------------------------------------------------------------


def _num(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "ms":
        return f"{x:.1f}" if x >= 10 else f"{x:.2f}"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def markdown(devices: list[dict]) -> str:
    """The figures behind the chart as a Markdown table, in the chart's order."""
    lines = [
        "| device | workload | config | gradtx step ms | optax step ms | step ratio | "
        "gradtx compile s | optax compile s | compile ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    by_key = [{_key(r): r for r in d["rows"]} for d in devices]
    for kind, _, key in layout(devices):
        if kind != "row":
            continue
        for device, rows in zip(devices, by_key):
            row = rows.get(key)
            if row is None:
                continue
            step, comp = _ratio(row, "step_ms"), _ratio(row, "compile_s")
            cells = [
                device["label"],
                row["workload"],
                row["config"],
                _num(row["gradtx_step_ms"], "ms"),
                _num(row["optax_step_ms"], "ms"),
                "-" if step is None else _fmt_ratio(step),
                _num(row["gradtx_compile_s"], "s"),
                _num(row["optax_compile_s"], "s"),
                "-" if comp is None else _fmt_ratio(comp),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_table(devices: list[dict]) -> str:
    """gradtx's time over optax's per device, as a Markdown table: a row per workload and
    configuration (the workload named on its first row), in the chart's order, and a column
    per device whose cells read "step · compile"; "-" where a device did not measure it."""
    head = ["workload", "config"]
    head += [f"{d['label'].removeprefix('NVIDIA ')} step · compile" for d in devices]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_key = [{_key(r): r for r in d["rows"]} for d in devices]
    last = None
    for kind, _, key in layout(devices):
        if kind != "row":
            continue
        _, workload, config = key
        cells = [workload if workload != last else "", config]
        last = workload
        for rows in by_key:
            row = rows.get(key)
            if row is None:
                cells.append("-")
                continue
            pair = [_ratio(row, what) for what in ("step_ms", "compile_s")]
            cells.append(" · ".join("-" if r is None else _fmt_ratio(r) for r in pair))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- command line -------------------------------------------------------------------------------


def _check(devices: list[dict]) -> None:
    for device in devices:
        for row in device["rows"]:
            for key in KEYS:
                x = row.get(key)
                if x is not None and not (
                    isinstance(x, (int, float)) and math.isfinite(x) and x > 0
                ):
                    raise ValueError(f"{device['label']}: {_key(row)}: {key} = {x!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help=f"JSON files (default: {SNAPSHOTS})")
    parser.add_argument(
        "--out-dir", default=OUT_DIR, help=f"where to write the charts (default: {OUT_DIR})"
    )
    parser.add_argument("--label", default=None, help="the device label of result files")
    parser.add_argument("--markdown", action="store_true", help="print the figures as a table")
    parser.add_argument(
        "--ratios", action="store_true", help="print the ratios per device as a table"
    )
    parser.add_argument("--snapshot", default=None, help="write the files as one snapshot here")
    parser.add_argument("--source", default=None, help="the snapshot's source, in words")
    parser.add_argument("--note", action="append", default=None, help="a note (repeatable)")
    args = parser.parse_args(argv)
    paths = args.files or sorted(glob.glob(SNAPSHOTS))
    if not paths:
        parser.error(f"no JSON files given and none match {SNAPSHOTS}")
    devices = load(paths, args.label)
    _check(devices)
    if args.snapshot:
        if len(devices) != 1:
            labels = [d["label"] for d in devices]
            parser.error(f"--snapshot takes the files of one device, got {labels}")
        if not args.source:
            parser.error("--snapshot needs --source: where the figures come from, in words")
        (device,) = devices
        if device.get("optax") is None:  # result files do not record it: this environment's
            from importlib.metadata import version

            device["optax"] = version("optax")
        snapshot = {"label": device["label"], "device": device["device"], "source": args.source}
        snapshot.update({k: device.get(k) for k in ("jax", "optax")})
        notes = [*device.get("notes", []), *(args.note or [])]
        if notes:
            snapshot["notes"] = notes
        snapshot["rows"] = device["rows"]
        if device["floors"]:
            snapshot["floors"] = device["floors"]
        write_json(args.snapshot, snapshot)
        print(f"wrote {args.snapshot}")
        return 0
    if args.markdown:
        print(markdown(devices))
        return 0
    if args.ratios:
        print(ratio_table(devices))
        return 0
    for device, path in zip(devices, draw(devices, args.out_dir)):
        print(f"wrote {path} ({device['label']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
