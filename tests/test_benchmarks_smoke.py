"""The benchmark suite's smoke run: it must keep running, and its figures must be sane."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_smoke_run(tmp_path):
    out = tmp_path / "smoke.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--smoke", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "streaming bandwidth" in proc.stdout
    report = json.loads(out.read_text())
    assert report["bandwidth_gb_s"] > 0
    configs = {r["config"] for r in report["results"]}
    assert {"adam", "sgd momentum"} <= configs
    for row in report["results"]:
        for lib in ("gradtx", "optax"):
            assert row[f"{lib}_donated_ms"] > 0
            assert row[f"{lib}_compile_s"] > 0
    variants = {r["variant"] for r in report["training"]}
    assert variants == {"tree, optax", "tree, gradtx", "packed, gradtx"}
    # The three variants train the same model from the same params: the same loss.
    losses = [r["loss"] for r in report["training"]]
    assert max(losses) - min(losses) <= 1e-5 * max(abs(x) for x in losses)
