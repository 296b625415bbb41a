"""The benchmark suite's smoke run: it must keep running, and its figures must be sane."""

import html
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from xla_settings import with_xla_defaults

# Slow (a subprocess, or a whole run): left out of `make quick` (see CONTRIBUTING.md).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _run_python(args: list[str], **env: str) -> subprocess.CompletedProcess:
    """Run `python *args` from the repository root on the CPU with XLA's default settings (as
    a user's benchmark), with `env` added."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**with_xla_defaults(dict(os.environ)), "JAX_PLATFORMS": "cpu", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _run_json(module: str, args: list[str], out: Path) -> list[dict]:
    """Run `python -m module *args --out out` from the repository root; the rows it wrote."""
    proc = _run_python(["-m", module, *args, "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_benchmark_smoke_run(tmp_path):
    out = tmp_path / "smoke.json"
    proc = _run_python(["-m", "benchmarks.run", "--smoke", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "streaming bandwidth" in proc.stdout
    report = json.loads(out.read_text())
    assert report["bandwidth_gb_s"] > 0
    configs = {r["config"] for r in report["results"]}
    assert {"adam", "sgd momentum", "per-group lr (partition)"} <= configs
    for row in report["results"]:
        for lib in ("gradtx", "optax"):
            assert row[f"{lib}_donated_ms"] > 0
            assert row[f"{lib}_compile_s"] > 0
    # The performance page's table is printed from such a file.
    table = subprocess.run(
        [sys.executable, "-m", "benchmarks.report", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert table.returncode == 0, table.stderr[-3000:]
    rows = [line for line in table.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(report["results"])
    variants = {r["variant"] for r in report["training"]}
    trained = {"tree, optax", "tree, gradtx", "packed, gradtx"}
    assert variants == trained | {"model gradient only, tree", "model gradient only, packed"}
    # The three optimizers train the same model from the same params: the same loss.
    losses = [r["loss"] for r in report["training"] if r["variant"] in trained]
    assert max(losses) - min(losses) <= 1e-5 * max(abs(x) for x in losses)


def test_partition_config_injects_the_same_hyperparameters_in_both_libraries(monkeypatch):
    """The per-group configuration compares like with like: each group's Adam keeps the same
    hyperparameters in its state in gradtx and in optax (b1 and b2 are static in both), so
    neither library's kernels read more runtime scalars than the other's."""
    import gradtx

    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import configs, workloads

    workload = workloads.many_leaves(4)
    (config,) = [c for c in configs.configs() if c.name == "per-group lr (partition)"]
    params = workload.params()
    ours = gradtx.hyperparams(config.gradtx(workload).init(params))
    theirs = config.optax(workload).init(params).inner_states
    injected = {"learning_rate", "eps", "eps_root"}
    for group in ("weights", "biases"):
        names = {k.split("/", 1)[1] for k in ours if k.startswith(group + "/")}
        assert names == set(theirs[group].inner_state.hyperparams) == injected


@pytest.mark.parametrize(
    ("module", "args", "said"),
    [
        ("run", ["--smoke", "--only", "nosuch"], "--only 'nosuch' selects nothing"),
        ("run", ["--smoke", "--only", "leaves", "--skip", "leaves"], "--skip 'leaves' selects"),
        ("run", ["--config", "adm"], "invalid choice: 'adm'"),
        ("combinators", ["--config", "accumulate(sdg)"], "invalid choice: 'accumulate(sdg)'"),
        ("lbfgs", ["--only", "huge"], "--only 'huge' selects nothing"),
    ],
)
def test_a_filter_that_selects_nothing_stops_and_names_what_it_was_given(
    module, args, said, tmp_path, monkeypatch, capsys
):
    """A misspelt name is a usage error (status 2), not a run of nothing over the last report."""
    monkeypatch.syspath_prepend(str(ROOT))
    main = importlib.import_module(f"benchmarks.{module}").main
    out = tmp_path / "report.json"
    with pytest.raises(SystemExit) as stopped:
        main([*args, "--out", str(out)])
    assert stopped.value.code == 2
    assert said in capsys.readouterr().err
    assert not out.exists()


def test_a_smoke_run_of_one_workload_runs_the_tiny_form_of_that_workload(monkeypatch, tmp_path):
    """`--smoke --only` picks among tiny forms of every workload of the full run, so that the
    accelerator script's parts can be smoke-run as they are written."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import run

    out = tmp_path / "report.json"
    args = ["--smoke", "--only", "one big leaf", "--config", "sgd momentum", "--no-training"]
    report = run.main([*args, "--out", str(out)])
    assert [(r["workload"], r["config"]) for r in report["results"]] == [
        ("one big leaf", "sgd momentum")
    ]
    assert json.loads(out.read_text())["results"] == report["results"]


