"""The demo (examples/train_mlp.py) runs, trains, keeps the optimizer state, and fails loudly."""

from __future__ import annotations

import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Slow (a subprocess, or a whole run): left out of `make quick` (see CONTRIBUTING.md).
pytestmark = pytest.mark.slow

DEMO = Path(__file__).resolve().parents[2] / "examples" / "train_mlp.py"
STEPS = 200


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUMPY_DTYPE_PROMOTION": "strict"}
    return subprocess.run(
        [sys.executable, str(DEMO), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def short_run() -> subprocess.CompletedProcess:
    return _run("--steps", str(STEPS))


def test_demo_succeeds(short_run):
    assert short_run.returncode == 0, short_run.stdout + short_run.stderr
    assert "FAILED" not in short_run.stdout


def test_demo_prints_progress(short_run):
    out = short_run.stdout
    # Not a terminal: plain periodic progress lines, ending at 100%.
    assert f"[100%] step {STEPS:>5}/{STEPS}" in out
    assert len(re.findall(r"^\[ *\d+%\] step", out, flags=re.MULTILINE)) >= 5
    assert "\r" not in out


def test_demo_loss_falls(short_run):
    rows = re.findall(
        r"^step +(\d+)  loss ([\d.]+)  lr ([\d.e+-]+)  grad norm \(pre-clip\) ([\d.]+)$",
        short_run.stdout,
        flags=re.MULTILINE,
    )
    assert len(rows) >= 4, short_run.stdout
    steps = [int(r[0]) for r in rows]
    losses = [float(r[1]) for r in rows]
    assert steps[0] == 1 and steps[-1] == STEPS
    assert losses[-1] < 0.25 * losses[0]
    assert all(float(r[3]) > 0 for r in rows)  # read from clip_by_global_norm/global_norm


def test_demo_reports_final_accuracy(short_run):
    match = re.search(r"^final accuracy: ([\d.]+)", short_run.stdout, flags=re.MULTILINE)
    assert match, short_run.stdout
    assert float(match.group(1)) >= 0.9


def test_demo_keeps_state_when_params_are_clipped(short_run):
    out = short_run.stdout
    assert "state kept: True" in out
    assert "reconcile report: all keys matched" in out
    for slot in ("mu", "nu"):
        line = re.search(
            rf"^adamw/{slot}/layers/0/kernel\[:3\] before: (.*)  after: (.*)$", out, re.M
        )
        assert line and line.group(1) == line.group(2), out
    assert re.search(rf"Adam step count of layers/0/kernel: {STEPS + 50}\)", out)


def test_demo_fails_when_training_fails():
    result = _run("--steps", "4", "--extra-steps", "0", "--min-accuracy", "1.01")
    assert result.returncode == 1
    assert "FAILED: final accuracy" in result.stdout


def test_progress_bar_on_a_terminal():
    spec = importlib.util.spec_from_file_location("train_mlp", DEMO)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    bar = demo.Progress(10, width=10, stream=stream)
    for done in range(1, 11):
        bar.update(done, loss=1.0 / done)
        if done == 5:
            bar.message("checkpoint")
    bar.close()
    text = stream.getvalue()
    assert text.count("\r[") == 10
    assert "\r[#####.....]     5/10 loss 0.2000" in text
    assert "[##########]    10/10 loss 0.1000" in text
    assert "\rcheckpoint\n" in text and text.endswith("\n")
