"""The benchmark suite's smoke run: it must keep running, and its figures must be sane."""

import html
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
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


def test_layout_experiment_runs_and_layouts_agree(tmp_path):
    """The layout experiment quoted on the performance page keeps running, and its layouts
    compute the same Adam step (the bucketed one from a flat buffer and runtime offsets)."""
    args = ["--leaves", "8", "--reps", "2", "--static"]
    rows = _run_json("benchmarks.layouts", args, tmp_path / "layouts.json")
    assert [r["layout"] for r in rows] == [
        "per-leaf, shared count",
        "per-leaf, count per path",
        "per-leaf, count per path, corrections once",
        "bucketed",
        "bucketed, static offsets",
        "floor: params returned",
        "floor: p + g",
    ]
    for row in rows:
        if not row["layout"].startswith("floor"):
            assert row["max_abs_diff"] <= 1e-7, row["layout"]
        assert row["compile_s"] > 0 and row["step_ms"] > 0
    # Bucketed state: a flat buffer per moment, so far fewer outputs than leaves x 3.
    by_name = {r["layout"]: r for r in rows}
    assert by_name["bucketed"]["outputs"] < by_name["per-leaf, shared count"]["outputs"]


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


def test_spread_times_one_library_against_itself(monkeypatch):
    """The harness's spread: two copies of one step, timed as the suite times two libraries."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import spread, workloads

    got = spread.measure(workloads.many_leaves_packed(8), "sgd momentum", "gradtx", 1, 2)
    assert got["first_ms"] > 0 and got["second_ms"] > 0
    assert got["ratio"] == got["second_ms"] / got["first_ms"]


@pytest.mark.parametrize(
    ("module", "args", "said"),
    [
        ("run", ["--smoke", "--only", "nosuch"], "--only 'nosuch' selects nothing"),
        ("run", ["--smoke", "--only", "leaves", "--skip", "leaves"], "--skip 'leaves' selects"),
        ("run", ["--config", "adm"], "invalid choice: 'adm'"),
        ("combinators", ["--config", "accumulate(sdg)"], "invalid choice: 'accumulate(sdg)'"),
        ("host_overhead", ["--config", "lion "], "invalid choice: 'lion '"),
        ("program_size", ["--smoke", "--config", "Adam"], "invalid choice: 'Adam'"),
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


def test_spread_and_compile_probe_name_a_configuration_or_variant_they_do_not_know(
    monkeypatch, capsys
):
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import compile_probe, models, spread

    with pytest.raises(SystemExit):
        spread.main(["--config", "schedule-free AdamW"])  # the name is lower case
    assert "invalid choice: 'schedule-free AdamW'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no variant named 'optax adam'.*'optax adam, tree'"):
        compile_probe.probe(models.mlp(True), ["optax adam"])


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


def test_host_overhead_times_both_libraries_and_their_spread(monkeypatch):
    """The host-bound step: each library's time per step and the spread of its two copies; the
    clipped chain returns its three statistics besides optax's arrays, its lean form none."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import configs, host_overhead, workloads

    (config,) = [c for c in configs.configs() if c.name == "clip+adamw(cosine, mask)"]
    with jax.numpy_dtype_promotion("standard"):  # optax's schedule mixes Python floats in
        row = host_overhead.measure(config, workloads.many_leaves_packed(2), calls=3, rounds=2)
    assert row["gradtx_us"] > 0 and row["optax_us"] > 0
    assert all(0 < row[f"{lib}_spread"] < float("inf") for lib in ("gradtx", "optax"))
    # params, count, mu, nu, schedule count; gradtx adds global_norm, clipped, learning_rate
    assert (row["gradtx_arrays_out"], row["optax_arrays_out"]) == (8, 5)
    assert row["lean_arrays_out"] == 5 and row["lean_ratio"] == row["lean_us"] / row["optax_us"]
    # the floor of those three arrays: bare steps returning 5 and 8 arrays, timed alongside
    assert row["floor_arrays_out"] == [5, 8]
    floor = row["optax_us"] + row["arrays_floor_us"]
    assert row["arrays_floor_us"] >= 0 and row["floor_ratio"] == row["gradtx_us"] / floor
    print(host_overhead.format_row(row))