def test_clipped_chain_bound_counts_the_second_gradient_read(monkeypatch):
    """The clipped chain's bound is its own: Adam's bytes plus one more read of the gradient
    (the global norm needs every gradient before any update is written), in float32 and with
    bf16 params and float32 state."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import configs

    by_name = {c.name: c for c in configs.configs()}
    adam = by_name["adam"].bytes_per_param
    for name in ("clip+adamw(cosine, mask)", "clip+adamw, bucketed state"):
        clipped = by_name[name].bytes_per_param
        assert clipped(4, 4) == adam(4, 4) + 4 == 32
        assert clipped(2, 4) == adam(2, 4) + 2 == 24


def test_combinators_benchmark_smoke_run(tmp_path):
    """The combinators' benchmark keeps running: every configuration, both libraries."""
    report = _run_json("benchmarks.combinators", ["--smoke"], tmp_path / "combinators.json")
    rows = report["results"]
    assert [r["config"] for r in rows] == [
        "accumulate(sgd)",
        "accumulate(sgd momentum)",
        "accumulate(adam)",
        "apply_if_finite(adam)",
        "apply_if_finite, grads",
        "masked(adam, kernels)",
    ]
    for row in rows:
        for lib in ("gradtx", "optax"):
            assert row[f"{lib}_donated_ms"] > 0 and row[f"{lib}_compile_s"] > 0, row["config"]


def test_lbfgs_benchmark_smoke_run(tmp_path):
    """The L-BFGS benchmark keeps running, both libraries taking the same steps."""
    report = _run_json("benchmarks.lbfgs", ["--smoke"], tmp_path / "lbfgs.json")
    (row,) = report["rows"]
    assert row["steps"] == 8 and np.isfinite(row["final_loss"])
    for lib in ("gradtx", "optax"):
        assert row[f"{lib}_step_ms"] > 0 and row[f"{lib}_compile_s"] > 0


def test_memory_benchmark_smoke_run(tmp_path):
    report = _run_json("benchmarks.memory", ["--smoke"], tmp_path / "memory.json")
    peaks = {(r["optimizer"], tuple(r["donate"])): r for r in report["peaks"]}
    for row in peaks.values():  # a step holds at least its arguments
        assert row["peak_mb"] >= row["held_mb"] > 0
    monitored = "monitor(global_norm) + adam"
    assert peaks[monitored, (0, 1, 2)]["peak_mb"] < peaks[monitored, ()]["peak_mb"]
    assert {r["mode"] for r in report["runs"]} == {"eager", "jit"}
    for run in report["runs"]:
        assert run["live_growth"] == 0.0, run["live_arrays"]  # no array outlives its step
        assert len(run["rss_mb"]) >= 5


def test_whole_model_smoke_run(tmp_path):
    """The whole-model benchmark keeps running, and its variants train alike: from the same
    params on the same batch, every optimizer variant reaches the same loss."""
    report = _run_json("benchmarks.whole_model", ["--smoke"], tmp_path / "whole.json")
    assert report["device"] and report["platform"] == "cpu"
    for name, optimizer in (("gpt", "adamw"), ("mlp", "adam")):
        result = report[name]
        assert result["leaves"] > 0 and result["params"] > 0
        rows = {r["variant"]: r for r in result["rows"]}
        trained = [
            f"optax {optimizer}",
            f"gradtx {optimizer}",
            f"gradtx {optimizer}, bucketed state",
            f"gradtx {optimizer}, packed params",
        ]
        assert list(rows) == [*trained, "model gradient only"]
        for row in rows.values():
            assert row["compile_s"] > 0 and row["step_ms"] > 0, row["variant"]
            assert row["peak_mb"] is None or row["peak_mb"] > 0, row["variant"]
        # The gradient-only variant never moves the params: its loss is the initial one.
        initial = rows["model gradient only"]["loss"]
        losses = [rows[v]["loss"] for v in trained]
        assert max(losses) < 0.9 * initial, name  # the smoke run's steps do train
        # Float rounding alone (optax rounds Adam's bias correction differently; packed and
        # tree vectorise differently) stays near 3e-6 here. Dropping the weight decay, or
        # eps 100x off, moves the GPT's loss by 2e-4 and 7e-5 in the smoke run's 12 steps.
        assert max(losses) - min(losses) <= 2e-5 * max(losses), (name, losses)


CHARTS = ("performance-cpu.svg", "performance-h100.svg", "performance-h200.svg")
# The content column of the documentation is about 700 px wide; the charts are shown scaled
# to it (they are wider), so a font of f units in a viewBox w units wide is f * 700 / w px.
PAGE_WIDTH_PX = 700


@pytest.fixture(scope="module")
def drawn_chart(tmp_path_factory):
    """The performance page's charts, one per device, drawn by `python -m benchmarks.chart`
    from the committed snapshots into a fresh folder; that folder."""
    out = tmp_path_factory.mktemp("chart")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.chart", "--out-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _svg_texts(svg: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r"<text\b[^>]*>([^<]*)</text>", svg)]


def _matplotlib_version(svg: str) -> str | None:
    found = re.search(r"Matplotlib v([^,<\s]+)", svg)
    return found and found.group(1)


def _snapshots() -> list[dict]:
    paths = sorted((ROOT / "benchmarks" / "snapshots").glob("*.json"))
    assert {p.name for p in paths} >= {"cpu.json", "h100.json", "h200.json"}
    return [json.loads(p.read_text()) for p in paths]


def test_chart_names_every_workload_of_the_snapshots(drawn_chart, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks.chart import slug

    assert sorted(p.name for p in drawn_chart.iterdir()) == sorted(CHARTS)
    for snapshot in _snapshots():
        assert snapshot["source"] and snapshot["label"] and snapshot["rows"], snapshot
        svg = (drawn_chart / f"performance-{slug(snapshot['label'])}.svg").read_text()
        texts = set(_svg_texts(svg))
        for row in snapshot["rows"]:
            assert row["workload"] in texts, (snapshot["label"], row["workload"])
            assert row["config"] in texts, (snapshot["label"], row["config"])
        assert "1" in texts  # the 1.0 line's tick: left of it gradtx is faster
        assert any("lower is faster" in t or "gradtx faster" in t for t in texts)


def test_chart_text_is_at_least_11_px_at_page_width(drawn_chart):
    for name in CHARTS:
        svg = (drawn_chart / name).read_text()
        width = float(re.search(r'viewBox="0 0 ([0-9.]+) [0-9.]+"', svg).group(1))
        sizes = [float(x) for x in re.findall(r"font-size: ?([0-9.]+)px", svg)]
        assert sizes, name
        assert min(sizes) * PAGE_WIDTH_PX / width >= 11, (name, min(sizes), width)


def test_chart_ratio_table_on_the_page_is_current():
    """The performance page's table is what `python -m benchmarks.chart --ratios` prints."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.chart", "--ratios"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (ROOT / "docs" / "performance.md").read_text()
    assert proc.stdout.strip() in page, "run `python -m benchmarks.chart --ratios` for the page"


def test_committed_chart_is_drawn_from_the_committed_snapshots(drawn_chart):
    """`docs/images/performance-*.svg` are what `make chart` draws from the snapshots now.
    The SVG is deterministic, so with the matplotlib version that drew it the bytes must
    agree; another version may lay it out differently, and then its labels and figures must."""
    for name in CHARTS:
        committed_path = ROOT / "docs" / "images" / name
        fresh_path = drawn_chart / name
        committed, fresh = committed_path.read_text(), fresh_path.read_text()
        stale = f"docs/images/{name} is stale: run `make chart` and commit it"
        if _matplotlib_version(committed) == _matplotlib_version(fresh):
            assert fresh_path.read_bytes() == committed_path.read_bytes(), stale
        else:
            assert _svg_texts(fresh) == _svg_texts(committed), stale