def test_the_bare_step_of_the_arrays_floor_returns_the_arrays_it_is_asked_for(monkeypatch):
    """A bare step writes its scalars into the state it was given, each from the gradient."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import host_overhead

    copy = host_overhead.Copy.bare(3, size=8)
    assert copy.arrays == 4
    params, state = copy.carry
    assert params.tolist() == [1.0] * 8 and [float(v) for v in state.values()] == [8, 9, 10]


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


def test_moments_experiment_runs_and_layouts_agree(tmp_path):
    """The two layouts of Adam's moments quoted on the performance page take the same steps
    (up to rounding: XLA may order a multiply-add differently), for float32 and bf16 params."""
    args = ["--size", "1000", "--layers", "2", "--width", "16", "--vocab", "32"]
    args += ["--reps", "2", "--rounds", "2"]
    rows = _run_json("benchmarks.moments", args, tmp_path / "moments.json")
    cases = ["one big leaf", "transformer-like", "transformer-like, bf16 params"]
    assert [r["case"] for r in rows] == cases
    for row in rows:
        assert row["max_abs_diff"] <= 1e-6, row["case"]
        assert row["two arrays ms"] > 0 and row["one (..., 2) array ms"] > 0


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


def test_kernel_count_smoke_run(tmp_path):
    """The kernel count keeps running, and counts the optimizer's kernels alone: the step
    carries its gradients to the next call donated, so no layout copies a leaf per step."""
    report = _run_json("benchmarks.kernels", ["--smoke"], tmp_path / "kernels.json")
    rows = {r["variant"]: r for r in report["rows"]}
    assert set(rows) == {
        "optax adam, tree",
        "gradtx adam, tree",
        "gradtx adam, bucketed state",
        "gradtx adam, packed params",
    }
    for name, row in rows.items():
        # At most one copy: XLA's CPU program copies gradtx's scalar step count.
        assert row["hlo_kernels_by_op"].get("copy", 0) <= 1, (name, row["hlo_kernels_by_op"])
        assert row["wall_ms"] > 0 and row["compile_s"] > 0, name
    tree, packed = rows["gradtx adam, tree"], rows["gradtx adam, packed params"]
    assert packed["hlo_kernels"] < tree["hlo_kernels"] / 3


def test_program_size_smoke_run(tmp_path):
    """The program counts keep running: both libraries' steps, compiled and never run, with
    the same arrays passed where both keep the same state (Adam: params, moments, a count)."""
    args = ["--smoke", "--config", "adam", "--config", "lion"]
    report = _run_json("benchmarks.program_size", args, tmp_path / "program_size.json")
    rows = {(r["workload"], r["config"]): r for r in report["rows"]}
    assert set(rows) == {
        ("transformer-like (1 blocks)", "adam"),
        ("transformer-like (1 blocks)", "lion"),
        ("20 small leaves, packed", "adam"),
        ("20 small leaves, packed", "lion"),
    }
    for key, row in rows.items():
        for lib in ("gradtx", "optax"):
            counts = row[lib]
            assert 0 <= counts["copies"] <= counts["kernels"], (key, lib, counts)
            # In: params, state and gradients; out: params and state.
            assert counts["arrays_out"] < counts["arrays_in"], (key, lib, counts)
        if key[1] == "adam":
            assert row["gradtx"]["arrays_in"] == row["optax"]["arrays_in"], key
            assert row["gradtx"]["arrays_out"] == row["optax"]["arrays_out"], key
    tree, packed = (
        rows[("transformer-like (1 blocks)", "adam")],
        rows[("20 small leaves, packed", "adam")],
    )
    assert packed["gradtx"]["kernels"] < tree["gradtx"]["kernels"] / 3


def test_compile_probe_smoke_run(tmp_path):
    report = _run_json("benchmarks.compile_probe", ["--smoke"], tmp_path / "probe.json")
    assert [r["variant"] for r in report["rows"]] == [
        "optax adam, tree",
        "tree gradient only",
        "packed gradient only",
        "gradtx adam, packed, runtime offsets",
        "gradtx adam, packed, static offsets",
    ]
    for row in report["rows"]:
        assert row["lower_s"] > 0 and row["compile_s"] > 0, row["variant"]


def test_compile_probe_compiles_abstract_arguments_for_the_device_it_is_given():
    # The path `--gpu-target` takes (abstract arguments placed on a compile-only device),
    # here with the CPU device, which every machine has.
    code = (
        "import json, jax\n"
        "from benchmarks import compile_probe, models\n"
        "rows = compile_probe.probe(models.mlp(True), ['packed gradient only'], jax.devices()[0])\n"
        "print(json.dumps(rows))\n"
    )
    proc = _run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout.splitlines()[-1])
    assert row["variant"] == "packed gradient only"
    assert row["lower_s"] > 0 and row["compile_s"] > 0


def test_compile_probe_for_a_gpu_target_compiles_for_it_or_says_what_it_needs(tmp_path):
    out = tmp_path / "probe.json"
    target = "benchmarks/gpu_targets/h100.txtpb"
    args = ["--smoke", "--only", "packed gradient only", "--gpu-target", target]
    proc = _run_python(
        ["-m", "benchmarks.compile_probe", *args, "--out", str(out)],
        JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1",
    )
    if proc.returncode == 0:  # jax's CUDA plugin is installed: compiled for the H100
        report = json.loads(out.read_text())
        assert report["device"] == "NVIDIA H100 80GB HBM3", report["device"]
        assert report["compiled_here_for"] == target
    else:
        assert "needs jax's CUDA plugin" in proc.stderr, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def drawn_chart(tmp_path_factory):
    """The performance page's chart, drawn by `python -m benchmarks.chart` from the committed
    snapshots into a fresh folder."""
    out = tmp_path_factory.mktemp("chart") / "performance.svg"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.chart", "--out", str(out)],
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


def test_chart_names_every_workload_of_the_snapshots(drawn_chart):
    snapshots = sorted((ROOT / "benchmarks" / "snapshots").glob("*.json"))
    assert {p.name for p in snapshots} >= {"cpu.json", "h200.json"}
    texts = set(_svg_texts(drawn_chart.read_text()))
    for path in snapshots:
        snapshot = json.loads(path.read_text())
        assert snapshot["source"] and snapshot["label"], path.name
        assert snapshot["rows"], path.name
        for row in snapshot["rows"]:
            assert row["workload"] in texts, (path.name, row["workload"])
            assert row["config"] in texts, (path.name, row["config"])
    assert "1" in texts  # the 1.0 line's tick: below it gradtx is faster


def test_committed_chart_is_drawn_from_the_committed_snapshots(drawn_chart):
    """`docs/images/performance.svg` is what `make chart` draws from the snapshots now. The
    SVG is deterministic, so with the matplotlib version that drew it the bytes must agree;
    another version may lay it out differently, and then its labels and figures must."""
    committed_path = ROOT / "docs" / "images" / "performance.svg"
    committed, fresh = committed_path.read_text(), drawn_chart.read_text()
    stale = "docs/images/performance.svg is stale: run `make chart` and commit it"
    if _matplotlib_version(committed) == _matplotlib_version(fresh):
        assert drawn_chart.read_bytes() == committed_path.read_bytes(), stale
    else:
        assert _svg_texts(fresh) == _svg_texts(committed), stale
